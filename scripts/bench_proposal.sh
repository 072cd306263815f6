#!/usr/bin/env bash
# Coordinator overhead: the wall time of one proposal (a Thompson draw and X·θ over every
# candidate, then the eligible argmin) on a space of over 100,000 candidates: gpt3-175b on 128 x 8
# A100-80GB with the number of recomputed layers swept and tensor parallelism across nodes
# (104,852 candidates). Runs 50 trials of a replay-backend study and prints the median and the
# maximum proposal time from its result.json, with the stop rules' check for comparison.
# Target: under 50 ms per proposal.
set -euo pipefail
source "$(dirname "$0")/autopar_bin.sh"
base=/tmp
if [[ -d /dev/shm ]]; then base=/dev/shm; fi
work=$(mktemp -d "$base/autopar-bench-proposal.XXXXXX")
trap 'rm -rf "$work"' EXIT
model=(--model gpt3-175b --gpu a100-80gb --nnodes 128 --nproc-per-node 8
       --global-batch-size 1536 --seq-length 2048)
"$bin" make-replay-table "${model[@]}" --sweep-recompute-layers --tp-across-nodes \
  --output "$work/space.csv" 2>/dev/null
"$bin" tune --backend replay --replay-table "$work/space.csv" "${model[@]}" --study "$work/study" \
  --max-trials 50 --quiet --format json >"$work/result.json"
python3 - "$work/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r["timing"]
print(f"candidates {r['candidates']:,}, trials {r['trials']}")
print(f"one proposal: median {t['proposal_ms_median']:.2f} ms, max {t['proposal_ms_max']:.2f} ms "
      f"(target < 50 ms): {'PASS' if t['proposal_ms_max'] < 50 else 'FAIL'}")
print(f"stop-rule check (200 posterior draws over the eligible candidates): median "
      f"{t['stop_check_ms_median']:.1f} ms")
sys.exit(0 if t["proposal_ms_max"] < 50 else 1)
PY
