#!/usr/bin/env python3
"""The live status endpoint under load (issue: overnight search): a replay-backend search runs
with --status-port; while it runs this test reads /status and /metrics over loopback and sends
malformed and oversized requests. The search must finish with the same result.json as the same
search without the endpoint (wall-clock fields aside), and every response must be well-formed.
"""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time


def exchange(port, payload, timeout=5):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    if not chunks:
        # Accepted, then closed unanswered: the server is shutting down with the search.
        raise ConnectionError("closed without a response")
    return b"".join(chunks)


def comparable(study):
    r = json.load(open(os.path.join(study, "result.json")))
    for key in ("timing", "study"):
        r.pop(key, None)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    # scripts/sanitize.sh runs a shorter search under ThreadSanitizer.
    ap.add_argument("--max-trials", default="3000")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    table = os.path.join(a.work, "table.csv")
    model = ["--model", "gpt3-175b", "--gpu", "a100-80gb", "--nnodes", "16",
             "--nproc-per-node", "8", "--global-batch-size", "1536", "--seq-length", "2048"]
    subprocess.run([a.bin, "make-replay-table", *model, "--output", table, "--truth-seed", "7"],
                   check=True, capture_output=True)
    # The random searcher over the whole table: long enough (hundreds of fsynced trials) to be
    # watched, and as deterministic as Thompson sampling given the seed.
    search = [a.bin, "tune", "--backend", "replay", "--replay-table", table, *model, "--seed", "3",
              "--searcher", "random", "--max-trials", a.max_trials, "--quiet", "--format", "json"]

    plain = os.path.join(a.work, "plain")
    subprocess.run(search + ["--study", plain], check=True, capture_output=True)

    watched = os.path.join(a.work, "watched")
    proc = subprocess.Popen(search + ["--study", watched, "--status-port", "0"],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    port = None
    for line in proc.stderr:
        m = re.search(r"status at http://127\.0\.0\.1:(\d+)/", line)
        if m:
            port = int(m.group(1))
            break
    assert port, "the tuner did not announce its status endpoint"
    polls, bad = 0, 0
    statuses = []
    while proc.poll() is None:
        try:
            r = exchange(port, b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
            head, _, body = r.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            statuses.append(json.loads(body))
            m = exchange(port, b"GET /metrics HTTP/1.0\r\n\r\n")
            assert b"autopar_trials_done" in m, m[:200]
            assert exchange(port, b"BOGUS\r\n\r\n").startswith(b"HTTP/1.1 400")
            assert exchange(port, b"GET /status HTTP/1.1\r\nX: " + b"a" * 20000 +
                            b"\r\n\r\n").startswith(b"HTTP/1.1 413")
            assert exchange(port, b"DELETE /status HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
            assert exchange(port, b"\x00\xff\xfe garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
            polls += 1
        except (ConnectionError, socket.timeout, OSError):
            # The server closes when the search ends, before the process writes its outputs.
            bad += 1
            if polls > 0:
                break
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert polls >= 1, "the search ended before the endpoint could be read"
    done = [s["trials_done"] for s in statuses]
    assert done == sorted(done), f"trials_done went backwards: {done}"
    for s in statuses:
        for key in ("trials_done", "in_flight", "best", "predicted_best", "stop", "elapsed_s",
                    "budget_left_s"):
            assert key in s, f"/status lacks {key}: {s}"
    assert comparable(plain) == comparable(watched), "the endpoint changed the search result"
    print(f"{polls} rounds of queries during the search ({len(statuses)} /status reads, "
          f"last trials_done {done[-1] if done else 0}); result unchanged")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
