#!/usr/bin/env bash
# Fresh machine → installed, built, and the main job run on an embedded default: the online search
# (Thompson sampling over the Bayesian cost model, real trials on the CPU backend) for a tiny
# model on 4 local MPI ranks laid out as 2 "nodes" × 2, then its report.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" >/dev/null
bin=${AUTOPAR_BUILD_DIR:-$root/build}/autopar-tune
study=${AUTOPAR_DEMO_STUDY:-$root/runs/demo-$(date +%Y%m%d-%H%M%S)}
mpirun_flags=(--oversubscribe -x OMP_NUM_THREADS=1)
if [[ $(id -u) -eq 0 ]]; then mpirun_flags+=(--allow-run-as-root); fi
set -x
mpirun -np 4 "${mpirun_flags[@]}" "$bin" --nnodes 2 --nproc-per-node 2 --model tiny \
  --global-batch-size 16 --backend cpu --study "$study" --max-trials 30 --trial-timeout 120
"$bin" report --study "$study" --top 3
cat "$study/best.args"
