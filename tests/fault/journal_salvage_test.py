#!/usr/bin/env python3
"""A corrupt journal through the binary (docs/journal.md §5, §9; docs/cli.md §6, §10).

1. A replay-backend study runs to its end (the reference).
2. One bit of a trial result in the middle of its journal is flipped: `tune --resume` and
   `report` exit 4 naming the record and the byte offset, and leave the journal's bytes as they
   were.
3. `tune --resume --salvage` copies the journal to journal.corrupt-1, keeps every valid record
   (every other trial's measurement is in the new trials.csv), runs the damaged trial again and
   finishes the study; a later plain `--resume` and `report` read the salvaged journal (exit 0).
4. A whole frame cut out of the journal (a gap in the sequence numbers) is refused the same way.
5. `--salvage` without `--resume` is bad input (exit 2).
6. A study begun by another build (here: its journal's state digests altered, as another build's
   search would have written them; CRCs recomputed, so the file is sound): `tune --resume` notes
   that the journal does not replay as this build runs it, replays its measurements as
   observations, keeps every trial and finishes the study (exit 0), where it refused it (exit 4)
   before.
"""
import csv
import os
import re
import shutil
import struct
import subprocess
import sys

import fault_args

FILE_HEADER, FRAME_HEADER = 28, 16
FINISHED = 0x22  # the payload's first byte in a "trial finished" record (field 4 << 3 | 2)
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what)


def frames(data):
    """(offset, size, kind) of each frame of a format-2 journal."""
    out, off = [], FILE_HEADER
    while off + FRAME_HEADER <= len(data):
        n = struct.unpack_from("<I", data, off)[0]
        if off + FRAME_HEADER + n > len(data):
            break
        out.append((off, FRAME_HEADER + n, data[off + FRAME_HEADER]))
        off += FRAME_HEADER + n
    return out


CONFIG = ["tp", "pp", "dp", "cp", "up", "ep", "vpp", "mbs", "sp", "recompute",
          "recompute_layers", "dist_opt"]


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def varint(data, at):
    """(value, next offset) of the protobuf varint at `at`."""
    value, shift = 0, 0
    while True:
        b = data[at]
        value |= (b & 0x7F) << shift
        at += 1
        if not b & 0x80:
            return value, at
        shift += 7


def other_build(data):
    """The journal with every TrialFinished's state digest (field 4, fixed64) changed and each
    frame's CRCs recomputed: what a build whose search differs would have written."""
    out = bytearray(data[:FILE_HEADER])
    for off, size, kind in frames(data):
        n, seq = struct.unpack_from("<II", data, off)
        payload = bytearray(data[off + FRAME_HEADER:off + size])
        if kind == FINISHED:
            size, at = varint(payload, 1)
            end = at + size
            while at < end:
                tag, at = varint(payload, at)
                kind = tag & 7
                if tag == (4 << 3 | 1):
                    payload[at] ^= 0xFF
                if kind == 0:
                    _, at = varint(payload, at)
                elif kind == 1:
                    at += 8
                elif kind == 2:
                    length, at = varint(payload, at)
                    at += length
                else:
                    at += 4
        head = struct.pack("<III", n, seq, crc32c(payload))
        out += head + struct.pack("<I", crc32c(head)) + payload
    return bytes(out)


def measured(study):
    """(configuration, status, step time) of each row of a study's trials.csv."""
    rows = csv.DictReader(open(os.path.join(study, "trials.csv")))
    return [(tuple(r[k] for k in CONFIG), r["status"], r["step_time_s"]) for r in rows]


