#!/usr/bin/env bash
# Search quality on replay tables: Thompson sampling against random and analytic-only, 20 seeds each
# (scripts/bench_search.py says what each column means; docs/search.md §11).
#   default             the worlds suite on held-out worlds: 4 models x 6 families of
#                       `make-replay-table --world` x truth seeds 101-103 (+10 per model), against
#                       issue 13's targets (median to 2% <= 15, p90 <= 40, regret at stop median 0%
#                       and max <= 2%, OOM trials <= 20%) and the stop rule's calibration
#   --world-seeds tune  the same on the tuning worlds (seeds 1-3; tune-extra: 4-6): tune the
#                       search on these only
#   --suite today       the tables of before: (a) the scaled truth of `make-replay-table`, (b)
#                       tests/data/replay/cpu_tiny_4ranks.csv, an exhaustive CPU measurement made
#                       with the trial runner (used when present, skipped otherwise), with grid too
# Other arguments go to the helper: --seeds N, --jobs N, --only TERM[,TERM] (model, family or
# seed), --searchers LIST, --max-trials N (worlds: 300), --cpu-table FILE, --dump FILE (one JSON
# line per run).
# A full held-out suite is 72 tables and 2,952 studies: about 100 minutes with --jobs 2 on 2 cores
# (session 27: Thompson's 1,440 runs 66 minutes, many at the 300-trial cap; random and
# analytic-only 37); --only and --seeds make a quicker look.
# Exit status 1 when a target is missed (see scripts/bench_search.py).
set -euo pipefail
source "$(dirname "$0")/autopar_bin.sh"
exec python3 "$root/scripts/bench_search.py" --bin "$bin" \
  --cpu-table "$root/tests/data/replay/cpu_tiny_4ranks.csv" "$@"
