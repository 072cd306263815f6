#!/usr/bin/env bash
# The CUDA path on a GPU machine, in one command:   scripts/gpu_check.sh [BUILD_DIR]
#
#   0. counts the GPUs (nvidia-smi -L, limited by CUDA_VISIBLE_DEVICES when set); with none it
#      prints "skipped: no GPU", writes {"verdict": "skipped"} to gpu_check.json and exits 0;
#   1. builds BUILD_DIR (default build/, or $AUTOPAR_BUILD_DIR): scripts/setup.sh and
#      scripts/build.sh when it has no build yet, else an incremental `cmake --build`. BUILD_DIR
#      may instead be a bundle made on another machine by `scripts/gpu_bundle.py make` (a folder
#      or its .tar.gz), for a GPU machine that cannot build (no network, no Open MPI, protobuf or
#      yaml-cpp): its programs run with the libraries it carries and the machine's own CUDA
#      libraries, the gpu-labelled entries by `gpu_bundle.py run`, one rank as an MPI singleton;
#   2. runs the gpu-labelled tests, `ctest -L '^gpu$' -LE '^bench$'`: every CUDA op against its
#      host reference, the NCCL collectives on 1 and 2 GPUs, the trial equivalence on 4 (entries
#      needing more GPUs than there are skip);
#   3. runs the GPU benchmark, `ctest -L '^bench$'` (tests/gpu/gpu_bench.cc): attention forward
#      and backward TFLOP/s at seq 4k/8k/32k (head_dim 128, GQA 8:1, bf16, causal), bf16 GEMM
#      8192^3, the device attention's error against the host reference, and on 2 and 8 GPUs the
#      NCCL all-reduce bus bandwidth;
#   4. a llama-7B-shaped trial (llama2-7b's dimensions, 8 of its 32 layers) on one GPU, the same
#      with --fp8-format hybrid, and `autopar-tune plan` of the same job for the model's FLOPs
#      per step and the GPU's peak; the same trial recomputing the layer norms and the MLP too
#      (Megatron's --recompute-modules), with hidden dropout, and one Mixtral 8x7B layer (MoE);
#      the llama-7B-shaped and the MoE trial again with all 8 micro-batches run, against the
#      step extrapolated from 2;
#   5. with 2 GPUs or more, the pp=2, cp=2 and tp=2 trials of that model on 2 GPUs;
#   6. scripts/gpu_check_report.py: every figure with its target and PASS/FAIL (targets and how
#      they scale to GPUs other than the H100 are in its docstring) into gpu_check.json
#      ($AUTOPAR_GPU_CHECK_JSON, default BUILD_DIR/gpu_check.json; the raw outputs stay in
#      gpu_check.d/ beside it); exits 1 when any check fails.
#
# Time: a device session has 15 minutes in all, a few of them spent starting the machine, so from
# step 2 on the check has a budget ($AUTOPAR_GPU_CHECK_BUDGET_S, default 480 s) and every step a
# cap within what is left of it, so one hang costs its step, not the session; a step the budget no
# longer allows is not run and its figures FAIL as missing. On one H100/H200 the steps take, from
# what they run: the gpu-labelled tests ~1.5-2 min (65 entries, one process each: CUDA context,
# cuBLAS, cuDNN's libraries and plans; each capped at 45 s, all at 180 s), the benchmark under a
# minute (cuDNN attention ~0.45 PFLOP over the three shapes' 13 forward+backward rounds, about a
# second at 400+ TFLOP/s, plus plan building; the CUDA-core kernel's comparison at 4k and 8k
# only, ~6 TFLOP per round at ~10 TFLOP/s: ~10 s; the GEMM, ~14 TFLOP; each entry capped at
# 90 s, all at 120 s), the seven 1-GPU trials about a minute together (8 llama-7B layers or one
# Mixtral layer, 2 micro-batches or all 8, 7 iterations; capped at 120 s and 60 s each), `plan`
# a second; a hang in every step would take 180 + 120 + 120 + 6 x 60 = 780 s, more than the
# budget, which then leaves the last trials unrun (FAIL). Measured on one H200: steps 2-5 in
# 111 s with two trials (2026-11-26); 116 s with two and 128 s with five (2026-11-28; the seventh
# and sixth, every micro-batch, not yet run there). With 2 GPUs or more the three 2-GPU trials
# (each capped at 90 s) share what is left; raise the budget there.
#
# Tests and benchmarks are found by their ctest labels only. AUTOPAR_GPU names the GPU preset when
# the device's name does not map to one (see `gpu_check_report.py preset`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${1:-${AUTOPAR_BUILD_DIR:-$root/build}}")
home=${build%.tar.gz}  # where the report goes: the build, or a bundle archive's unpacked folder
[[ $home == "$build" ]] || home+=.d
out=$(realpath -m "${AUTOPAR_GPU_CHECK_JSON:-$home/gpu_check.json}")

