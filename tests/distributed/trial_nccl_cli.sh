#!/usr/bin/env bash
# Usage: trial_nccl_cli.sh MPIEXEC AUTOPAR_TUNE [MPIEXEC_FLAGS...]
# The trial command under the NCCL-semantics emulation ends `ok` for the schedules with
# point-to-point traffic (issue 10's acceptance list); before grouped p2p each of them timed out.
set -euo pipefail
mpiexec=$1
bin=$2
shift 2
common=(trial --backend cpu --p2p-semantics nccl --model tiny --num-layers 8 --nnodes 2
        --nproc-per-node 2 --global-batch-size 16 --seq-length 128 --trial-timeout 120)
status=0
# Last, uneven pipeline stages (1+2+2+3 layers; 2+6 interleaved in chunks of 1 and 3).
for config in tp=1,pp=2,dp=2 pp=4,vpp=2 pp=2,vpp=2,cp=2 cp=2,dp=2 cp=2,dp=2,cp_comm=allgather \
              tp=2,sp=on,dp=2 up=2,tp=2,sp=on \
              pp=4,pp_first=1,pp_last=3 pp=2,dp=2,vpp=2,pp_first=2; do
  out=$(OMP_NUM_THREADS=1 "$mpiexec" -np 4 "$@" "$bin" "${common[@]}" --config "$config" 2>&1) || true
  if grep -q "cpu backend: ok" <<<"$out"; then
    echo "ok      $config"
  else
    echo "FAILED  $config"
    echo "$out" | tail -5
    status=1
  fi
done
exit $status
