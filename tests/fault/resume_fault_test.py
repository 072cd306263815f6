#!/usr/bin/env python3
"""Fault test of the study journal (docs/journal.md §5, §7): kill the coordinator and resume.

1. An uninterrupted replay-backend study is the reference.
2. The same study is killed with SIGKILL at 20 random points, each inside a journal append
   (AUTOPAR_TEST_CRASH_AT_APPEND=N:BYTES writes the first BYTES bytes of record N, then raises
   SIGKILL), and resumed after each; its final result.json and its sequence of trials must equal
   the reference's.
3. The reference journal is cut at every byte offset of its last record, and of its last
   "trial finished" record: each cut opens to the state before that record (the file is cut back
   to the previous record) and resuming from it reproduces the reference.

Wall-clock fields (result.json "timing", trials.csv "elapsed_s") and the number of attempts of a
retried trial are the only things allowed to differ.
"""
import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys

# Payload tag byte of each JournalRecord kind (field number << 3 | 2).
SESSION, PROBE, STARTED, FINISHED, STUDY_FINISHED = 0x0A, 0x12, 0x1A, 0x22, 0x2A


# Journal format 3 (docs/journal.md §3): a 28-byte file header, then frames of
# u32 length | u32 sequence | u32 payload CRC | u32 header CRC | payload.
FILE_HEADER, FRAME_HEADER = 28, 16


def frames(path):
    """(offset, size, kind) of each complete frame of a journal (CRC not checked here)."""
    if not os.path.exists(path):
        return []
    data = open(path, "rb").read()
    if len(data) < FILE_HEADER or data[:4] != b"APTJ":
        return []
    out, off = [], FILE_HEADER
    while off + FRAME_HEADER <= len(data):
        n = struct.unpack_from("<I", data, off)[0]
        if off + FRAME_HEADER + n > len(data):
            break
        out.append((off, FRAME_HEADER + n, data[off + FRAME_HEADER] if n else None))
        off += FRAME_HEADER + n
    return out


def run(binary, args, study, env_extra=None, resume=False):
    env = dict(os.environ)
    env.pop("AUTOPAR_TEST_CRASH_AT_APPEND", None)
    env.update(env_extra or {})
    cmd = [binary, *args, "--study", study, "--quiet", "--format", "json"]
    if resume:
        cmd.append("--resume")
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def outcome(study):
    """The comparable part of a finished study: result.json and trials.csv minus wall-clock."""
    result = json.load(open(os.path.join(study, "result.json")))
    for key in ("timing", "study"):
        result.pop(key, None)
    rows = open(os.path.join(study, "trials.csv")).read().splitlines()
    header = rows[0].split(",")
    drop = {header.index("elapsed_s"), header.index("attempts")}
    trials = []
    for row in rows:
        cells = row.split(",")
        trials.append(",".join(c for i, c in enumerate(cells) if i not in drop))
    return result, trials


def check_same(label, got, want):
    if got != want:
        g, w = got[1], want[1]
        for i, (a, b) in enumerate(zip(g, w)):
            if a != b:
                sys.exit(f"{label}: trial row {i} differs:\n  got  {a}\n  want {b}")
        if len(g) != len(w):
            sys.exit(f"{label}: {len(g)} trial rows, want {len(w)}")
        sys.exit(f"{label}: result.json differs:\n  got  {got[0]}\n  want {want[0]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--crashes", type=int, default=20)
    ap.add_argument("--seed", type=int, default=2024)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    model = ["--model", "llama2-13b", "--gpu", "a100-80gb", "--nnodes", "1",
             "--nproc-per-node", "8", "--global-batch-size", "64", "--seq-length", "4096"]
    table = os.path.join(a.work, "table.csv")
    made = subprocess.run([a.bin, "make-replay-table", *model, "--truth-seed", "7",
                           "--surprise-oom", "0.05", "--output", table],
                          capture_output=True, text=True)
    if made.returncode != 0:
        sys.exit("make-replay-table failed: " + made.stderr)
    # At least 25 measured trials before the model may stop the study: enough journal records for
    # 20 crash points spaced a few records apart.
    args = ["tune", "--backend", "replay", "--replay-table", table, *model, "--seed", "11",
            "--min-measured", "25"]

    ref = os.path.join(a.work, "reference")
    r = run(a.bin, args, ref)
    if r.returncode != 0:
        sys.exit(f"reference run failed ({r.returncode}): {r.stderr}")
    want = outcome(ref)
    ref_frames = frames(os.path.join(ref, "journal"))
    kinds = [k for _, _, k in ref_frames]
    print(f"reference: {len(want[1]) - 1} trials, {len(ref_frames)} journal records, "
          f"statuses {want[0]['outcomes']}")

    # ---- 2. SIGKILL inside appends, resume after each ----
    rng = random.Random(a.seed)
    study = os.path.join(a.work, "crashed")
    crashes, runs = 0, 0
    while True:
        journal = frames(os.path.join(study, "journal"))
        count = len(journal)
        live = [k for _, _, k in journal if k in (STARTED, FINISHED)]
        in_flight = bool(live) and live[-1] == STARTED
        if crashes < a.crashes:
            # After a crash inside a trial, let its retry finish before the next crash, so no
            # trial is lost three times (which the study would rightly record as worker_lost).
            low = 3 if in_flight else (0 if count == 0 else 1)
            at = count + rng.randint(low, max(low, 3) + (2 if in_flight else 0))
            env = {"AUTOPAR_TEST_CRASH_AT_APPEND": f"{at}:{rng.randint(0, 160)}"}
        else:
            env = {}
        r = run(a.bin, args, study, env, resume=runs > 0)
        runs += 1
        if r.returncode == -signal.SIGKILL:
            crashes += 1
            continue
        if r.returncode != 0:
            sys.exit(f"run {runs} failed ({r.returncode}): {r.stderr}")
        if env:
            sys.exit(f"the study ended before crash point {env} (only {crashes} crashes); "
                     "it needs more journal records")
        break
    check_same("after crashes", outcome(study), want)
    print(f"{crashes} SIGKILLs inside journal appends, {runs} runs: result and trials identical")

    # ---- 3. every byte offset of the last record, and of the last finished trial ----
    ref_bytes = open(os.path.join(ref, "journal"), "rb").read()
    last_trial = max(i for i, k in enumerate(kinds) if k == FINISHED)
    cuts = 0
    for index in (len(ref_frames) - 1, last_trial):
        start, size, _ = ref_frames[index]
        for cut in range(start, start + size):
            d = os.path.join(a.work, "cut")
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            shutil.copy(os.path.join(ref, "study.pb"), d)
            with open(os.path.join(d, "journal"), "wb") as f:
                f.write(ref_bytes[:cut])
            r = run(a.bin, args, d, resume=True)
            if r.returncode != 0:
                sys.exit(f"cut at byte {cut}: resume failed ({r.returncode}): {r.stderr}")
            got_bytes = open(os.path.join(d, "journal"), "rb").read()
            if not got_bytes.startswith(ref_bytes[:start]):
                sys.exit(f"cut at byte {cut}: the records before it changed")
            # What follows the previous record is this session's first record: the torn bytes
            # were cut, not appended to.
            if got_bytes[start + FRAME_HEADER] != SESSION:
                sys.exit(f"cut at byte {cut}: the torn record was not cut")
            check_same(f"cut at byte {cut}", outcome(d), want)
            cuts += 1
    print(f"{cuts} truncations inside the last records: each opened to the previous state and "
          "resumed to the same result")


if __name__ == "__main__":
    main()
