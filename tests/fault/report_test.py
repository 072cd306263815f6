#!/usr/bin/env python3
"""`report` and the study's journal against hostile input (issue 17):

1. `report --plot` runs the plot script without a shell: a study path holding shell syntax
   (`x'; touch PWNED; echo '`) reaches the script as one argument and runs nothing; a failing or
   missing script is exit 1 naming it.
2. `report --output DIR` writes there and nowhere in the study; a study directory that cannot be
   written (read-only) is refused naming --output (exit 2) and nothing is written.
3. A journal from another study (same flags and seed, another replay table: its trials replayed
   silently before) is refused by `report` and `tune --resume` with exit 4, its bytes unchanged.
4. `report`'s best is the study's recommendation (result.json's), not the fastest single
   measurement: on a noisy world (8% noise) the two differ for these seeds (before the fix, the
   report printed the lucky measurement's configuration).
"""
import argparse
import csv
import json
import os
import shutil
import stat
import subprocess
import sys

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what)


PLOT_SCRIPT = """import json, os, sys
with open(os.environ["PLOT_ARGV"], "w") as f:
    json.dump(sys.argv[1:], f)
print("drew nothing")
sys.exit(int(os.environ.get("PLOT_EXIT", "0")))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    a.bin = os.path.abspath(a.bin)
    a.work = os.path.abspath(a.work)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    os.chmod(a.work, 0o755)

    def run(*args, env=None, **kw):
        return subprocess.run([a.bin, *args], capture_output=True, text=True, cwd=a.work,
                              env=env, timeout=120, **kw)

    model = ["--model", "tiny-gpt", "--gpu", "cpu", "--nnodes", "1", "--nproc-per-node", "2",
             "--global-batch-size", "4", "--seq-length", "64"]
    for seed in ("1", "2"):
        r = run("make-replay-table", *model, "--output", f"t{seed}.csv", "--truth-seed", seed)
        check(r.returncode == 0, f"make-replay-table: {r.stderr}")
    tune = ["tune", "--backend", "replay", *model, "--quiet", "--searcher", "random", "--seed",
            "3", "--max-trials", "6"]
    for name, table in (("base", "t1.csv"), ("other", "t2.csv")):
        r = run(*tune, "--replay-table", table, "--study", name)
        check(r.returncode == 0, f"tune {name}: {r.stderr}")

    # 1. No shell in --plot.
    hostile = "x'; touch PWNED; echo '"
    shutil.copytree(os.path.join(a.work, "base"), os.path.join(a.work, hostile))
    script = os.path.join(a.work, "plot.py")
    with open(script, "w") as f:
        f.write(PLOT_SCRIPT)
    argv_file = os.path.join(a.work, "argv.json")
    env = dict(os.environ, AUTOPAR_PLOT_SCRIPT=script, PLOT_ARGV=argv_file)
    r = run("report", "--study", hostile, "--plot", env=env)
    check(r.returncode == 0, f"report --plot of '{hostile}': exit {r.returncode}: {r.stderr}")
    check(not os.path.exists(os.path.join(a.work, "PWNED")), "the study path ran `touch PWNED`")
    argv = json.load(open(argv_file)) if os.path.exists(argv_file) else None
    report_dir = os.path.join(hostile, "report")
    check(argv == [hostile, report_dir, os.path.join(hostile, "plots")],
          f"the plot script's arguments: {argv}")
    check("plot: drew nothing" in r.stdout, f"the script's output is relayed: {r.stdout[-300:]}")
    r = run("report", "--study", "base", "--plot", env=dict(env, PLOT_EXIT="3"))
    check(r.returncode == 1 and "exited 3" in r.stderr, f"a failing plot script: {r.stderr}")
    r = run("report", "--study", "base", "--plot",
            env=dict(env, AUTOPAR_PLOT_SCRIPT=os.path.join(a.work, "no-such-script.py")))
    check(r.returncode == 1 and "report:" in r.stderr, f"a missing plot script: {r.stderr}")

    # 2. --output, and a study that cannot be written.
    shutil.rmtree(os.path.join(a.work, "base", "report"), ignore_errors=True)
    r = run("report", "--study", "base", "--output", "elsewhere")
    check(r.returncode == 0, f"report --output: {r.stderr}")
    for name in ("trials.csv", "summary.json", "breakdown.csv"):
        check(os.path.exists(os.path.join(a.work, "elsewhere", name)), f"--output lacks {name}")
    check(not os.path.exists(os.path.join(a.work, "base", "report")),
          "report --output wrote into the study")
    readonly = os.path.join(a.work, "readonly")
    shutil.copytree(os.path.join(a.work, "base"), readonly)
    shutil.rmtree(os.path.join(readonly, "report"), ignore_errors=True)
    for root, dirs, files in os.walk(readonly):
        for n in files:
            os.chmod(os.path.join(root, n), 0o444)
    os.chmod(readonly, 0o555)
    out_dir = os.path.join(a.work, "writable")
    os.makedirs(out_dir)
    os.chmod(out_dir, 0o777)
    # Root writes through any mode: run as nobody there.
    as_user = {"preexec_fn": lambda: os.setuid(65534)} if os.geteuid() == 0 else {}
    r = run("report", "--study", "readonly", **as_user)
    check(r.returncode == 2 and "--output" in r.stderr,
          f"a read-only study: exit {r.returncode}: {r.stderr}")
    check(not os.path.exists(os.path.join(readonly, "report")), "wrote into the read-only study")
    r = run("report", "--study", "readonly", "--output", out_dir, **as_user)
    check(r.returncode == 0 and os.path.exists(os.path.join(out_dir, "summary.json")),
          f"a read-only study with --output: exit {r.returncode}: {r.stderr}")
    r = run("report", "--study", "base", "--output", os.path.join(readonly, "in"), **as_user)
    check(r.returncode == 2 and "--output" in r.stderr, f"an --output that cannot be written: "
          f"exit {r.returncode}: {r.stderr}")

    # 3. Another study's journal.
    journal = os.path.join(a.work, "base", "journal")
    shutil.copy(os.path.join(a.work, "other", "journal"), journal)
    foreign = open(journal, "rb").read()
    r = run("report", "--study", "base")
    check(r.returncode == 4 and "belongs to another study" in r.stderr,
          f"report of a foreign journal: exit {r.returncode}: {r.stderr}")
    r = run(*tune, "--replay-table", "t1.csv", "--study", "base", "--resume", "--max-trials", "8")
    check(r.returncode == 4 and "belongs to another study" in r.stderr,
          f"tune --resume of a foreign journal: exit {r.returncode}: {r.stderr}")
    r = run(*tune, "--replay-table", "t1.csv", "--study", "base", "--resume", "--salvage")
    check(r.returncode == 4, f"--salvage of a foreign journal: exit {r.returncode}: {r.stderr}")
    check(open(journal, "rb").read() == foreign, "the foreign journal was changed")
    r = run(*tune, "--replay-table", "t2.csv", "--study", "other", "--resume", "--max-trials", "8")
    check(r.returncode == 0, f"its own study resumes it: {r.stderr}")

    # 4. The recommendation, on a noisy world where repeats decide it.
    noisy = ["--model", "llama2-7b", "--gpu", "h100", "--nnodes", "2", "--nproc-per-node", "8",
             "--global-batch-size", "64"]
    r = run("make-replay-table", *noisy, "--world", "noisy", "--noise", "0.08", "--truth-seed",
            "5", "--output", "noisy.csv")
    check(r.returncode == 0, f"make-replay-table --world noisy: {r.stderr}")
    for seed in ("1", "6"):
        study = f"noisy{seed}"
        r = run("tune", "--backend", "replay", "--replay-table", "noisy.csv", *noisy, "--quiet",
                "--seed", seed, "--max-trials", "30", "--study", study)
        check(r.returncode == 0, f"tune {study}: {r.stderr}")
        result = json.load(open(os.path.join(a.work, study, "result.json")))["best"]["config"]
        r = run("report", "--study", study)
        check(r.returncode == 0 and f"best: {result} " in r.stdout,
              f"report {study}'s best is not result.json's {result}: {r.stdout[:400]}")
        summary = json.load(open(os.path.join(a.work, study, "report", "summary.json")))["best"]
        check(summary["config"] == result and summary["recorded"],
              f"summary.json's best {summary} is not result.json's {result}")
        # breakdown.csv: one row per configuration, by mean measured time, the recommendation
        # marked; a configuration measured again is one row with its count.
        rows = list(csv.DictReader(open(os.path.join(a.work, study, "report", "breakdown.csv"))))
        configs = [row["config"] for row in rows]
        means = [float(row["measured_step_time_s"]) for row in rows]
        check(len(set(configs)) == len(configs), f"{study}: breakdown.csv repeats a configuration")
        check(means == sorted(means), f"{study}: breakdown.csv is not by mean measured time")
        marked = [row["config"] for row in rows if row["recommended"] == "true"]
        check(marked in ([result], []) and (marked or result not in configs),
              f"{study}: breakdown.csv marks {marked}, the recommendation is {result}")
        repeats = sum(int(row["measurements"]) > 1 for row in rows)
        print(f"{study}: breakdown.csv {len(rows)} rows, {repeats} measured more than once")

    print(f"{len(FAILURES)} failed")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