# ---- 0. GPUs ----
gpus=0
device=
if command -v nvidia-smi >/dev/null 2>&1 && smi=$(nvidia-smi -L 2>/dev/null); then
  gpus=$(grep -c '^GPU ' <<<"$smi" || true)
  device=$(sed -n 's/^GPU 0: \(.*\) (UUID.*/\1/p' <<<"$smi")
fi
if [[ -v CUDA_VISIBLE_DEVICES ]]; then  # set and empty hides every GPU
  visible=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c . || true)
  if ((visible < gpus)); then gpus=$visible; fi
fi
if ((gpus == 0)); then
  echo "gpu_check: skipped: no GPU"
  mkdir -p "$(dirname "$out")"
  printf '{"verdict": "skipped", "reason": "no GPU", "checks": []}\n' >"$out"
  exit 0
fi
echo "gpu_check: $gpus GPU(s), GPU 0: $device"

# ---- 1. build (or a bundle made elsewhere: scripts/gpu_bundle.py) ----
bundle=
if [[ $build == *.tar.gz && -f $build ]]; then
  bundle=$home
  rm -rf "$bundle"
  mkdir -p "$bundle"
  tar -xzf "$build" -C "$bundle" --strip-components=1
  build=$bundle
elif [[ -f $build/tests.json && -d $build/bin ]]; then
  bundle=$build
fi
tune=$build/autopar-tune
if [[ -n $bundle ]]; then
  echo "gpu_check: prebuilt bundle $bundle ($(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['commit'][:12])" "$bundle/tests.json"))"
  bundle_env=$(python3 "$root/scripts/gpu_bundle.py" env "$bundle")  # fails without CUDA libraries
  eval "$bundle_env"
  tune=$bundle/bin/autopar-tune
elif [[ -f $build/CMakeCache.txt && -x $build/autopar-tune ]]; then
  cmake --build "$build" -j"$(nproc)" >/dev/null
else
  "$root/scripts/setup.sh"
  AUTOPAR_BUILD_DIR=$build "$root/scripts/build.sh" >/dev/null
fi
if [[ -z $bundle && -z $(cd "$build" && ctest -N -L '^gpu$' | grep 'Test *#' || true) ]]; then
  echo "gpu_check: FAIL: $build has no gpu-labelled tests (configured without CUDA and NCCL?)"
  exit 1
fi

budget_s=${AUTOPAR_GPU_CHECK_BUDGET_S:-480}
started_s=$SECONDS
cap() {  # cap SECONDS: SECONDS, or what is left of the budget if less (0: spent)
  local left=$((budget_s - (SECONDS - started_s)))
  ((left < 0)) && left=0
  echo $(($1 < left ? $1 : left))
}
bounded() {  # bounded SECONDS CMD...: CMD killed after SECONDS (nothing run when 0)
  local s=$1
  shift
  if ((s <= 0)); then
    echo "gpu_check: not run, the time budget of ${budget_s} s is spent: $*" >&2
    return 124
  fi
  timeout --kill-after=10 "$s" "$@"
}

work=${out%.json}.d  # what the steps below measured, kept for a look after the run
rm -rf "$work"
mkdir -p "$work"
preset=${AUTOPAR_GPU:-$(python3 "$root/scripts/gpu_check_report.py" preset "$device")}
[[ -n $preset ]] || echo "gpu_check: no GPU preset for '$device' (set AUTOPAR_GPU): targets" \
  "other than MFU are not applied; the trials use h100's figures"
export OMP_NUM_THREADS=1

# ---- 2, 3. tests and benchmark, by label (a failure is recorded, not fatal) ----
if [[ -n $bundle ]]; then
  for kind in gpu bench; do
    echo "== the bundle's $kind entries"
    step=$(cap $([[ $kind == gpu ]] && echo 180 || echo 120))
    # The budget is enforced inside (each entry at most what is left); the outer bound only
    # catches the runner itself. A spent budget runs nothing (the runner reads 0 as "none").
    AUTOPAR_GPU=$preset bounded $((step > 0 ? step + 30 : 0)) python3 "$root/scripts/gpu_bundle.py" run \
      "$bundle" "$work" --gpus "$gpus" --kind "$kind" \
      --timeout $([[ $kind == gpu ]] && echo 45 || echo 90) --budget-s "$step" || true
  done