def main():
    a = fault_args.parse()

    def run(*args):
        return subprocess.run([a.bin, *args], capture_output=True, text=True, cwd=a.work)

    model = ["--model", "llama2-7b", "--gpu", "a100-80gb", "--nnodes", "1", "--nproc-per-node",
             "8", "--global-batch-size", "32", "--seq-length", "4096"]
    r = run("make-replay-table", *model, "--output", "t.csv", "--truth-seed", "3")
    if r.returncode != 0:
        sys.exit("make-replay-table failed: " + r.stderr)
    tune = ["tune", "--backend", "replay", "--replay-table", "t.csv", *model, "--seed", "5",
            "--min-measured", "8", "--quiet"]

    # ---- 1. the reference ----
    r = run(*tune, "--study", "ref")
    if r.returncode != 0:
        sys.exit(f"reference run failed ({r.returncode}): {r.stderr}")
    ref = os.path.join(a.work, "ref")
    good = open(os.path.join(ref, "journal"), "rb").read()
    want = measured(ref)

    # ---- 2. one bit of a result in the middle ----
    fs = frames(good)
    finished = [i for i, (_, _, kind) in enumerate(fs) if kind == FINISHED]
    lost = finished[len(finished) // 2]
    lost_trial = finished.index(lost)  # 0-based row of trials.csv
    offset, size, _ = fs[lost]
    damaged = bytearray(good)
    damaged[offset + FRAME_HEADER + size // 2 - 8] ^= 0x08
    study = os.path.join(a.work, "damaged")
    shutil.copytree(ref, study)
    journal = os.path.join(study, "journal")
    open(journal, "wb").write(damaged)
    follow = len(fs) - lost - 1
    message = f"corrupt at record {lost}, offset {offset}"

    r = run(*tune, "--study", "damaged", "--resume")
    check(r.returncode == 4, f"tune --resume of a corrupt journal exits 4: {r.returncode} {r.stderr}")
    check(message in r.stderr, f"tune names the record and offset ({message}): {r.stderr}")
    check(f"{follow} valid records follow" in r.stderr and "--salvage" in r.stderr,
          f"tune says how many valid records follow and how to keep them: {r.stderr}")
    check(open(journal, "rb").read() == damaged, "tune --resume left the journal unchanged")
    r = run("report", "--study", "damaged")
    check(r.returncode == 4 and message in r.stderr, f"report exits 4 naming it: {r.stderr}")
    check(open(journal, "rb").read() == damaged, "report left the journal unchanged")

    # ---- 3. salvage ----
    r = run(*tune, "--study", "damaged", "--resume", "--salvage")
    check(r.returncode == 0, f"--resume --salvage finishes the study: {r.returncode} {r.stderr}")
    check("salvaged" in r.stderr and message in r.stderr, f"salvage says what it did: {r.stderr}")
    copy = os.path.join(study, "journal.corrupt-1")
    check(os.path.exists(copy) and open(copy, "rb").read() == damaged,
          "the damaged journal was copied aside as journal.corrupt-1")
    got = measured(study)
    kept = [t for i, t in enumerate(want) if i != lost_trial]
    check(all(t in got for t in kept),
          f"every trial of a valid record is kept: missing {[t for t in kept if t not in got]}")
    check(any(t[0] == want[lost_trial][0] for t in got),
          f"the damaged trial ran again: {want[lost_trial][0]}")
    check(os.path.exists(os.path.join(study, "result.json")), "result.json written")
    r = run(*tune, "--study", "damaged", "--resume")
    check(r.returncode == 0, f"a plain --resume of the salvaged study: {r.returncode} {r.stderr}")
    check(measured(study) == got, "resuming the finished salvaged study changes nothing")
    r = run("report", "--study", "damaged")
    check(r.returncode == 0 and "finished" in r.stdout, f"report of the salvaged study: {r.stderr}")

    # ---- 4. a whole frame lost ----
    gap = good[:fs[lost][0]] + good[fs[lost][0] + fs[lost][1]:]
    shutil.rmtree(study)
    shutil.copytree(ref, study)
    open(journal, "wb").write(gap)
    r = run(*tune, "--study", "damaged", "--resume")
    check(r.returncode == 4 and re.search(rf"corrupt at record {lost}, offset {offset} \(record "
                                          rf"{lost} missing", r.stderr),
          f"a gap is corruption: {r.returncode} {r.stderr}")
    check(open(journal, "rb").read() == gap, "the journal with a gap is left unchanged")
    r = run(*tune, "--study", "damaged", "--resume", "--salvage")
    check(r.returncode == 0, f"--salvage of a gap: {r.returncode} {r.stderr}")

    # ---- 5. --salvage alone ----
    r = run(*tune, "--study", "ref", "--salvage")
    check(r.returncode == 2 and "--salvage" in r.stderr, f"--salvage needs --resume: {r.stderr}")

    # ---- 6. a study begun by another build ----
    cut = fs[finished[len(finished) // 2]]
    begun = other_build(good[:cut[0] + cut[1]])  # interrupted after a result in the middle
    shutil.rmtree(study)
    shutil.copytree(ref, study)
    for name in ("trials.csv", "result.json"):  # the outputs come from the resumed run alone
        os.remove(os.path.join(study, name))
    open(journal, "wb").write(begun)
    r = run(*tune, "--study", "damaged", "--resume")
    check(r.returncode == 0, f"resuming another build's study: {r.returncode} {r.stderr}")
    check("does not replay at trial 1: the state digest differs" in r.stderr and
          "replayed as observations" in r.stderr, f"the resume says what it did: {r.stderr}")
    got = measured(study)
    begun_trials = want[:len(finished) // 2 + 1]
    check(got[:len(begun_trials)] == begun_trials,
          f"every trial of the other build is kept, in order: {got[:len(begun_trials)]}")
    check(os.path.exists(os.path.join(study, "result.json")), "the study finished")

    if FAILURES:
        sys.exit(f"{len(FAILURES)} checks failed")
    print(f"corrupt record {lost} of {len(fs)} refused (exit 4, file unchanged); salvage kept "
          f"{len(kept)} trials and re-ran 1; a gap refused and salvaged")


if __name__ == "__main__":
    main()
