#!/usr/bin/env bash
# The analytic model against published training measurements (../shared/calibration): every row
# of published.csv (Megatron-LM 2020-2022) and published_2024.csv (Megatron-core/NeMo 2024-2026)
# that the model can express, predicted with `autopar-tune predict` and compared in the source's
# own metric (docs/models.md §5.1).
#   bench_accuracy.sh [CSV ...]   these calibration files instead (the same columns)
#   bench_accuracy.sh --help      this text
# Per row: id, source, model, config (--config SPEC), metric, measured, predicted, error. Per file:
# rows predicted, MAPE, median and max APE, the rows the model puts over the GPU's memory (the
# source ran them), and each row skipped with the reason (a configuration the source does not
# give, or one the model cannot express). Then per source, all rows, and each
# era: rows, skipped, MAPE, median, max, bias (signed mean error, + = the model predicts a faster
# step), Kendall's tau-b inside groups of >= 2 rows sharing model, cluster, sequence length and
# metric (the number of groups in brackets), and the source's FLOP count over the tool's.
# The software stack, the defaults for what a source leaves unstated and the FLOP convention of
# its TFLOP/s are stated once per source (SOURCES in scripts/bench_accuracy.py), never per row.
# Exit status 0 (a report, not a gate); 1 when the binary fails (exit other than 0, 2 or 3); 2
# when a calibration file cannot be read.
# AUTOPAR_BIN: the binary to measure (without it the project is set up and built: autopar_bin.sh).
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p;}' "$0"
  exit 0
fi
source "$(dirname "$0")/autopar_bin.sh"
AUTOPAR_BIN=$bin exec python3 "$root/scripts/bench_accuracy.py" "$@"
