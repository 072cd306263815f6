#!/usr/bin/env python3
"""The `tune` command line (docs/cli.md §6, §10): outputs, formats and exit codes, through the binary.

0 ok, 2 bad input naming the flag, 3 nothing could be measured, 4 study locked or mismatched.
"""
import csv
import fcntl
import json
import os
import subprocess
import sys

import fault_args

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what)


def main():
    a = fault_args.parse()

    def run(*args):
        return subprocess.run([a.bin, *args], capture_output=True, text=True, cwd=a.work)

    model = ["--model", "llama2-7b", "--gpu", "a100-80gb", "--nnodes", "1", "--nproc-per-node",
             "8", "--global-batch-size", "32", "--seq-length", "4096"]
    r = run("make-replay-table", *model, "--output", "t.csv", "--truth-seed", "3")
    check(r.returncode == 0 and os.path.exists(os.path.join(a.work, "t.csv")),
          f"make-replay-table: {r.stderr}")
    replay = ["--backend", "replay", "--replay-table", "t.csv", *model]

    # The default command: flags without a subcommand go to tune.
    r = run(*replay, "--study", "s", "--seed", "5")
    check(r.returncode == 0, f"tune exits 0: {r.returncode} {r.stderr}")
    check("best" in r.stdout and "megatron:" in r.stdout, "final table on stdout")
    check(r.stderr.count("\n[") + r.stderr.startswith("[") >= 1 and "predicted" in r.stderr,
          "a progress line per trial on stderr")
    result = json.load(open(os.path.join(a.work, "s", "result.json")))
    check(result["stop_reason"] in ("converged", "no_likely_improvement", "noise_limited", "exhausted"),
          f"stop reason {result['stop_reason']}")
    check(result["best"]["config"].startswith("tp="), "result.json has the best configuration")
    check(result["replay"]["regret"] >= 0, "result.json has the regret against the table")
    # Where the doubt the model rules leave lies: unmeasured configurations, each at most the
    # probability that some configuration is better, largest first (search.md §8).
    open_ = result["stop_unmeasured"]
    if result["stop_reason"] != "exhausted":
        check(open_ and all(o["config"].startswith("tp=") and
                            0 < o["p_better"] <= result["stop_p_improvement"] + 1e-9 and
                            0 <= o["p_oom"] <= 1 for o in open_),
              f"result.json names the unmeasured likeliest to be better: {open_}")
        check([o["p_better"] for o in open_] == sorted((o["p_better"] for o in open_), reverse=True),
              "largest first")
        check("unmeasured, likeliest >2% faster: " + open_[0]["config"] in r.stderr,
              "the stop line on stderr names the first")
    rows = list(csv.DictReader(open(os.path.join(a.work, "s", "trials.csv"))))
    check(len(rows) == result["trials"], "trials.csv has a row per trial")
    args = open(os.path.join(a.work, "s", "best.args")).read()
    check("--tensor-model-parallel-size" in args and "--micro-batch-size" in args,
          "best.args holds Megatron-LM flags")
    check(not any(f.startswith(("result.json.tmp", "trials.csv.tmp"))
                  for f in os.listdir(os.path.join(a.work, "s"))), "no temporary files left")

    # Formats.
    r = run("tune", *replay, "--study", "s", "--resume", "--format", "json", "--quiet")
    check(r.returncode == 0 and json.loads(r.stdout)["trials"] == result["trials"],
          "resume of a finished study reports the same study")
    r = run("tune", *replay, "--study", "s", "--resume", "--format", "megatron", "--quiet")
    check(r.stdout.strip() == args.strip(), "--format megatron prints best.args")
    r = run("tune", *replay, "--study", "s", "--resume", "--format", "csv", "--quiet")
    check(r.stdout.startswith("trial,tp,pp"), "--format csv prints trials.csv")
    # Megatron-Bridge overrides of the best measured configuration (best.args' configuration).
    best = dict(kv.split("=") for kv in result["best"]["config"].split(","))
    r = run("tune", *replay, "--study", "s", "--resume", "--format", "bridge", "--quiet")
    items = dict(kv.split("=", 1) for kv in r.stdout.split())
    check(r.returncode == 0 and items.get("model.tensor_model_parallel_size") == best["tp"]
          and items.get("train.micro_batch_size") == best["mbs"]
          and items.get("train.global_batch_size") == "32",
          f"--format bridge prints the best configuration's overrides: {r.stdout}")
    r = run("tune", *replay, "--study", "s", "--resume", "--format", "yaml", "--quiet")
    check(r.returncode == 0 and f"\n  tensor_model_parallel_size: {best['tp']}\n" in r.stdout
          and "\ntrain:\n  micro_batch_size: " + best["mbs"] in r.stdout,
          f"--format yaml prints them as a YAML override file: {r.stdout}")

    # Exit code 4: exists without --resume, another seed or model, locked.
    check(run(*replay, "--study", "s").returncode == 4, "existing study without --resume → 4")
    r = run(*replay, "--study", "s", "--resume", "--seed", "6")
    check(r.returncode == 4 and "seed" in r.stderr, f"another seed → 4: {r.stderr}")
    other = list(model)
    other[other.index("--global-batch-size") + 1] = "64"
    r = run("--backend", "replay", "--replay-table", "t.csv", *other, "--study", "s", "--resume")
    check(r.returncode == 4 and "global_batch_size" in r.stderr, f"another job → 4: {r.stderr}")
    with open(os.path.join(a.work, "s", "lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = run(*replay, "--study", "s", "--resume")
        check(r.returncode == 4 and "locked" in r.stderr, f"locked study → 4: {r.stderr}")

    # Exit code 2 naming the flag.
    for argv, flag in [
        ([*replay], "--study"),
        ([*replay, "--study", "b", "--searcher", "bayes"], "--searcher"),
        ([*replay, "--study", "b", "--budget", "soon"], "--budget"),
        ([*replay, "--study", "b", "--tp", "2"], "--tp"),
        ([*replay, "--study", "b", "--fix", "fp8_param_gather=on"], "--fp8-param-gather"),
        (["--backend", "tpu", *model, "--study", "b"], "--backend"),
        (["--backend", "replay", *model, "--study", "b"], "--replay-table"),
        # Real trials need every rank of the launch: one process cannot be 1 x 8 GPUs.
        (["--backend", "cpu", *model, "--study", "b"], "--nnodes"),
        ([*replay, "--study", "b", "--max-p-oom", "2"], "--max-p-oom"),
        (["--backend", "replay", "--replay-table", "missing.csv", *model, "--study", "b"],
         "missing.csv"),
    ]:
        r = run("tune", *argv)
        check(r.returncode == 2 and flag in r.stderr, f"{flag} → 2: {r.returncode} {r.stderr}")

    # Exit code 3: nothing in the table can be measured (a slice of it: each failure is fsync'ed).
    lines = open(os.path.join(a.work, "t.csv")).read().splitlines()[:41]
    with open(os.path.join(a.work, "bad.csv"), "w") as f:
        f.write(lines[0] + "\n")
        status = lines[0].split(",").index("status")
        for line in lines[1:]:
            cells = line.split(",")
            cells[status] = "device_error"
            f.write(",".join(cells) + "\n")
    r = run("--backend", "replay", "--replay-table", "bad.csv", *model, "--study", "bad",
            "--quiet")
    check(r.returncode == 3 and "no configuration could be measured" in r.stderr,
          f"all failing → 3: {r.returncode} {r.stderr}")
    bad = json.load(open(os.path.join(a.work, "bad", "result.json")))
    check(bad["outcomes"]["device_error"] == bad["trials"] and bad["stop_reason"] == "exhausted",
          "every configuration failed twice and the space was exhausted")

    if FAILURES:
        sys.exit(f"{len(FAILURES)} checks failed")
    print("tune command line: all checks passed")


if __name__ == "__main__":
    main()