else
  echo "== ctest -L gpu"
  (cd "$build" && bounded "$(cap 180)" ctest -L '^gpu$' -LE '^bench$' --output-on-failure \
    --timeout 45 --output-junit "$work/ctest_gpu.xml") || true
  echo "== ctest -L bench"
  (cd "$build" && AUTOPAR_GPU_BENCH_DIR=$work AUTOPAR_GPU=$preset bounded "$(cap 120)" \
    ctest -L '^bench$' --output-on-failure --timeout 90 \
    --output-junit "$work/ctest_bench.xml") || true
fi
cat "$work"/gpu_bench_np*.json 2>/dev/null || true

# ---- 4, 5. trials ----
mpi=(mpirun)
if mpirun --version 2>/dev/null | grep -qE 'Open MPI|OpenRTE'; then
  mpi+=(--oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1)
  [[ -z $bundle ]] || mpi+=(-x LD_LIBRARY_PATH)
fi
job=(--model llama2-7b --num-layers 8 --global-batch-size 8 --seq-length 4096
  --gpu "${preset:-h100}")
trial() {  # trial NAME RANKS CONFIG CAP_S [FLAGS...]
  echo "== trial $1: $3 ${*:5} on $2 GPU(s), at most $(cap "$4") s"
  local launch=("${mpi[@]}" -np "$2")
  # A bundle on a machine without mpirun: one rank runs as an MPI singleton; more cannot start.
  if [[ -n $bundle ]] && ! command -v mpirun >/dev/null; then
    if (($2 > 1)); then
      echo "not run: $2 ranks need mpirun, which this machine lacks" >"$work/trial_$1.err"
      return
    fi
    launch=()
  fi
  # The trial's own deadline ends it (as `timeout`, communicators aborted) before the kill does.
  local s
  s=$(cap "$4")
  bounded "$s" "${launch[@]}" "$tune" trial --backend cuda --nnodes 1 --nproc-per-node "$2" \
    "${job[@]}" --config "$3" "${@:5}" --warmup 2 --iters 5 \
    --trial-timeout $((s > 30 ? s - 20 : 10)) --format json >"$work/trial_$1.json" 2>"$work/trial_$1.err" || true
  cat "$work/trial_$1.json"
  grep -m 3 'autopar-tune' "$work/trial_$1.err" >&2 || true
}
trial 1gpu 1 mbs=1,recompute=selective 120
# The same in FP8 (refused, and reported skipped, on a GPU without fp8 tensor cores).
trial 1gpu_fp8 1 mbs=1,recompute=selective 60 --fp8-format hybrid
bounded 30 "$tune" plan "${job[@]}" --nnodes 1 --nproc-per-node 1 --format json \
  >"$work/plan.json" || true
# What trials run beyond the layer above: Megatron's --recompute-modules (the layer norms and the
# MLP recomputed too: the peak must fall), its hidden dropout (the masks kept for backward), and
# an MoE layer (Mixtral's: router, top-2 dispatch, 8 experts' GEMMs, the load-balancing loss;
# one layer, which fits a 40 GB card).
trial 1gpu_modules 1 mbs=1,recompute=selective,recompute_modules=core_attn+layernorm+mlp 60
trial 1gpu_dropout 1 mbs=1,recompute=selective 60 --hidden-dropout 0.1 --attention-dropout 0.1
dense=("${job[@]}")
job=(--model mixtral-8x7b --num-layers 1 "${dense[@]:4}")
trial 1gpu_moe 1 mbs=1,recompute=selective 60
# A trial runs 2 of the job's 8 micro-batches and extrapolates (docs/trial.md §9): the same two
# trials with every micro-batch run say whether the extrapolation holds.
trial 1gpu_moe_all 1 mbs=1,recompute=selective 60 --max-microbatches -1
job=("${dense[@]}")
trial 1gpu_all 1 mbs=1,recompute=selective 60 --max-microbatches -1
if ((gpus >= 2)); then
  for dim in pp cp tp; do trial "${dim}2" 2 "$dim=2,mbs=1,recompute=selective" 90; done
fi
echo "gpu_check: steps 2-5 took $((SECONDS - started_s)) s of the ${budget_s} s budget"

# ---- 6. verdicts ----
echo "== gpu_check"
python3 "$root/scripts/gpu_check_report.py" report --work "$work" --gpus "$gpus" \
  --device "$device" --preset "$preset" --out "$out"
