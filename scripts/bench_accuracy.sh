#!/usr/bin/env bash
# The analytic model against published Megatron-LM measurements (shared/calibration).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" >/dev/null
exec python3 "$root/scripts/bench_accuracy.py"
