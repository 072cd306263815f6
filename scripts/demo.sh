#!/usr/bin/env bash
# Fresh machine → installed, built, and the main job run on an embedded default.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" >/dev/null
bin=${AUTOPAR_BUILD_DIR:-$root/build}/autopar-tune
set -x
"$bin" plan --model llama2-7b --gpu a100-80gb --nnodes 4 --nproc-per-node 8 \
  --global-batch-size 512 --seq-length 4096 --top 5
"$bin" predict --model llama2-7b --gpu a100-80gb --nnodes 4 --nproc-per-node 8 \
  --global-batch-size 512 --seq-length 4096 --config tp=2,pp=1,mbs=2,sp=on,dist_opt=on
