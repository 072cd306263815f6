#!/usr/bin/env python3
"""Issue 17: the study's result files are written whatever the status endpoint suffers. A
replay-backend search runs with --status-port under `ulimit -n 256` while this test holds 600
idle loopback connections to the endpoint, renewing them until it ends; the search must exit 0 and write result.json,
trials.csv and best.args (before the connection cap, the server took every descriptor and the
tuner exited 1: "create .../result.json.tmp: Too many open files").
"""
import collections
import os
import re
import resource
import socket
import subprocess
import sys
import time

import fault_args

DESCRIPTORS = 256
IDLE = 600


def main():
    a = fault_args.parse()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < IDLE + 64:
        print(f"skipped: this test holds {IDLE} connections, the hard limit is {hard}")
        return
    # This process holds the idle connections: raise its own soft limit as far as it may go.
    target = hard if hard != resource.RLIM_INFINITY else max(soft, IDLE + 64)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))

    table = os.path.join(a.work, "table.csv")
    model = ["--model", "gpt3-175b", "--gpu", "a100-80gb", "--nnodes", "16",
             "--nproc-per-node", "8", "--global-batch-size", "1536", "--seq-length", "2048"]
    subprocess.run([a.bin, "make-replay-table", *model, "--output", table, "--truth-seed", "7"],
                   check=True, capture_output=True)
    study = os.path.join(a.work, "flooded")
    search = [a.bin, "tune", "--backend", "replay", "--replay-table", table, *model, "--seed", "3",
              "--searcher", "random", "--max-trials", "1500", "--quiet", "--study", study,
              "--status-port", "0"]

    def few_descriptors():
        resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTORS, DESCRIPTORS))

    proc = subprocess.Popen(search, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            preexec_fn=few_descriptors)
    port, seen = None, []
    for line in proc.stderr:
        seen.append(line)
        m = re.search(r"status at http://127\.0\.0\.1:(\d+)/", line)
        if m:
            port = int(m.group(1))
            break
    assert port, "the tuner did not announce its status endpoint: " + "".join(seen)
    # Idle connections, kept at IDLE open for as long as the search runs: the oldest are
    # replaced by new ones every 20 ms, so the endpoint is flooded when the search writes its
    # result files, whatever the server's idle timeout.
    idle, made = collections.deque(), 0
    try:
        while proc.poll() is None:
            while len(idle) > IDLE - 30:
                idle.popleft().close()
            while len(idle) < IDLE and proc.poll() is None:
                s = socket.socket()
                s.settimeout(5)
                try:
                    s.connect(("127.0.0.1", port))
                except OSError:
                    s.close()
                    break  # the search ended and the endpoint with it
                idle.append(s)
                made += 1
            time.sleep(0.02)
        out, err = proc.communicate(timeout=240)
    finally:
        for s in idle:
            s.close()
    err = "".join(seen) + err
    print(f"{made} idle connections made, {IDLE} held at a time, while the search ran; "
          f"exit {proc.returncode}")
    failures = []
    if made < IDLE:
        failures.append(f"only {made} connections were made before the search ended")
    if proc.returncode != 0:
        failures.append(f"tune exited {proc.returncode}: {err[-600:]}")
    for name in ("result.json", "trials.csv", "best.args"):
        if not os.path.exists(os.path.join(study, name)):
            failures.append(f"{name} was not written")
    if "Too many open files" in err:
        failures.append("descriptors ran out: " + err[-600:])
    for f in failures:
        print("FAIL:", f)
    print(f"{len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
