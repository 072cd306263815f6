#!/usr/bin/env bash
# `autopar-tune trial` under mpirun on 4 ranks: a tiny model finishes; a trial whose rank 1
# stalls (test hook) ends as `timeout` on every rank, by its --trial-timeout rather than the 600 s
# default; a configuration that does not fit the budget is `oom`.
#
# The wall-clock bounds below catch a hang (or a deadline not applied), not a slow machine: they
# include starting and stopping 4 MPI ranks. Under ASan with six other busy processes on two
# cores the stalled run took 10.4 s with its 4 s deadline, and the tiny trial 16 s (1 s idle).
# usage: trial_cli.sh MPIEXEC AUTOPAR_TUNE [MPIEXEC FLAGS...]
set -euo pipefail
mpiexec=$1
bin=$2
shift 2
run() { "$mpiexec" -np 4 "$@" ; }
common=(--model tiny --nnodes 2 --nproc-per-node 2 --global-batch-size 16)

start=$(date +%s%N)
out=$(run "$@" "$bin" trial "${common[@]}" --config tp=2,pp=2,sp=on --format json)
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
echo "ok trial: $out (${elapsed_ms} ms)"
grep -q '"status":"ok"' <<<"$out"
((elapsed_ms < 60000)) || { echo "FAIL: a tiny trial took ${elapsed_ms} ms"; exit 1; }

deadline=4
start=$(date +%s%N)
set +e
out=$(AUTOPAR_TEST_STALL_RANK=1 run "$@" -x AUTOPAR_TEST_STALL_RANK "$bin" trial "${common[@]}" \
      --config tp=2,pp=2 --trial-timeout $deadline --format json 2>/dev/null)
rc=$?
set -e
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
echo "stalled trial: rc=$rc $out (${elapsed_ms} ms)"
[[ $rc -ne 0 ]] || { echo "FAIL: a timed-out trial exited 0"; exit 1; }
grep -q '"status":"timeout"' <<<"$out" || { echo "FAIL: no timeout outcome"; exit 1; }
# The deadline, the 3 s the ranks get to agree afterwards (kAgreementGraceS), and 60 s to start
# and stop 4 MPI ranks however loaded the machine: bounded, not hung, and far below the default
# deadline of 600 s.
((elapsed_ms < (deadline + 3 + 60) * 1000)) || { echo "FAIL: took ${elapsed_ms} ms"; exit 1; }

set +e
out=$(run "$@" "$bin" trial "${common[@]}" --config dp=4 --device-memory-gib 0.002 --format json \
      2>/dev/null)
set -e
echo "over budget: $out"
grep -q '"status":"oom"' <<<"$out" || { echo "FAIL: no oom outcome"; exit 1; }
echo "1 passed, 0 failed"
