#!/usr/bin/python3
"""Plots of a study (autopar-tune report --plot): writes PNGs into PLOTS_DIR (STUDY/plots/).

  plot_study.py STUDY [REPORT_DIR [PLOTS_DIR]]

  step_time.png   measured step time per trial, failures marked, best so far
  predicted.png   predicted vs measured step time, with the posterior's ±2σ interval
  memory.png      measured and predicted peak memory per trial against the budget
  breakdown.png   the analytic time breakdown of the top configurations

Reads what `autopar-tune report` writes into REPORT_DIR (its --output, STUDY/report/ by default:
trials.csv, summary.json, breakdown.csv) and, when the study finished, STUDY/result.json for the
posterior's noise.
Uses Debian's python3-matplotlib.
"""
import csv
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def num(s):
    try:
        v = float(s)
        return v if math.isfinite(v) else None
    except (TypeError, ValueError):
        return None


def main(study, report, out):
    trials = list(csv.DictReader(open(os.path.join(report, "trials.csv"))))
    result = json.load(open(os.path.join(report, "summary.json")))
    finished = os.path.join(study, "result.json")
    if os.path.exists(finished):
        result["posterior"] = json.load(open(finished)).get("posterior", {})
    os.makedirs(out, exist_ok=True)
    idx = [int(t["trial"]) for t in trials]
    ok = [t["status"] == "ok" for t in trials]
    measured = [num(t["step_time_s"]) for t in trials]
    predicted = [num(t["predicted_step_time_s"]) for t in trials]
    written = []

    # 1. Measured step time per trial and the best so far.
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [i for i, m, o in zip(idx, measured, ok) if o and m is not None]
    ys = [m for m, o in zip(measured, ok) if o and m is not None]
    ax.scatter(xs, ys, s=18, label="measured (ok)")
    fails = [i for i, o in zip(idx, ok) if not o]
    if fails:
        top = max(ys) if ys else 1.0
        ax.scatter(fails, [top * 1.05] * len(fails), marker="x", color="tab:red",
                   label="failed (oom, timeout, ...)")
    best, best_line = math.inf, []
    for m, o in zip(measured, ok):
        if o and m is not None:
            best = min(best, m)
        best_line.append(best if math.isfinite(best) else None)
    ax.step(idx, best_line, where="post", color="black", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel("step time (s)")
    ax.set_title(f"{result.get('model', '')}: step time per trial "
                 f"({result.get('state', '?')})", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "step_time.png"), dpi=110)
    written.append("step_time.png")

    # 2. Predicted vs measured with the posterior's interval (relative noise sd).
    sd = result.get("posterior", {}).get("relative_noise_sd", 0.0) or 0.0
    pairs = [(p, m) for p, m, o in zip(predicted, measured, ok) if o and p and m]
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    if pairs:
        ps, ms = zip(*pairs)
        ax.errorbar(ps, ms, xerr=[2 * sd * p for p in ps], fmt="o", ms=4, alpha=0.8,
                    label=f"trials (±2σ, σ = {100 * sd:.1f}% of the prediction)")
        lo, hi = min(ps + ms) * 0.9, max(ps + ms) * 1.1
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="measured = predicted")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xlabel("predicted step time at proposal (s)")
    ax.set_ylabel("measured step time (s)")
    ax.set_title("posterior prediction vs measurement")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "predicted.png"), dpi=110)
    written.append("predicted.png")

    # 3. Memory against the budget.
    fig, ax = plt.subplots(figsize=(8, 4.5))
    mem = [num(t["peak_memory_gib"]) for t in trials]
    pmem = [num(t["predicted_memory_gib"]) for t in trials]
    ax.scatter([i for i, m in zip(idx, mem) if m], [m for m in mem if m], s=18,
               label="measured peak")
    ax.scatter([i for i, m in zip(idx, pmem) if m], [m for m in pmem if m], s=14, marker="^",
               alpha=0.6, label="predicted peak")
    oom = [i for i, t in zip(idx, trials) if t["status"] == "oom"]
    budget = result.get("device_memory_gib")
    if budget:
        ax.axhline(budget, color="tab:red", lw=1, label=f"budget {budget:.1f} GiB")
    if oom:
        ax.scatter(oom, [budget or max(m for m in pmem if m)] * len(oom), marker="x",
                   color="tab:red", label="oom")
    peaks = [m for m in mem + pmem if m]
    if budget and peaks and max(peaks) < budget / 20:
        ax.set_yscale("log")  # a budget far above the peaks would flatten them to a line
    ax.set_xlabel("trial")
    ax.set_ylabel("peak memory per rank (GiB)")
    ax.set_title("memory vs budget")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "memory.png"), dpi=110)
    written.append("memory.png")

    # 4. Time breakdown of the top configurations (analytic model, seconds per step).
    path = os.path.join(report, "breakdown.csv")
    rows = list(csv.DictReader(open(path))) if os.path.exists(path) else []
    if rows:
        parts = [k for k in rows[0].keys()
                 if k not in ("rank", "config", "measured_step_time_s", "measurements",
                              "recommended")]
        parts = [p for p in parts if any(num(r[p]) for r in rows)]
        fig, ax = plt.subplots(figsize=(9, 0.6 * len(rows) + 2))
        left = [0.0] * len(rows)
        for p in parts:
            vals = [num(r[p]) or 0.0 for r in rows]
            ax.barh(range(len(rows)), vals, left=left, label=p)
            left = [a + b for a, b in zip(left, vals)]
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([f"#{r['rank']} " + r["config"].replace(",cp=1,up=1,ep=1", "")
                            for r in rows], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("analytic model, nominal efficiencies (seconds per step)")
        ax.set_title("time breakdown of the top configurations")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "breakdown.png"), dpi=110)
        written.append("breakdown.png")
    for w in written:
        print(os.path.join(out, w))


if __name__ == "__main__":
    if not 2 <= len(sys.argv) <= 4:
        sys.exit("usage: plot_study.py STUDY_DIR [REPORT_DIR [PLOTS_DIR]]")
    study_dir = sys.argv[1]
    report_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(study_dir, "report")
    main(study_dir, report_dir,
         sys.argv[3] if len(sys.argv) > 3 else os.path.join(study_dir, "plots"))
