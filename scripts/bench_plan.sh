#!/usr/bin/env bash
# Planner speed: `plan` over the whole space of gpt3-175b on 128 x 8 A100-80GB (global batch 1536,
# seq 2048: TP incl. across nodes, PP, DP, CP, mbs up to the batch, VPP, SP, recompute incl. the
# number of recomputed layers, distributed optimizer), and a 1,048,576-GPU plan. Prints the median
# wall time of 5 runs of the whole process, and the planner's own ranking time.
set -euo pipefail
source "$(dirname "$0")/autopar_bin.sh"

python3 - "$bin" <<'PY'
import statistics, subprocess, sys, time, json
bin = sys.argv[1]
cases = [
    ("gpt3-175b, 128 x 8 a100-80gb, whole space",
     ["--model", "gpt3-175b", "--gpu", "a100-80gb", "--nnodes", "128", "--nproc-per-node", "8",
      "--global-batch-size", "1536", "--seq-length", "2048", "--sweep-recompute-layers",
      "--max-mbs", "1536", "--tp-across-nodes", "--cp", "1,2,4,8"]),
    ("gpt3-175b, 128 x 8 a100-80gb, default space",
     ["--model", "gpt3-175b", "--gpu", "a100-80gb", "--nnodes", "128", "--nproc-per-node", "8",
      "--global-batch-size", "1536", "--seq-length", "2048"]),
    ("llama3-70b, 131072 x 8 h100 (1,048,576 GPUs), seq 16384",
     ["--model", "llama3-70b", "--gpu", "h100", "--nnodes", "131072", "--nproc-per-node", "8",
      "--global-batch-size", "65536", "--seq-length", "16384", "--sweep-recompute-layers"]),
]
print(f"{'case':58} {'candidates':>10} {'fit':>9} {'rank_ms':>8} {'wall_ms (median of 5)':>22}")
for name, args in cases:
    walls, ranks = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        out = subprocess.run([bin, "plan", "--format", "json", "--top", "5"] + args,
                             capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        if out.returncode != 0:
            sys.exit(f"{name}: exit {out.returncode}: {out.stderr}")
        result = json.loads(out.stdout)
        ranks.append(result["elapsed_s"])
    best = result["configs"][0]
    print(f"{name:58} {result['candidates']:>10} {result['feasible']:>9} "
          f"{1e3 * statistics.median(ranks):8.1f} {1e3 * statistics.median(walls):22.1f}")
    print(f"{'':58} best: {best['config']}  {best['step_time_s']:.3f} s/step, "
          f"MFU {100 * best['mfu']:.1f}%")
PY
