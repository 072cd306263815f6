#!/usr/bin/env python3
"""A stand-in for Megatron-LM's pretrain_gpt.py in the `--backend megatron` tests.

It reads Megatron-LM's flags and torch.distributed's environment as pretrain_gpt.py would, refuses
what Megatron-LM would refuse of the trial's own settings, and prints Megatron-LM's log lines
(the formats of tests/data/megatron/training_log_d98e8a6.txt) with step times taken from a table:
no GPU, no torch, no sleeping in place of work.

FAKE_MEGATRON_TABLE=FILE.json: {"rows": [{"tp": 2, "pp": 1, "mbs": 1, "ms": 40.0,
"mem_mb": 30000, "action": "ok"}, ...]}; the first row whose keys (tp, pp, mbs, vpp, cp, sp,
dist_opt, recompute) all match the configuration decides, and a row without them is a default.
"action":
  ok          iterations 1..--train-iters, the first three times slower (warm-up), memory reports
              after iterations 1 and 2 on each data-parallel rank 0, iteration lines on the last
              rank, exit 0;
  oom         rank 0 raises torch's out-of-memory error; the others block (as in a collective);
  crash       rank 1 raises a Python error; the others block;
  die         rank 1 is killed by SIGSEGV; the others block;
  nan         the last rank logs a NaN iteration and raises the rerun state machine's error;
  hang        every rank logs iteration 1, starts a grandchild in its process group, and blocks;
  kill_tuner  rank 1 SIGKILLs its parent (the autopar-tune rank) once, marked by the file
              FAKE_MEGATRON_MARKER, then blocks; the others block until then (a trial that ended
              without rank 1 would leave the kill to a later trial); after that (the marker
              exists) every rank runs as `ok`.
FAKE_MEGATRON_TOKEN is inherited by every process it starts, so a test can find orphans.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime


class OutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError, as the traceback names it."""


OutOfMemoryError.__module__ = "torch"


def parse(argv):
    p = argparse.ArgumentParser(allow_abbrev=False)
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                 "--context-parallel-size", "--num-virtual-stages-per-pipeline-rank",
                 "--micro-batch-size", "--global-batch-size", "--train-iters", "--log-interval",
                 "--eval-iters", "--exit-duration-in-mins", "--num-layers", "--train-samples",
                 "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"):
        p.add_argument(flag, type=int)
    for flag in ("--recompute-granularity", "--recompute-method", "--save", "--load", "--split"):
        p.add_argument(flag)
    p.add_argument("--data-path", nargs="*")
    for flag in ("--sequence-parallel", "--use-distributed-optimizer", "--mock-data",
                 "--log-throughput", "--overlap-grad-reduce", "--overlap-param-gather"):
        p.add_argument(flag, action="store_true")
    args, _ = p.parse_known_args(argv)
    return args


def check(args, world):
    """What Megatron-LM's validate_args would refuse of the trial's settings."""
    assert args.train_iters and args.train_samples is None, "expected iteration-based training"
    assert args.log_interval == 1, "the trial logs every iteration"
    assert args.eval_iters == 0, "the trial evaluates nothing"
    assert args.save is None and args.load is None, "the trial saves and loads nothing"
    assert args.exit_duration_in_mins and args.exit_duration_in_mins >= 1
    assert args.mock_data + bool(args.data_path) <= 1, \
        "A single data source must be provided in training mode, else None"
    tp = args.tensor_model_parallel_size or 1
    pp = args.pipeline_model_parallel_size or 1
    cp = args.context_parallel_size or 1
    assert world % (tp * pp * cp) == 0, "world size is not divisible by tp x pp x cp"
    dp = world // (tp * pp * cp)
    assert args.global_batch_size % (args.micro_batch_size * dp) == 0, \
        "global batch size is not divisible by micro batch size times data parallel size"
    return tp, pp, cp, dp


