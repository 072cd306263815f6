#!/usr/bin/env bash
# Search quality on replay tables: Thompson sampling against random, grid and analytic-only, 20
# seeds each (scripts/bench_search.py says what each column means). Tables (a) are generated with
# `autopar-tune make-replay-table`; table (b), tests/data/replay/cpu_tiny_4ranks.csv, is an
# exhaustive CPU measurement made with the trial runner, used when present and skipped otherwise.
# Extra arguments go to the helper (--seeds N, --only NAME, --cpu-table FILE, --jobs N).
# Exit status 1 when Thompson misses its target on a table (see scripts/bench_search.py).
set -euo pipefail
source "$(dirname "$0")/autopar_bin.sh"
exec python3 "$root/scripts/bench_search.py" --bin "$bin" \
  --cpu-table "$root/tests/data/replay/cpu_tiny_4ranks.csv" "$@"
