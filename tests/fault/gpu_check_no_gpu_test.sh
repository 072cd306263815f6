#!/usr/bin/env bash
# scripts/gpu_check.sh where no GPU is visible (CUDA_VISIBLE_DEVICES set and empty hides any the
# machine has): it prints "skipped: no GPU", exits 0, builds nothing, and its gpu_check.json says
# skipped and claims no check.
# usage: gpu_check_no_gpu_test.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
src=$1
build=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
json=$work/gpu_check.json
echo '{"verdict": "PASS", "stale": true}' >"$json"  # a previous run's file must not survive
stamps() { stat -c '%n %Y' "$build/CMakeCache.txt" "$build/autopar-tune"; }
before=$(stamps)

set +e
out=$(CUDA_VISIBLE_DEVICES='' AUTOPAR_GPU_CHECK_JSON=$json "$src/scripts/gpu_check.sh" "$build" 2>&1)
rc=$?
set -e
echo "$out"
fail() { echo "FAIL: $*"; exit 1; }
((rc == 0)) || fail "exit status $rc"
grep -qx 'gpu_check: skipped: no GPU' <<<"$out" || fail "no 'skipped: no GPU' line"
(($(wc -l <<<"$out") == 1)) || fail "printed more than the skip line"
python3 - "$json" <<'PY' || fail "gpu_check.json is not the skip record"
import json, sys
r = json.load(open(sys.argv[1]))
assert r == {"verdict": "skipped", "reason": "no GPU", "checks": []}, r
PY
[[ $(stamps) == "$before" ]] || fail "it configured or built $build"
[[ ! -e $build/gpu_check.json ]] || fail "it wrote $build/gpu_check.json, not AUTOPAR_GPU_CHECK_JSON"
echo "ok"
