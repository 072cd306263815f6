#!/usr/bin/env bash
# The online tuner with real trials against an exhaustive measurement of the same space: `tiny`
# on 4 local ranks (2 "nodes" × 2), CPU backend.
#   1. The exhaustive table: every configuration measured (tests/data/replay/cpu_tiny_4ranks.csv,
#      or a fresh one with --remeasure).
#   2. The online search: mpirun -np 4 autopar-tune ... --backend cpu (Thompson sampling, default
#      stop rules, capped at 60 trials).
#   3. Its recommendation and the table's best, re-measured head to head (`trial` timed for at
#      least 1 s, alternating, 7 rounds, median), since one measurement on a shared 2-core
#      machine is noisy.
# Prints trials used, and the recommended configuration's time relative to the best.
set -euo pipefail
source "$(dirname "$0")/autopar_bin.sh"
work=${AUTOPAR_WORK:-$(mktemp -d)}
mkdir -p "$work"
flags=(--nnodes 2 --nproc-per-node 2 --model tiny --global-batch-size 16)
mpi=(mpirun -np 4 --oversubscribe -x OMP_NUM_THREADS=1)
if [[ $(id -u) -eq 0 ]]; then mpi+=(--allow-run-as-root); fi
table=$root/tests/data/replay/cpu_tiny_4ranks.csv
if [[ ${1:-} == --remeasure ]]; then
  "${mpi[@]}" "$bin" "${flags[@]}" --backend cpu --study "$work/exhaustive" --searcher grid \
    --status-port -1 --quiet >/dev/null
  table=$work/exhaustive/trials.csv
fi
"${mpi[@]}" "$bin" "${flags[@]}" --backend cpu --study "$work/online" --max-trials 60 \
  --status-port -1 --quiet >/dev/null
python3 - "$bin" "$table" "$work/online" "${mpi[*]}" "${flags[*]}" <<'PY'
import csv, json, statistics, subprocess, sys
binary, table, online, mpi, flags = sys.argv[1:6]
def spec(r):
    return (f"tp={r['tp']},pp={r['pp']},dp={r['dp']},cp={r['cp']},up={r['up']},ep={r['ep']},"
            f"vpp={r['vpp']},mbs={r['mbs']},sp={r['sp']},recompute={r['recompute']},"
            f"dist_opt={r['dist_opt']}")
rows = [r for r in csv.DictReader(open(table)) if r["status"] == "ok"]
best = min(rows, key=lambda r: float(r["step_time_s"]))
result = json.load(open(f"{online}/result.json"))
chosen = result["best"]["config"]
trials = result["trials"]
def measure(config):
    out = subprocess.run(mpi.split() + [binary, "trial", *flags.split(), "--config", config,
                         "--warmup", "2", "--iters", "5", "--min-timed-seconds", "1",
                         "--format", "json"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["step_time_s"]
rounds = 7
a, b = [], []
for _ in range(rounds):
    a.append(measure(chosen))
    b.append(measure(spec(best)))
ta, tb = statistics.median(a), statistics.median(b)
print(f"exhaustive table: {len(rows)} configurations, best {spec(best)} "
      f"{float(best['step_time_s']):.4f} s")
print(f"online search: {trials} trials, stop {result['stop_reason']}, recommends {chosen}")
print(f"head to head (median of {rounds}, each a trial timed for >= 1 s): "
      f"recommended {ta:.4f} s, table best {tb:.4f} s, "
      f"ratio {ta / tb:.3f} ({100 * (ta / tb - 1):+.1f}%)")
PY