def configuration(args):
    return {"tp": args.tensor_model_parallel_size or 1,
            "pp": args.pipeline_model_parallel_size or 1,
            "cp": args.context_parallel_size or 1,
            "vpp": args.num_virtual_stages_per_pipeline_rank or 1,
            "mbs": args.micro_batch_size, "sp": args.sequence_parallel,
            "dist_opt": args.use_distributed_optimizer,
            "recompute": args.recompute_granularity or "none"}


def row_for(config):
    with open(os.environ["FAKE_MEGATRON_TABLE"]) as f:
        rows = json.load(f)["rows"]
    for row in rows:
        if all(config[k] == v for k, v in row.items() if k in config):
            return row
    raise KeyError(f"no row of the table matches {config}")


def iteration_line(i, n, ms, gbs, nan=False):
    s = f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')}]"
    s += " iteration {:8d}/{:8d} |".format(i, n)
    s += " consumed samples: {:12d} |".format(i * gbs)
    s += " elapsed time per iteration (ms): {:.1f} |".format(ms)
    s += f" throughput per GPU (TFLOP/s/GPU): {1e5 / ms:.1f} |"
    s += f" learning rate: {1e-4:.6E} |"
    s += f" global batch size: {gbs:5d} |"
    if not nan:
        s += " {}: {:.6E} |".format("lm loss", 10.5 - i / 100)
    s += f" loss scale: {1.0:.1f} |"
    s += " number of skipped iterations: {:3d} |".format(0)
    s += " number of nan iterations: {:3d} |".format(1 if nan else 0)
    print(s, flush=True)


def block():
    """What a rank waiting in a collective its peer never joins looks like."""
    while True:
        signal.pause()


def main(argv):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        assert os.environ.get(name), f"{name} is not set"
    args = parse(argv)
    tp, pp, cp, dp = check(args, world)
    if tp * cp > 1:
        assert os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1", \
            "Using tensor model parallelism or context parallelism require setting the " \
            "environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"
    row = row_for(configuration(args))
    action = row.get("action", "ok")
    if action == "kill_tuner":
        marker = os.environ["FAKE_MEGATRON_MARKER"]
        if os.path.exists(marker):
            action = "ok"
        elif rank == 1:
            open(marker, "w").close()
            print("fake: killing the tuner rank", flush=True)
            os.kill(os.getppid(), signal.SIGKILL)
            block()
        else:
            block()
    print("training ...", flush=True)
    last = rank == world - 1
    dp_rank = (rank // (tp * cp)) % dp
    n, ms, gbs = args.train_iters, float(row["ms"]), args.global_batch_size
    if action == "hang":
        if last:
            iteration_line(1, n, 3 * ms, gbs)
        subprocess.Popen([sys.executable, "-c", "import signal\nwhile True: signal.pause()"])
        block()
    if action == "oom" and rank == 0:
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a "
                               "total capacity of 79.10 GiB of which 1.20 GiB is free.")
    if action == "crash" and rank == 1:
        raise AssertionError("fake: a Python error in the training script")
    if action == "die" and rank == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    if action in ("oom", "crash", "die"):
        block()
    for i in range(1, n + 1):
        if action == "nan" and i == 2:
            if last:
                iteration_line(i, n, ms, gbs, nan=True)
                raise RuntimeError(f"Rank {rank}, node fake, device 0, iteration {i}: Unexpected "
                                   "result nan (message='found NaN in local forward loss "
                                   "calculation')")
            block()
        if last:
            iteration_line(i, n, ms * (3 if i <= 3 else 1), gbs)
        if i in (1, 2) and dp_rank == 0:
            mb = float(row.get("mem_mb", 20000)) * (0.8 if i == 1 else 1) + rank
            print("[Rank {}] {}".format(rank, f"(after {i} iterations) memory (MB)"
                                        f" | allocated: {mb * 0.6:.2f} | max allocated: {mb * 0.9:.2f}"
                                        f" | reserved: {mb:.2f} | max reserved: {mb:.2f}"),
                  flush=True)
    print(f"[after training is done] datetime: {datetime.now()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
