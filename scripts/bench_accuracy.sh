#!/usr/bin/env bash
# The analytic model against published Megatron-LM measurements (shared/calibration).
set -euo pipefail
source "$(dirname "$0")/autopar_bin.sh"
AUTOPAR_BIN=$bin exec python3 "$root/scripts/bench_accuracy.py"
