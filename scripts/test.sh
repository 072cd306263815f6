#!/usr/bin/env bash
# Fresh machine → installed, built, tested. The command CI runs (.ci/run) and the README gives.
#
# Tests are selected by label (tests/CMakeLists.txt): unit, distributed, fault and gpu, i.e. all of
# them. The gpu-labelled ones skip without a GPU, so CI, which has none, runs and passes them and
# a GPU machine runs them for real (scripts/gpu_check.sh runs them alone, with the benchmarks).
# A test with none of the four labels fails this script rather than go unselected.
#
# Then the stages of docs/testing.md: the clang-format check of changed lines
# (scripts/format_check.sh) and the module graph (scripts/check_layering.py), first, as they take
# a second, and after the tests the sanitizer builds (scripts/sanitize.sh: ASan+UBSan with the
# fuzz targets, ThreadSanitizer with the trials off). The sanitizer stages run when AUTOPAR_SANITIZE_STAGES=1: they add about 40 minutes on 2
# cores and have not yet had a verified end-to-end run on a clean clone within CI's limit, so CI
# (.ci/run) does not set it yet (docs/testing.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/format_check.sh"
python3 "$root/scripts/check_layering.py"
"$root/scripts/build.sh"
export OMP_NUM_THREADS=1
cd "${AUTOPAR_BUILD_DIR:-$root/build}"
labels='^(unit|distributed|fault|gpu)$'
if ctest -N -LE "$labels" | grep -q 'Test *#'; then
  ctest -N -LE "$labels"
  echo "test.sh: the tests above have none of the labels unit, distributed, fault, gpu"
  exit 1
fi
ctest -L "$labels" --output-on-failure -j"$(nproc)" --timeout 900
if [[ ${AUTOPAR_SANITIZE_STAGES:-0} == 1 ]]; then
  "$root/scripts/sanitize.sh"
fi
