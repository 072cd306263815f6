#!/usr/bin/env python3
"""Predicts every row of shared/calibration/published.csv that the model can express and prints
measured vs predicted in the source's own metric, with the mean absolute percentage error.

One set of per-GPU efficiency constants (src/perf/constants.cc) serves every row; nothing here is
fitted per row. What each row needs beyond the CSV is the software stack of its era, stated once
per source below (Megatron-LM 2020-2022: no flash attention, dropout on, no overlap of the
data-parallel gradient reduction).
"""
import csv
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("AUTOPAR_BIN", os.path.join(ROOT, "build", "autopar-tune"))
CSV = os.environ.get("AUTOPAR_CALIBRATION",
                     os.path.join(ROOT, "..", "shared", "calibration", "published.csv"))

# The Megatron-LM of 2020-2022: unfused attention with dropout, fp16, activations sent between
# stages with scatter/gather.
ERA_2020_2022 = ["--no-flash-attention", "--attention-dropout", "0.1", "--hidden-dropout", "0.1",
                 "--no-overlap-param-gather", "--fp16"]
# Gradient all-reduce: the 2020 README runs used PyTorch DDP (--DDP-impl torch, the default then),
# which overlaps it with the backward pass; the 2021-2022 papers used Megatron's local DDP, which
# all-reduces after the backward pass.
NO_OVERLAP = {"NARAYANAN21_T1", "KORTHIKANTI22_T4", "KORTHIKANTI22_T5"}


def gpu_of(row):
    g = row["gpu"]
    if "V100" in g:
        return os.path.join(ROOT, "scripts", "data", "v100-dgx2.yaml"), 16
    if "80GB" in g:
        return "a100-80gb", 8
    return "a100-40gb", 8  # the DGX-A100 of 2020 carried A100-40GB


def nodes_of(row, gpus_per_node):
    m = re.match(r"(\d+)x(\d+)", row["nodes_x_gpn"])
    if m:
        return int(m.group(1)), int(m.group(2))
    n = int(row["num_gpus"])
    return max(1, n // gpus_per_node), min(n, gpus_per_node)


def recompute_of(row):
    r = row["recompute"].strip().lower()
    if r.startswith("full"):
        return "full"
    if r.startswith("selective"):
        return "selective"
    if r.startswith("none"):
        return "none"
    # Megatron README 2020: not stated, but its TFLOP/s match the 96·B·s·l·h² formula, which
    # counts the recomputed forward: activation checkpointing was on.
    return "full"


def hw_flops(row, recompute_factor=4):
    """Narayanan et al. 2021 eq. (3): FLOPs per iteration including the recomputed forward."""
    B, s, l, h, V = (int(row[k]) for k in ("gbs", "seq_len", "layers", "hidden", "vocab"))
    return 24 * recompute_factor * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def predict(row):
    gpu, gpn = gpu_of(row)
    nnodes, gpn = nodes_of(row, gpn)
    tp, pp = int(row["tp"] or 1), int(row["pp"] or 1)
    dp = int(row["dp"] or 1)
    gbs = int(row["gbs"])
    mbs = int(row["mbs"]) if row["mbs"] else gbs // dp
    vpp = int(row["vpp"]) if row["vpp"] else 1
    sp = "on" if row["sp"].strip().lower() == "on" else "off"
    spec = (f"tp={tp},pp={pp},dp={dp},vpp={vpp},mbs={mbs},sp={sp},"
            f"recompute={recompute_of(row)}")
    cmd = [BIN, "predict", "--format", "json", "--gpu", gpu, "--nnodes", str(nnodes),
           "--nproc-per-node", str(gpn), "--num-layers", row["layers"],
           "--hidden-size", row["hidden"], "--num-attention-heads", row["heads"],
           "--ffn-hidden-size", row["ffn"], "--vocab-size", row["vocab"],
           "--seq-length", row["seq_len"], "--max-position-embeddings", row["seq_len"],
           "--global-batch-size", str(gbs), "--config", spec] + ERA_2020_2022
    if row["source_key"] in NO_OVERLAP:
        cmd.append("--no-overlap-grad-reduce")
    out = subprocess.run(cmd, capture_output=True, text=True)
    # Exit 3: the model says the configuration does not fit; its estimate is printed all the same
    # (the published runs did fit, so the time is still compared).
    if out.returncode not in (0, 3):
        raise RuntimeError(f"{' '.join(cmd)}\n{out.stderr}")
    return json.loads(out.stdout)["configs"][0], spec


def main():
    rows = list(csv.DictReader(open(CSV)))
    errors = []
    print(f"{'id':6} {'source':22} {'model':14} {'config':62} {'metric':>16} "
          f"{'measured':>9} {'predicted':>9} {'error':>7}")
    for row in rows:
        try:
            est, spec = predict(row)
        except RuntimeError as e:
            print(f"{row['id']:6} skipped: {e}", file=sys.stderr)
            continue
        key = row["source_key"]
        measured = float(row["metric_value"])
        step = est["step_time_s"]
        if key == "NARAYANAN21_T1":
            predicted, metric = hw_flops(row) / step / int(row["num_gpus"]) / 1e12, "TFLOP/s/GPU"
        elif key == "KORTHIKANTI22_T4":
            b = est["breakdown"]
            predicted, metric = 1e3 * (b["layer_forward_s"] + b["layer_backward_s"]), "layer ms"
        elif key == "KORTHIKANTI22_T5":
            predicted, metric = step, "iteration s"
        elif key == "MEGATRON_README_2020":
            predicted, metric = 1e3 * step, "iteration ms"
        else:
            continue
        err = (predicted - measured) / measured
        errors.append(abs(err))
        print(f"{row['id']:6} {key:22} {row['model'][:14]:14} {spec:62} {metric:>16} "
              f"{measured:9.2f} {predicted:9.2f} {100 * err:+6.1f}%")
    print(f"\nrows predicted: {len(errors)} of {len(rows)}")
    print(f"MAPE: {100 * statistics.mean(errors):.1f}%   median APE: "
          f"{100 * statistics.median(errors):.1f}%   max APE: {100 * max(errors):.1f}%")
    target = float(os.environ.get("AUTOPAR_MAPE_TARGET", "10"))
    return 0 if 100 * statistics.mean(errors) <= target else 1


if __name__ == "__main__":
    sys.exit(main())
