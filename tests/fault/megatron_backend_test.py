#!/usr/bin/env python3
"""`tune --backend megatron` end to end under `mpirun -np 4`, with the fake training script
(megatron_backend_fake_pretrain.py) in place of Megatron-LM's pretrain_gpt.py:

  converge  a 48-candidate space (tp, pp, mbs, recompute, the distributed optimizer) whose step
            times are the analytic model's with what it gets wrong (tp=2 faster, selective
            recompute dearer, one OOM), so that the table's best is not the model's first: the
            search stops by its stop rule (not exhausted, not --max-trials) before measuring
            every candidate, best.args names the table's best, every rank's log is under
            STUDY/trials/N/, start-up is reported, and the trial's command equals what
            launcher/autopar-train gives for the same configuration and arguments (plus the
            trial's own settings);
  outcomes  oom, crash (a Python error), die (SIGSEGV), nan and hang (past --trial-timeout),
            each recorded as its outcome (oom, invalid, device_error, nonfinite, timeout);
  resume    the fake SIGKILLs its tuner rank in the middle of the first trial; autopar-mpirun
            relaunches with --resume, the trial is retried (attempt 2) and the search finishes;
  input     --backend megatron without --train-command, --train-command with another backend,
            an unreadable --megatron-args-file: exit 2 naming the flag.
After every run no process the fake started is left (FAKE_MEGATRON_TOKEN in its environment).
"""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys

_ap = argparse.ArgumentParser(description=__doc__)
_ap.add_argument("--bin", required=True)
_ap.add_argument("--work", required=True)
_ap.add_argument("--source", required=True)
ARGS = _ap.parse_args()
SOURCE = ARGS.source
FAKE = os.path.join(SOURCE, "tests/fault/megatron_backend_fake_pretrain.py")
TRAIN = f"{sys.executable} {FAKE}"
MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "4", "-x", "OMP_NUM_THREADS=1"]
USER_ARGS = """torchrun --nproc_per_node 4 pretrain_gpt.py \\
  --num-layers 4 --hidden-size 256 --ffn-hidden-size 1024 --num-attention-heads 8 \\
  --seq-length 512 --max-position-embeddings 512 --vocab-size 32000 \\
  --global-batch-size 16 --micro-batch-size 1 --tensor-model-parallel-size 2 \\
  --bf16 --lr 1e-4 --tokenizer-type NullTokenizer --tp-comm-overlap \\
  --data-path 1.0 /data/corpus_text_document --split 99,1,0 --train-samples 1000 \\
  --save /ckpt --load /ckpt --log-interval 100
"""
# The words of USER_ARGS the trial owns (MegatronTrialCommand), for the comparison with
# autopar-train, which leaves them alone.
OWNED = {"--data-path": 2, "--split": 1, "--train-samples": 1, "--save": 1, "--load": 1,
         "--log-interval": 1}
SPACE = ["--gpu", "h100", "--nnodes", "1", "--nproc-per-node", "4", "--vpp", "1"]
# The outcome and resume runs: a space of a few candidates.
NARROW = ["--recompute", "none", "--fix", "sp=off,dist_opt=off"]
# The converge run: 48 candidates (tp, pp, mbs, recompute and the distributed optimizer).
WIDE = ["--tp", "1,2,4", "--pp", "1,2", "--mbs", "1,2,4", "--recompute", "none,selective",
        "--fix", "sp=off"]
STOPPED = ("converged", "no_likely_improvement", "noise_limited")
# --trial-timeout: the hang outcome's runs wait for it to pass, so it is short there; every other
# run's trials end by themselves (under half a second each under ASan on a loaded two-core
# machine), and a deadline they never come near keeps a slow machine from turning one into a
# `timeout`.
HANG_TIMEOUT_S = "4"
TRIAL_TIMEOUT_S = "120"
failures = []


def fail(what):
    failures.append(what)
    print("FAIL:", what)


