#!/usr/bin/env bash
# Fresh machine → installed, built, tested. The command CI runs (.ci/run) and the README gives.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
export OMP_NUM_THREADS=1
cd "${AUTOPAR_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j"$(nproc)" --timeout 900
