#!/usr/bin/env python3
"""Issue 17's hostile inputs, each through the binary: every one must end within 10 s with the
exit code of docs/cli.md §10 (2 bad input, 3 infeasible), a message naming the flag or field (and
the bound or the allowed values), no signal, and no negative or non-finite number printed.

  hostile_input_test.py --bin autopar-tune --work DIR [--source DIR]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

FAILURES = []
DEADLINE_S = 10


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what)


NEGATIVE = re.compile(r"(?<![\w.\-])-\d")
NONFINITE = re.compile(r"\b(nan|inf|infinity)\b", re.IGNORECASE)


def expect(a, name, args, code, *needles, stdin=None):
    """Runs `autopar-tune ARGS` and checks the exit code, the message and what was printed."""
    start = time.monotonic()
    try:
        r = subprocess.run([a.bin, *args], capture_output=True, text=True, cwd=a.work,
                           timeout=DEADLINE_S, input=stdin)
    except subprocess.TimeoutExpired:
        check(False, f"{name}: still running after {DEADLINE_S} s")
        return None
    took = time.monotonic() - start
    text = r.stdout + r.stderr
    check(r.returncode >= 0, f"{name}: ended by signal {-r.returncode}: {r.stderr[-400:]}")
    check(r.returncode == code,
          f"{name}: exit {r.returncode}, expected {code}: {r.stderr.strip()[-400:]}")
    for needle in needles:
        check(needle in r.stderr, f"{name}: the message lacks '{needle}': {r.stderr.strip()[-400:]}")
    check(not NEGATIVE.search(r.stdout), f"{name}: a negative number on stdout: {r.stdout[:400]}")
    # Non-finite words only count where the input did not spell them itself.
    given = " ".join(args).lower()
    for m in NONFINITE.finditer(text):
        if m.group(0).lower() not in given:
            check(False, f"{name}: '{m.group(0)}' printed: {text[:400]}")
            break
    print(f"{name}: exit {r.returncode} in {took:.2f} s: {r.stderr.strip().splitlines()[-1:]}")
    return r


def write(a, name, text):
    path = os.path.join(a.work, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def hf_config(a, name, source, **changes):
    with open(os.path.join(a.source, "tests", "data", "spec", source)) as f:
        cfg = json.load(f)
    cfg.update(changes)
    return write(a, name, json.dumps(cfg))


JOB = ["--gpu", "a100-80gb", "--nnodes", "1", "--nproc-per-node", "8",
       "--global-batch-size", "32", "--seq-length", "2048"]
YAML_MODEL = ("name: hostile\nnum_layers: {layers}\nhidden_size: 64\nffn_hidden_size: 256\n"
              "num_attention_heads: 4\nvocab_size: 256\nmax_position_embeddings: 2048\n")


def overflow_cases(a):
    """Sizes that overflowed 32- and 64-bit arithmetic (issue 17, signed overflow)."""
    model = write(a, "layers.yaml", YAML_MODEL.format(layers=2147483648))
    expect(a, "yaml num_layers 2^31", ["plan", "--model", model, *JOB], 2, "num_layers",
           "at most 100000")
    cfg = hf_config(a, "layers.config.json", "llama-2-7b-hf.config.json",
                    num_hidden_layers=1099511627776)
    expect(a, "hf num_hidden_layers 2^40", ["plan", "--model", cfg, *JOB], 2, "num_layers",
           "at most 100000")
    expect(a, "--num-layers 2^31", ["plan", "--model", "llama2-7b", "--num-layers", "2147483648",
                                    *JOB], 2, "--num-layers", "at most 100000")
    expect(a, "--hidden-size 2^31", ["plan", "--model", "llama2-7b", "--hidden-size",
                                     "2147483648", *JOB], 2, "--hidden-size", "at most")
    expect(a, "--hidden-size 2^62 from scratch",
           ["plan", "--num-layers", "2", "--hidden-size", "4611686018427387904",
            "--num-attention-heads", "2", "--vocab-size", "128", *JOB], 2, "--hidden-size")
    cfg = hf_config(a, "qlora.config.json", "deepseek-v3.config.json",
                    q_lora_rank=9223372036854775807)
    expect(a, "hf q_lora_rank 2^63-1", ["plan", "--model", cfg, *JOB], 2, "q_lora_rank",
           "at most")
    cfg = hf_config(a, "shared.config.json", "deepseek-v3.config.json",
                    n_shared_experts=4611686018427387904)
    expect(a, "hf n_shared_experts 2^62", ["plan", "--model", cfg, *JOB], 2, "n_shared_experts")
    expect(a, "--q-lora-rank 2^63-1", ["plan", "--model", "deepseek-v3", "--q-lora-rank",
                                       "9223372036854775807", *JOB], 2, "--q-lora-rank")
    expect(a, "--nproc-per-node 2^63-1",
           ["plan", "--model", "llama2-7b", "--gpu", "a100-80gb", "--global-batch-size", "32",
            "--nproc-per-node", "9223372036854775807"], 2, "nproc-per-node")
    expect(a, "--nnodes 2^63 (out of range)",
           ["plan", "--model", "llama2-7b", "--gpu", "a100-80gb", "--global-batch-size", "32",
            "--nnodes", "9223372036854775808"], 2, "--nnodes")
    expect(a, "--make-vocab-size-divisible-by 2^62 x tp 2^62",
           ["plan", "--megatron-args",
            "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --vocab-size 100 "
            "--make-vocab-size-divisible-by 4611686018427387904 "
            "--tensor-model-parallel-size 4611686018427387904", *JOB], 2, "--")


def division_cases(a):
    """Parallel sizes that truncated to 0 (SIGFPE) or wrapped negative."""
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                 "--context-parallel-size", "--expert-model-parallel-size"):
        expect(a, f"pasted {flag} 2^62",
               ["plan", "--model", "llama2-7b", *JOB, "--megatron-args",
                f"{flag} 4611686018427387904"], 2, flag)
        expect(a, f"predict {flag} 2^32",
               ["predict", "--model", "llama2-7b", *JOB, flag, "4294967296"], 2, flag)
    expect(a, "--config tp*pp*cp*up past 2^64",
           ["predict", "--model", "llama2-7b", *JOB, "--config",
            "tp=65536,pp=65536,cp=65536,up=65536"], 2, "--config")
    expect(a, "--hierarchical-context-parallel-sizes past 2^63",
           ["plan", "--model", "llama2-7b", *JOB, "--megatron-args",
            "--context-parallel-size 8 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes "
            + " ".join(["65536"] * 6)], 2, "--hierarchical-context-parallel-sizes")


def replay_cases(a):
    """Replay tables: a repeated column, absurd and non-finite measurements."""
    model = ["--model", "tiny-gpt", "--gpu", "cpu", "--nnodes", "1", "--nproc-per-node", "2",
             "--global-batch-size", "4", "--seq-length", "64"]
    r = subprocess.run([a.bin, "make-replay-table", *model, "--output", "t.csv"],
                       capture_output=True, text=True, cwd=a.work)
    check(r.returncode == 0, f"make-replay-table: {r.stderr}")
    with open(os.path.join(a.work, "t.csv")) as f:
        lines = f.read().splitlines()
    header = lines[0].split(",")
    tune = ["tune", "--backend", "replay", *model, "--quiet", "--max-trials", "3"]
    wide = ",".join(["tp"] * 2000 + header) + "\n" + "\n".join(lines[1:]) + "\n"
    write(a, "wide.csv", wide)
    expect(a, "replay header with tp 2000 times",
           [*tune, "--replay-table", "wide.csv", "--study", "s-wide"], 2, "--replay-table",
           "'tp'", "twice")
    short = lines[0] + "\n" + ",".join(lines[1].split(",")[:5]) + "\n"
    write(a, "short.csv", short)
    expect(a, "replay row short of cells",
           [*tune, "--replay-table", "short.csv", "--study", "s-short"], 2, "--replay-table",
           "cells")
    ok_row = next(i for i, l in enumerate(lines) if l.split(",")[header.index("status")] == "ok")
    for column in ("step_time_s", "peak_memory_gib"):
        for value in ("1e308", "inf", "nan", "-1", "1e-300"):
            cells = lines[ok_row].split(",")
            cells[header.index(column)] = value
            bad = lines[:ok_row] + [",".join(cells)] + lines[ok_row + 1:]
            name = f"bad-{column}-{value}.csv"
            write(a, name, "\n".join(bad) + "\n")
            expect(a, f"replay {column} {value}",
                   [*tune, "--replay-table", name, "--study", f"s-{column}-{value}"], 2,
                   "--replay-table", f":{ok_row + 1}: column {column}")


def bound_cases(a):
    """Flags past their type or a stated limit, and work refused before it starts."""
    model = ["--model", "tiny-gpt", "--gpu", "cpu", "--nnodes", "1", "--nproc-per-node", "2",
             "--global-batch-size", "4", "--seq-length", "64"]
    tune = ["tune", "--backend", "replay", "--replay-table", "t.csv", *model, "--quiet"]
    expect(a, "--stop-draws 2^31", [*tune, "--study", "s-draws", "--stop-draws", "2147483648"], 2,
           "--stop-draws", "1000000")
    for port in ("4294967297", "4294967296", "65536", "-2"):
        expect(a, f"--status-port {port}", [*tune, "--study", f"s-port{port}", "--status-port",
                                            port], 2, "--status-port", "65535")
    expect(a, "--seed 2^64", [*tune, "--study", "s-seed", "--seed", "18446744073709551616"], 2,
           "--seed")
    expect(a, "--max-trials 2^63", [*tune, "--study", "s-trials", "--max-trials",
                                    "9223372036854775808"], 2, "--max-trials")
    expect(a, "--top 2^40", ["plan", *model, "--top", "1099511627776"], 2, "--top")
    expect(a, "--max-mbs 2^32", ["plan", *model, "--max-mbs", "4294967296"], 2, "--max-mbs")
    expect(a, "--moe-layer-freq [0]*1e9",
           ["plan", "--model", "mixtral-8x7b", *JOB, "--moe-layer-freq", "[0]*1000000000"], 2,
           "--moe-layer-freq", "100000")
    expect(a, "--moe-layer-freq [0]*2^62*2^62",
           ["plan", "--model", "mixtral-8x7b", *JOB, "--moe-layer-freq",
            "[0]*4611686018427387904+[1]*4611686018427387904"], 2, "--moe-layer-freq")
    keys = "".join(f"k{i}: {i}\n" for i in range(10 * 1024 * 1024 // 12))
    model_yaml = write(a, "keys.yaml", YAML_MODEL.format(layers=2) + keys)
    expect(a, "10 MB YAML key list", ["plan", "--model", model_yaml, *JOB], 2, "--model",
           "MiB")
    cfg = json.load(open(os.path.join(a.source, "tests/data/spec/llama-2-7b-hf.config.json")))
    for i in range(10 * 1024 * 1024 // 16):
        cfg[f"key{i}"] = i
    big = write(a, "keys.config.json", json.dumps(cfg))
    expect(a, "10 MB config.json key list", ["plan", "--model", big, *JOB], 2, "--model", "MiB")
    for knob in (["--noise", "1e14"], ["--memory-noise", "1e14"], ["--noise", "2"],
                 ["--compute-range", "1e-300,1e300"], ["--comm-range", "1e300,1e300"],
                 ["--memory-scale-range", "1e-300,1e300"]):
        expect(a, f"make-replay-table {' '.join(knob)}",
               ["make-replay-table", *model, *knob, "--output", "knob.csv"], 2, knob[0])
        check(not os.path.exists(os.path.join(a.work, "knob.csv")), f"{knob}: a table was written")
    expect(a, "make-replay-table of times past 1e6 s",
           ["make-replay-table", "--model", "llama2-7b", "--gpu", "a100-80gb", "--nnodes", "1",
            "--nproc-per-node", "8", "--global-batch-size", "1048576", "--seq-length", "4096",
            "--compute-range", "1000,1000", "--output", "knob.csv"], 2, "outside what a replay")
    check(not os.path.exists(os.path.join(a.work, "knob.csv")), "a table past 1e6 s was written")
    cfg = hf_config(a, "noexperts.config.json", "mixtral-8x7b-v0.1.config.json",
                    num_local_experts=0)
    expect(a, "hf num_local_experts 0", ["plan", "--model", cfg, *JOB], 2, "num_local_experts")
    cfg = hf_config(a, "qwen-noexperts.config.json", "qwen3-30b-a3b.config.json", num_experts=0)
    expect(a, "hf qwen3-moe num_experts 0", ["plan", "--model", cfg, *JOB], 2, "num_experts")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    a = ap.parse_args()
    a.bin = os.path.abspath(a.bin)
    a.work = os.path.abspath(a.work)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    overflow_cases(a)
    division_cases(a)
    replay_cases(a)
    bound_cases(a)
    print(f"{len(FAILURES)} failed")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