def run(cmd, env=None, timeout=240):
    full_env = dict(os.environ, **(env or {}))
    p = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def orphans(token):
    """Processes whose environment carries the fake's token."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"FAKE_MEGATRON_TOKEN={token}".encode() in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            pass
    return found


def tune(work, name, table, restrict, extra=(), env=None, launcher=None,
         timeout_s=TRIAL_TIMEOUT_S):
    study = os.path.join(work, name)
    with open(os.path.join(work, name + ".json"), "w") as f:
        json.dump({"rows": table}, f)
    token = f"{os.getpid()}-{name}"
    env = dict(env or {}, FAKE_MEGATRON_TABLE=os.path.join(work, name + ".json"),
               FAKE_MEGATRON_TOKEN=token)
    flags = ["--backend", "megatron", "--train-command", TRAIN, "--megatron-args-file",
             os.path.join(work, "user.args"), *SPACE, *restrict, "--study", study,
             "--status-port", "-1", "--trial-timeout", timeout_s, *extra]
    if launcher:
        cmd = [launcher, "-np", "4", "--max-restarts", "2", "--autopar-tune", ARGS.bin, "--",
               *flags]
    else:
        cmd = [*MPIRUN, ARGS.bin, *flags]
    code, out, err = run(cmd, env)
    left = orphans(token)
    if left:
        fail(f"{name}: processes left behind: {left}")
    return study, code, out, err


def rows(study):
    import csv
    with open(os.path.join(study, "trials.csv")) as f:
        return list(csv.DictReader(f))


def trial_command(study, n):
    with open(os.path.join(study, "trials", str(n), "rank-0.log")) as f:
        for line in f:
            if line.startswith("autopar-tune: command:"):
                return line.split(":", 2)[2].split()
    return []


def check_parity(work, study, spec):
    """The trial's command = autopar-train's for the same configuration, plus the settings."""
    code, flags, err = run([ARGS.bin, "predict", "--megatron-args-file",
                            os.path.join(work, "user.args"), "--gpu", "h100", "--nnodes", "1",
                            "--nproc-per-node", "4", "--config", spec, "--format", "megatron"])
    if code != 0:
        return fail(f"predict --config {spec}: exit {code}: {err}")
    fake_study = os.path.join(work, "parity")
    os.makedirs(fake_study, exist_ok=True)
    with open(os.path.join(fake_study, "best.args"), "w") as f:
        f.write(flags.strip().splitlines()[-1] + "\n")
    words = shlex.split(USER_ARGS.replace("\\\n", " "))
    script, i = [], words.index("pretrain_gpt.py") + 1
    while i < len(words):
        skip = OWNED.get(words[i])
        if skip is not None:
            i += 1 + skip
            continue
        script.append(words[i])
        i += 1
    code, out, err = run([sys.executable, os.path.join(SOURCE, "launcher/autopar-train"),
                          "--study", fake_study, "--", *shlex.split(TRAIN), *script])
    if code != 0:
        return fail(f"autopar-train: exit {code}: {err}")
    ours = trial_command(study, 1)
    expected = shlex.split(out)
    if ours[:len(expected)] != expected:
        fail(f"the trial's command differs from autopar-train's:\n  ours   {ours}\n  theirs "
             f"{expected}")
    settings = ours[len(expected):]
    for flag in ("--train-iters", "--log-interval", "--eval-iters", "--exit-duration-in-mins",
                 "--mock-data", "--log-throughput"):
        if flag not in settings:
            fail(f"the trial's settings lack {flag}: {settings}")
    for flag in OWNED:
        if flag in ours[:len(expected)] or (flag in settings and flag != "--log-interval"):
            fail(f"the trial's command keeps the user's {flag}")


def model_ranking(work):
    """[(config dict, predicted step s)] of the WIDE space, the analytic model's order."""
    import csv
    code, out, err = run([ARGS.bin, "plan", "--megatron-args-file", os.path.join(work, "user.args"),
                          *SPACE, *WIDE, "--top", "1000", "--format", "csv"])
    if code != 0:
        raise RuntimeError(f"plan: exit {code}: {err}")
    ranked = []
    for r in csv.DictReader(out.splitlines()):
        config = dict(kv.split("=") for kv in r["Config"].split(","))
        ranked.append((config, float(r["Time per Step"])))
    return ranked


