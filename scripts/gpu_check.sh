#!/usr/bin/env bash
# The CUDA backend on a GPU machine: the CUDA op tests (every kernel against its host reference),
# the distributed trial tests (the CUDA equivalence cases need one GPU per rank and skip
# otherwise), then a trial of a llama-7B-shaped model on one GPU, printing achieved TFLOP/s and
# MFU. Skips cleanly (exit 0) where there is no GPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${AUTOPAR_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh"
"$root/scripts/build.sh" >/dev/null

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no GPU on this machine; skipped"
  exit 0
fi
nvidia-smi -L
gpus=$(nvidia-smi -L | wc -l)
[[ -x $build/tests/cuda_backend_test ]] || { echo "gpu_check: the build has no CUDA backend"; exit 1; }

echo "== CUDA op tests"
"$build/tests/cuda_backend_test" --gtest_brief=1
if [[ -x $build/tests/cuda_collectives_test ]]; then "$build/tests/cuda_collectives_test" --gtest_brief=1; fi

mpi=(mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1)
if ((gpus >= 4)); then
  echo "== trial equivalence on the CUDA backend, 4 ranks"
  "${mpi[@]}" -np 4 "$build/tests/distributed/distributed_test" --gtest_filter='*CudaEquivalence*'
fi

# A llama-7B-shaped model (its layer shapes: h 4096, ffn 11008, 32 heads, seq 4096, vocab 32000)
# with 8 of its 32 layers, so weights, gradients and Adam states fit one 80 GB GPU.
echo "== trial: llama-7B-shaped, 8 layers, one GPU, bf16"
model=(--model llama2-7b --num-layers 8 --global-batch-size 8 --seq-length 4096)
"${mpi[@]}" -np 1 "$build/autopar-tune" trial --backend cuda --gpu "${AUTOPAR_GPU:-h100}" \
  --nnodes 1 --nproc-per-node 1 "${model[@]}" --config mbs=1,recompute=selective \
  --warmup 2 --iters 5 --format json | tee /tmp/gpu_check_trial.json
python3 - "${AUTOPAR_GPU:-h100}" <<'PY'
import json, sys
r = json.load(open("/tmp/gpu_check_trial.json"))
if r["status"] != "ok":
    sys.exit(f"trial failed: {r['status']}: {r['message']}")
layers, h, ffn, heads, seq, vocab, gbs = 8, 4096, 11008, 32, 4096, 32000, 8
params = layers * (4 * h * h + 3 * h * ffn) + vocab * h  # the logits GEMM's matrix
flops = gbs * seq * (6 * params + 12 * layers * h * seq)   # model FLOPs, PaLM convention
peak = {"h100": 989e12, "h200": 989e12, "a100-80gb": 312e12}[sys.argv[1]]
tflops = flops / r["step_time_s"] / 1e12
print(f"step {r['step_time_s']:.3f} s, {r['tokens_per_s']:.0f} tokens/s, "
      f"{tflops:.1f} TFLOP/s, MFU {100 * tflops * 1e12 / peak:.1f}% "
      f"(model predicted {r['predicted_step_time_s']:.3f} s), peak memory "
      f"{max(r['peak_memory_gib']):.1f} GiB")
PY
