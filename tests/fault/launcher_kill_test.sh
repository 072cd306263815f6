#!/usr/bin/env bash
# A real (CPU backend) search of a tiny model on 4 ranks under launcher/autopar-mpirun; rank 2 is
# SIGKILLed once in the middle of its 4th trial (test hook). The supervisor relaunches with
# --resume, the interrupted trial is retried and the search finishes; `report` shows every trial
# exactly once.
# usage: launcher_kill_test.sh AUTOPAR_TUNE WORK_DIR
set -euo pipefail
bin=$1
work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work"
mkdir -p "$work"
study=$work/study
trials=6
# The kill ends the job at once (mpirun), not a deadline: --trial-timeout only has to stay clear of
# the trials, 1 to 2 s each under ASan, and far more with other busy processes on two cores (the
# ranks poll while they wait).
AUTOPAR_TEST_KILL_RANK=2 AUTOPAR_TEST_KILL_AFTER_TRIALS=3 \
  "$root/launcher/autopar-mpirun" -np 4 --max-restarts 2 --autopar-tune "$bin" -- \
  --nnodes 2 --nproc-per-node 2 --model tiny --global-batch-size 16 --backend cpu \
  --study "$study" --max-trials $trials --trial-timeout 600 --status-port -1 --quiet \
  > "$work/out.txt" 2> "$work/err.txt" || { cat "$work/err.txt"; exit 1; }
attempts=$(ls "$study/launcher-logs" | wc -l)
[[ $attempts -eq 2 ]] || { echo "FAIL: expected 2 attempts, got $attempts"; exit 1; }
grep -q "dies in trial 3" "$study/launcher-logs/attempt-1.log" ||
  { echo "FAIL: the kill hook did not fire"; exit 1; }
"$bin" report --study "$study" --format csv > "$work/report.csv"
rows=$(tail -n +2 "$work/report.csv" | wc -l)
unique=$(tail -n +2 "$work/report.csv" | cut -d, -f1 | sort -u | wc -l)
[[ $rows -eq $trials && $unique -eq $trials ]] ||
  { echo "FAIL: report shows $rows rows, $unique distinct trials"; cat "$work/report.csv"; exit 1; }
grep -q '^4,.*,ok,2,' "$work/report.csv" ||
  { echo "FAIL: trial 4 was not retried to success"; cat "$work/report.csv"; exit 1; }
"$bin" report --study "$study"
echo "1 passed, 0 failed"