def converge_table(ranked):
    """The measured step times: the model's, with what it gets wrong here: tp=2 runs a quarter
    faster than modelled, selective recompute costs 5% (the model: under 1%), a smaller micro-batch
    a little more; the model's first configuration runs out of memory (the search's prior favours
    it, so the run meets the OOM whatever the model's other rankings). Returns (rows, the table's
    best configuration)."""
    table, best = [], None
    oom = ranked[0][0]
    for config, step_s in ranked:
        tp, pp, mbs = int(config["tp"]), int(config["pp"]), int(config["mbs"])
        ms = 1e5 * step_s * (0.75 if tp == 2 else 1.0)
        ms *= (1.05 if config["recompute"] == "selective" else 1.0) * (1 + 0.03 * (4 // mbs - 1))
        row = {"tp": tp, "pp": pp, "mbs": mbs, "recompute": config["recompute"],
               "dist_opt": config["dist_opt"] == "on", "ms": round(ms, 1),
               "mem_mb": 20000 + 2000 * mbs}
        if config == oom:
            row["action"] = "oom"
        elif best is None or row["ms"] < best["ms"]:
            best = row
        table.append(row)
    return table, best


def flags_of(row):
    return (f"--tensor-model-parallel-size {row['tp']} --pipeline-model-parallel-size {row['pp']} "
            f"--micro-batch-size {row['mbs']}")


def converge(work):
    ranked = model_ranking(work)
    table, best_row = converge_table(ranked)
    first = ranked[0][0]
    if (int(first["tp"]), int(first["pp"]), int(first["mbs"])) == \
            (best_row["tp"], best_row["pp"], best_row["mbs"]):
        fail(f"converge: the model already ranks the table's best first: {first}")
    study, code, out, err = tune(work, "converge", table, WIDE)
    if code != 0:
        return fail(f"converge: exit {code}\n{err[-3000:]}")
    with open(os.path.join(study, "best.args")) as f:
        best = f.read()
    with open(os.path.join(study, "result.json")) as f:
        stop = json.load(f)["stop_reason"]
    trials = rows(study)
    measured = {spec_of(t) for t in trials}
    print(f"converge: {len(ranked)} candidates, {len(trials)} trials ({len(measured)} "
          f"configurations), stopped: {stop}; the table's best {flags_of(best_row)} "
          f"recompute={best_row['recompute']} dist_opt={best_row['dist_opt']}; "
          f"best.args: {best.strip()}")
    if stop not in STOPPED:
        fail(f"converge: stopped by {stop}, not by the stop rule ({', '.join(STOPPED)})")
    if len(measured) >= len(ranked):
        fail(f"converge: all {len(ranked)} candidates measured")
    want_opt = "--use-distributed-optimizer" in best
    want_rc = ("--recompute-granularity selective" in best and "selective") or "none"
    if flags_of(best_row) not in best or want_opt != best_row["dist_opt"] or \
            want_rc != best_row["recompute"]:
        fail(f"converge: best.args is not the table's best ({best_row}): {best}")
    for t in trials:
        n = t["trial"]
        logs = sorted(os.listdir(os.path.join(study, "trials", n)))
        if logs != [f"rank-{r}.log" for r in range(4)]:
            fail(f"converge: trial {n}'s logs are {logs}")
        if t["status"] == "ok" and not float(t["startup_s"] or 0) > 0:
            fail(f"converge: trial {n} reports no start-up time: {t}")
    if not any(t["status"] == "oom" for t in trials):
        fail(f"converge: the OOM of {ranked[0][0]} was never recorded")
    if "start-up" not in err:
        fail("converge: the progress lines do not show the start-up time")
    check_parity(work, study, spec_of(next(t for t in trials if t["trial"] == "1")))
    code, report, err = run([ARGS.bin, "report", "--study", study])
    if code != 0:
        fail(f"converge: report exit {code}: {err}")


def spec_of(row):
    spec = f"tp={row['tp']},pp={row['pp']}"
    for key in ("pp_first", "pp_last"):
        if row[key] not in ("", "0"):
            spec += f",{key}={row[key]}"
    return spec + (f",dp={row['dp']},cp={row['cp']},up={row['up']},ep={row['ep']},vpp="
                   f"{row['vpp']},mbs={row['mbs']},sp={row['sp']},recompute={row['recompute']},"
                   f"dist_opt={row['dist_opt']}")


def outcomes(work):
    single = ["--tp", "2", "--pp", "1", "--mbs", "1"]
    for action, status, words in [("oom", "oom", "CUDA out of memory"),
                                  ("crash", "invalid", "a Python error in the training script"),
                                  ("die", "device_error", "signal 11"),
                                  ("nan", "nonfinite", "found NaN"),
                                  ("hang", "timeout", "deadline")]:
        study, code, out, err = tune(
            work, action, [{"action": action, "ms": 5.0}], NARROW + single,
            timeout_s=HANG_TIMEOUT_S if action == "hang" else TRIAL_TIMEOUT_S)
        if code != 3:
            fail(f"{action}: exit {code}, expected 3 (nothing measured)\n{err[-2000:]}")
            continue
        # A failure other than OOM may be tried again (search.md: at most max_failures times).
        for t in rows(study):
            if t["status"] != status or words not in t["message"]:
                fail(f"{action}: trial {t['trial']} recorded {t['status']}: {t['message']}")
            else:
                print(f"{action}: trial {t['trial']} {status}: ...{t['message'][-90:]!r}")


def resume(work):
    # Whatever the first proposal is (tp=1 at mbs 1 and 2 tie in the model, so a probe's noise
    # can decide between them), its first run kills the tuner; afterwards every configuration
    # runs as the one row says.
    table = [{"action": "kill_tuner", "ms": 5.0}]
    marker = os.path.join(work, "killed")
    study, code, out, err = tune(work, "resume", table,
                                 NARROW + ["--tp", "1,2", "--pp", "1", "--mbs", "1,2"],
                                 env={"FAKE_MEGATRON_MARKER": marker},
                                 launcher=os.path.join(SOURCE, "launcher/autopar-mpirun"))
    if code != 0:
        return fail(f"resume: exit {code}\n{err[-3000:]}")
    if not os.path.exists(marker):
        return fail("resume: the fake never killed its tuner rank (the first proposal changed?)")
    attempts = os.listdir(os.path.join(study, "launcher-logs"))
    trials = rows(study)
    first = next(t for t in trials if t["trial"] == "1")
    if len(attempts) != 2 or first["status"] != "ok" or first["attempts"] != "2":
        fail(f"resume: {len(attempts)} launcher attempts, trial 1 {first['status']} after "
             f"{first['attempts']} attempts")
    kept = os.path.join(study, "trials", "1", "rank-1.attempt-1.log")
    if not os.path.exists(kept):
        fail(f"resume: the interrupted attempt's log was not kept ({kept})")
    print(f"resume: {len(trials)} trials, trial 1 retried: {first['status']}, "
          f"{first['attempts']} attempts")


def bad_input(work):
    base = [ARGS.bin, "tune", "--megatron-args-file", os.path.join(work, "user.args"), "--gpu",
            "h100", "--nnodes", "1", "--nproc-per-node", "4", "--study",
            os.path.join(work, "bad")]
    for extra, flag in [(["--backend", "megatron"], "--train-command"),
                        (["--backend", "replay", "--train-command", TRAIN], "--train-command"),
                        (["--backend", "cpu", "--real-data"], "--real-data")]:
        code, _, err = run(base + extra)
        if code != 2 or flag not in err:
            fail(f"{extra}: exit {code}, expected 2 naming {flag}: {err}")
    code, _, err = run([ARGS.bin, "tune", "--backend", "megatron", "--train-command", TRAIN,
                        "--megatron-args-file", os.path.join(work, "missing.args"),
                        "--study", os.path.join(work, "bad")])
    if code != 2 or "--megatron-args-file" not in err:
        fail(f"an unreadable --megatron-args-file: exit {code}: {err}")
    if os.path.exists(os.path.join(work, "bad", "study.pb")):
        fail("bad input left a study behind")


def main():
    work = ARGS.work
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with open(os.path.join(work, "user.args"), "w") as f:
        f.write(USER_ARGS)
    bad_input(work)
    converge(work)
    outcomes(work)
    resume(work)
    print(f"{0 if failures else 1} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
