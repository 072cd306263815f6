#!/usr/bin/env python3
"""Verdicts of scripts/gpu_check.sh: reads what it measured, writes gpu_check.json, prints a table.

  gpu_check_report.py preset GPU_NAME          the GPU preset of an nvidia-smi name ('' if none)
  gpu_check_report.py report --work DIR --gpus N --device NAME [--preset P] --out FILE

DIR holds what gpu_check.sh left there (each optional; a missing or unreadable file is a FAIL of
the checks that need it, never a silent pass):
  ctest_gpu.xml, ctest_bench.xml   JUnit reports of `ctest -L '^gpu$' -LE '^bench$'` and `-L '^bench$'`
  gpu_bench_np<N>.json             tests/gpu/gpu_bench.cc's figures (N = 1: on cuDNN; 2, 8)
  gpu_bench_kernel_np1.json        the same on the CUDA-core attention kernel (no speed targets)
  trial_1gpu.json, plan.json       the llama-7B-shaped trial and `autopar-tune plan` of that job
  trial_1gpu_fp8.json              that trial with --fp8-format hybrid
  trial_1gpu_modules.json          that trial recomputing the layer norms and the MLP too
  trial_1gpu_dropout.json          that trial with Megatron's hidden dropout of 0.1
  trial_1gpu_moe.json              one Mixtral 8x7B layer on one GPU
  trial_1gpu_all.json, trial_1gpu_moe_all.json   those two with all 8 micro-batches run
  trial_<pp|cp|tp>2.json           the 2-GPU trials (trial_*.err: what they printed on stderr)

Targets (the issue's, set for an H100; scaled by the GPU preset's dense bf16 peak over the H100's
989 TFLOP/s on other presets, so H200 and H800 keep them; with no preset for the GPU they are not
applied and the figure reads "no target"):
  attention forward >= 350 TFLOP/s at every sequence length; bf16 GEMM 8192^3 >= 600 TFLOP/s;
  single-GPU trial MFU >= 45% (a ratio, never scaled).
Targets we set (the issue names none):
  attention max error against the double reference: out <= 2e-2, dq/dk/dv <= 3e-2 of max |ref|,
  lse <= 1e-2 absolute (the bf16 tolerances of tests/unit/cuda_attention_test.cc);
  all-reduce bus bandwidth at 1 GiB >= 60% of the preset's NVLink bandwidth per direction;
  every trial ends `ok` (the FP8 one "skipped" where the GPU has no fp8 tensor cores and the
  trial says so); the FP8 trial's step faster than the bf16 one's (speed-up > 1: a trial that
  makes FP8 look slower would rank FP8 configurations wrongly; Transformer Engine gains about
  1.3x on such a model, the analytic model predicts its own figure, both shown); the trial that
  recomputes the layer norms and the MLP too peaks below the bf16 one (core_attn alone); the MoE
  trial's load-balancing loss > 0 (its router ran); the llama-7B-shaped and the MoE trial's step
  extrapolated from 2 of 8 micro-batches within 10% of the step with all 8 run (a session-25
  H200 run read an MoE step 17-23% high that way); the gpu-labelled tests: none fails and more
  run than skip (on a GPU machine a skip for want of a GPU means the tests did not see it); the
  benchmark entries: none fails (those needing more GPUs than there are skip).
Attention backward TFLOP/s and the trials' step time against the model's prediction are reported
with no target ("info"). Exit status 1 when any check is FAIL.
"""
import argparse
import json
import math
import os
import sys
import xml.etree.ElementTree as ET

H100_PEAK_BF16 = 989e12
ATTENTION_FWD_TFLOPS_H100 = 350.0
GEMM_TFLOPS_H100 = 600.0
MFU_TARGET = 0.45
ERROR_TARGETS = {"out": 2e-2, "dq": 3e-2, "dk": 3e-2, "dv": 3e-2, "lse_abs": 1e-2}
BUSBW_FRACTION = 0.6
MULTI_GPU_TRIALS = ("pp2", "cp2", "tp2")
EXTRAPOLATION_TOLERANCE = 0.10


def preset_for(device_name):
    """The GPU preset (src/spec/gpu_presets.yaml) of a device name as nvidia-smi or CUDA print it."""
    n = device_name.upper()
    if "H100" in n:
        # The preset is the SXM part; PCIe and NVL boards have less compute and no NVSwitch.
        return "" if ("PCIE" in n or "NVL" in n) else "h100"
    # Longest names first: "NVIDIA GB200" contains "B200", "NVIDIA GB300" contains "B300".
    for key, preset in (("GB300", "gb300"), ("GB200", "gb200"), ("B300", "b300"), ("H200", "h200"),
                        ("H800", "h800"), ("B200", "b200"), ("A800", "a800")):
        if key in n:
            return preset
    if "A100" in n and "PCIE" not in n:
        return "a100-80gb" if "80GB" in n else "a100-40gb"
    return ""


def check(name, value, target, verdict, unit="", note=""):
    return {"name": name, "value": value, "unit": unit, "target": target, "verdict": verdict,
            "note": note}


def at_least(name, value, minimum, unit, note=""):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return check(name, value, f">= {minimum:.4g} {unit}".strip() if minimum else None, "FAIL",
                     unit, note or "not measured")
    if minimum is None:
        return check(name, value, None, "no target", unit, note)
    return check(name, value, f">= {minimum:.4g} {unit}".strip(),
                 "PASS" if value >= minimum else "FAIL", unit, note)


def at_most(name, value, maximum, unit="", note=""):
    if value is None or not math.isfinite(value):
        return check(name, value, f"<= {maximum:g}", "FAIL", unit, note or "not measured")
    return check(name, value, f"<= {maximum:g}", "PASS" if value <= maximum else "FAIL", unit,
                 note)


def why_not(work, tag, result):
    """Why a trial did not end ok: its status and message, else the error it printed."""
    if result is not None:
        return f"{result.get('status')}: {result.get('message')}"
    try:
        with open(os.path.join(work, f"trial_{tag}.err")) as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "no output"
    said = [line for line in lines if "autopar-tune" in line] or lines
    return said[0][:300] if said else "no output"


def ended_ok(trial):
    """Whether a trial's JSON (None: it printed none) says it ended ok."""
    return trial is not None and trial.get("status") == "ok"


def ends_ok_check(name, work, tag, trial, note=None):
    """`{name}: ends ok`: PASS with the trial's configuration (or `note`), else FAIL saying why."""
    if ended_ok(trial):
        return check(f"{name}: ends ok", "ok", "ok", "PASS", "",
                     trial.get("config", "") if note is None else note)
    return check(f"{name}: ends ok", trial and trial.get("status"), "ok", "FAIL", "",
                 why_not(work, tag, trial))


def load_json(path):
    """The JSON object in `path` (its last line that parses), or None."""
    try:
        with open(path) as f:
            lines = [line for line in f.read().splitlines() if line.strip().startswith("{")]
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def junit_counts(path):
    """(passed, failed, skipped, failed names, skipped names) of a ctest --output-junit file, or
    None."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    passed = failed = skipped = 0
    failed_names, skipped_names = [], []
    for case in root.iter("testcase"):
        status = case.get("status", "run")
        if case.find("failure") is not None or case.find("error") is not None or status == "fail":
            failed += 1
            failed_names.append(case.get("name", "?"))
        elif case.find("skipped") is not None or status in ("notrun", "disabled"):
            skipped += 1
            skipped_names.append(case.get("name", "?"))
        else:
            passed += 1
    return passed, failed, skipped, failed_names, skipped_names


def ctest_checks(work, name, label, most_run):
    """No test fails and, with `most_run`, more ran than skipped: on this GPU machine a test that
    skips for want of a GPU did not see it. (The benchmark entries that need more GPUs than there
    are skip by design; the figure checks say which of them had to run.)"""
    target = "none failed" + (", more run than skipped" if most_run else "")
    counts = junit_counts(os.path.join(work, f"ctest_{name}.xml"))
    if counts is None:
        return [check(f"ctest -L {label}", None, target, "FAIL", "", "no ctest report")]
    passed, failed, skipped, failed_names, skipped_names = counts
    note = f"{passed} passed, {failed} failed, {skipped} skipped"
    if failed_names:
        note += "; failed: " + ", ".join(failed_names[:10])
    if skipped_names:
        note += "; skipped: " + ", ".join(skipped_names[:10]) + (
            ", ..." if len(skipped_names) > 10 else "")
    ok = failed == 0 and (passed > skipped or not most_run)
    return [check(f"ctest -L {label}", {"passed": passed, "failed": failed, "skipped": skipped},
                  target, "PASS" if ok else "FAIL", "tests", note)]


def scale_of(preset):
    """Preset peak over the H100's, or None when there is no preset to scale by."""
    if not preset or not preset.get("peak_flops_bf16"):
        return None
    return preset["peak_flops_bf16"] / H100_PEAK_BF16


def engine_checks(run, engine, targets, scale, where):
    """Attention figures of one gpu_bench run on one attention engine."""
    out = []
    for a in run.get("attention", []):
        if "error" in a:
            out.append(check(f"attention [{engine}]", None, "measured", "FAIL", "", a["error"]))
            continue
        tag = f"attention [{engine}] seq={a['seq']} batch={a['batch']} hq={a['heads_q']} " \
              f"hkv={a['heads_kv']} d={a['head_dim']}"
        if targets:
            out.append(at_least(f"{tag} forward", a.get("forward_tflops"),
                                ATTENTION_FWD_TFLOPS_H100 * scale if scale else None, "TFLOP/s",
                                where))
        else:
            out.append(check(f"{tag} forward", a.get("forward_tflops"), None, "info", "TFLOP/s",
                             "for comparison"))
        out.append(check(f"{tag} backward", a.get("backward_tflops"), None, "info", "TFLOP/s",
                         "no target set; FLOPs = 2.5 x forward"))
    if not run.get("attention"):
        out.append(check(f"attention [{engine}]", None, "measured", "FAIL", "",
                         "no attention figures"))
    err = run.get("attention_error") or {}
    for key, limit in ERROR_TARGETS.items():
        out.append(at_most(f"attention [{engine}] {key} error vs reference", err.get(key), limit,
                           "", err.get("error") or "max |device - ref|"
                           + ("" if key == "lse_abs" else " / max |ref|")
                           + " against kernels/attention.cc in double"))
    return out


def bench_checks(work, gpus):
    out = []
    one = load_json(os.path.join(work, "gpu_bench_np1.json"))
    kernel = load_json(os.path.join(work, "gpu_bench_kernel_np1.json"))
    if one is None or "skipped" in one or "error" in one:
        why = "gpu_bench_np1 did not run" if one is None else \
            f"gpu_bench_np1: {one.get('skipped') or one.get('error')}"
        for figure in ("attention forward", "gemm", "attention error"):
            out.append(check(figure, None, "measured", "FAIL", "", why))
        return out, None
    preset = one.get("preset")
    scale = scale_of(preset)
    where = (f"target for {preset['name']}" + (f" (H100's x {scale:.3f})" if scale != 1 else "")
             if scale else "no GPU preset for this device: targets not applied")
    out += engine_checks(one, one.get("AUTOPAR_ATTENTION") or "auto", True, scale, where)
    if kernel is None or "skipped" in kernel or "error" in kernel:
        out.append(check("attention [kernel]", None, "measured", "FAIL", "",
                         "gpu_bench_kernel_np1 did not run" if kernel is None
                         else kernel.get("skipped") or kernel.get("error")))
    else:
        out += engine_checks(kernel, kernel.get("AUTOPAR_ATTENTION") or "auto", False, scale,
                             where)
    gemm = one.get("gemm") or {}
    out.append(at_least("bf16 GEMM 8192^3", gemm.get("tflops"),
                        GEMM_TFLOPS_H100 * scale if scale else None, "TFLOP/s",
                        gemm.get("error") or where))
    # All-reduce: one figure per world size that ran.
    for n in (2, 8):
        r = load_json(os.path.join(work, f"gpu_bench_np{n}.json"))
        name = f"NCCL all-reduce busbw, {n} GPUs, 1 GiB"
        if gpus < n:
            out.append(check(name, None, None, "skipped", "GB/s", f"{gpus} GPU(s)"))
            continue
        sizes = (r or {}).get("allreduce")
        if r is None or "skipped" in r or "error" in r or not isinstance(sizes, list):
            why = "did not run" if r is None else \
                r.get("skipped") or r.get("error") or (sizes or {}).get("error")
            out.append(check(name, None, "measured", "FAIL", "GB/s", why))
            continue
        biggest = max(sizes, key=lambda s: s.get("bytes", 0))
        nvlink = (r.get("preset") or {}).get("intra_node_bandwidth")
        out.append(at_least(name, biggest.get("busbw_gbps"),
                            BUSBW_FRACTION * nvlink / 1e9 if nvlink else None, "GB/s",
                            f"{BUSBW_FRACTION:.0%} of the preset's NVLink GB/s per direction"
                            if nvlink else "no GPU preset: target not applied"))
    return out, preset


def step_time_check(name, trial):
    """The trial's step time next to the model's prediction (info, no target)."""
    step, predicted = trial["step_time_s"], trial.get("predicted_step_time_s", 0)
    return check(f"{name}: step time", step, None, "info", "s",
                 f"model predicts {predicted:.4f} s (measured / model {step / predicted:.3f})"
                 if predicted > 0 else "no prediction")


def fp8_trial_checks(work, bf16):
    """The 1-GPU trial with --fp8-format hybrid: it ends ok (skipped where the GPU has no fp8) and
    its step is shorter than the bf16 trial's `bf16` (the speed-up, next to the model's)."""
    name = "trial llama-7B-shaped 8 layers, 1 GPU, fp8 hybrid"
    fp8 = load_json(os.path.join(work, "trial_1gpu_fp8.json"))
    ends = ends_ok_check(name, work, "1gpu_fp8", fp8)
    if not ended_ok(fp8):
        why = ends["note"]
        if "has no fp8" in why:  # the trial's refusal (exit 2) on a GPU without fp8
            return [check(f"{name}: ends ok", None, "ok", "skipped", "", why)]
        return [ends, check(f"{name}: speed-up over bf16", None, "> 1", "FAIL", "x", why)]
    out = [ends, step_time_check(name, fp8)]
    step, predicted = fp8["step_time_s"], fp8.get("predicted_step_time_s", 0)
    if not ended_ok(bf16):
        out.append(check(f"{name}: speed-up over bf16", None, "> 1", "FAIL", "x",
                         "the bf16 trial did not end ok"))
        return out
    speedup = bf16["step_time_s"] / step
    bf16_predicted = bf16.get("predicted_step_time_s", 0)
    model = (f"model predicts {bf16_predicted / predicted:.2f}x"
             if predicted > 0 and bf16_predicted > 0 else "no prediction")
    out.append(check(f"{name}: speed-up over bf16", speedup, "> 1",
                     "PASS" if speedup > 1 else "FAIL", "x",
                     f"bf16 {bf16['step_time_s']:.4f} s / fp8 {step:.4f} s; {model}"))
    return out


def peak(trial):
    """A trial's peak over its ranks (GiB), or None."""
    peaks = (trial or {}).get("peak_memory_gib") or []
    return max(peaks) if peaks else None


def feature_trial_checks(work, bf16):
    """The 1-GPU trials of what a trial runs beyond the bf16 layer `bf16`: each ends ok with its
    step time next to the model's; recomputing more modules lowers the peak below `bf16`'s;
    hidden dropout's masks show as peak memory (info, next to the model's); the MoE layer's
    router yields a load-balancing loss."""
    out = []
    features = (("1gpu_modules",
                 "trial llama-7B-shaped, recompute_modules core_attn+layernorm+mlp"),
                ("1gpu_dropout", "trial llama-7B-shaped, hidden dropout 0.1"),
                ("1gpu_moe", "trial mixtral-8x7b-shaped 1 layer, 1 GPU"))
    for tag, name in features:
        t = load_json(os.path.join(work, f"trial_{tag}.json"))
        out.append(ends_ok_check(name, work, tag, t))
        if not ended_ok(t):
            continue
        out.append(step_time_check(name, t))
        own, base = peak(t), peak(bf16 if ended_ok(bf16) else None)
        model = (t.get("predicted_peak_memory_gib", 0)
                 - (bf16 or {}).get("predicted_peak_memory_gib", 0))  # against the bf16 trial
        if tag == "1gpu_modules":
            lower = own is not None and base is not None and own < base
            out.append(check(f"{name}: peak below core_attn alone", own, "< the bf16 trial's",
                             "PASS" if lower else "FAIL", "GiB",
                             f"core_attn alone {base} GiB; the model says {model:+.2f} GiB"))
        elif tag == "1gpu_dropout":
            note = (f"the masks add {own - base:+.3f} GiB; the model says {model:+.3f} GiB"
                    if own is not None and base is not None else "no peak to compare")
            out.append(check(f"{name}: peak", own, None, "info", "GiB", note))
        else:
            aux = t.get("aux_loss")
            out.append(check(f"{name}: load-balancing loss", aux, "> 0",
                             "PASS" if isinstance(aux, (int, float)) and aux > 0 else "FAIL", "",
                             "the router's auxiliary loss, as Megatron's --moe-aux-loss-coeff"))
    return out


def extrapolation_checks(work):
    """Each 1-GPU trial's step from 2 of its job's 8 micro-batches (extrapolated, docs/trial.md
    §9) against the same trial with all 8 run: within EXTRAPOLATION_TOLERANCE."""
    out = []
    for tag, name in (("1gpu", "trial llama-7B-shaped 8 layers, 1 GPU"),
                      ("1gpu_moe", "trial mixtral-8x7b-shaped 1 layer, 1 GPU")):
        check_name = f"{name}: step from 2 of 8 micro-batches / all 8"
        part = load_json(os.path.join(work, f"trial_{tag}.json"))
        full = load_json(os.path.join(work, f"trial_{tag}_all.json"))
        if not (ended_ok(part) and ended_ok(full)):
            failed = (tag, part) if not ended_ok(part) else (f"{tag}_all", full)
            why = why_not(work, *failed)
            out.append(check(check_name, None, f"1 +- {EXTRAPOLATION_TOLERANCE:g}", "FAIL", "x",
                             why))
            continue
        ratio = part["step_time_s"] / full["step_time_s"]
        ok = abs(ratio - 1) <= EXTRAPOLATION_TOLERANCE
        times = part["iteration_times_s"]
        out.append(check(check_name, ratio, f"1 +- {EXTRAPOLATION_TOLERANCE:g}",
                         "PASS" if ok else "FAIL", "x",
                         f"{part['step_time_s']:.4f} s from 2 (iterations {min(times):.3f}-"
                         f"{max(times):.3f}), {full['step_time_s']:.4f} s with all 8"))
    return out


def trial_checks(work, gpus):
    out = []
    trial = load_json(os.path.join(work, "trial_1gpu.json"))
    plan = load_json(os.path.join(work, "plan.json"))
    name = "trial llama-7B-shaped 8 layers, 1 GPU"
    out.append(ends_ok_check(name, work, "1gpu", trial))
    if not ended_ok(trial):
        out.append(check(f"{name}: MFU", None, f">= {MFU_TARGET:.0%}", "FAIL", "",
                         out[-1]["note"]))
    else:
        mfu = None
        note = "no plan output: model FLOPs unknown"
        configs = (plan or {}).get("configs") or []
        if configs and configs[0].get("mfu", 0) > 0:
            # The model's FLOPs per step and the GPU's peak, both independent of the layout, from
            # any configuration the plan rated: tflops_per_gpu = flops / (step * world).
            c = configs[0]
            world = int(plan.get("nnodes", 1)) * int(plan.get("gpus_per_node", 1))
            flops = c["model_tflops_per_gpu"] * 1e12 * c["step_time_s"] * world
            peak = c["model_tflops_per_gpu"] * 1e12 / c["mfu"]
            step, predicted = trial["step_time_s"], trial.get("predicted_step_time_s", 0)
            mfu = flops / (step * world * peak)
            predicted_mfu = flops / (predicted * world * peak) if predicted > 0 else float("nan")
            note = (f"MFU {mfu:.1%} = {flops / 1e12:.1f} TFLOP per step / ({step:.4f} s x {peak / 1e12:.0f} "
                    f"TFLOP/s peak); model predicts {predicted:.4f} s, MFU {predicted_mfu:.1%}")
            out.append(step_time_check(name, trial))
        out.append(check(f"{name}: MFU", mfu, f">= {MFU_TARGET:.0%}",
                         "FAIL" if mfu is None or mfu < MFU_TARGET else "PASS", "", note))
    out += fp8_trial_checks(work, trial)
    out += feature_trial_checks(work, trial)
    out += extrapolation_checks(work)
    for tag in MULTI_GPU_TRIALS:
        name = f"trial {tag[:-1]}=2, 2 GPUs"
        if gpus < 2:
            out.append(check(f"{name}: ends ok", None, "ok", "skipped", "", f"{gpus} GPU"))
            continue
        t = load_json(os.path.join(work, f"trial_{tag}.json"))
        note = None
        if ended_ok(t):
            note = (f"{t.get('config', '')}; step {t['step_time_s']:.4f} s, model "
                    f"{t.get('predicted_step_time_s', 0):.4f} s")
        out.append(ends_ok_check(name, work, tag, t, note))
    return out


def report(args):
    checks = ctest_checks(args.work, "gpu", "'^gpu$' -LE '^bench$'", most_run=True)
    checks += ctest_checks(args.work, "bench", "'^bench$'", most_run=False)
    bench, _ = bench_checks(args.work, args.gpus)
    checks += bench
    checks += trial_checks(args.work, args.gpus)
    failed = [c for c in checks if c["verdict"] == "FAIL"]
    result = {"verdict": "FAIL" if failed else "PASS", "gpus": args.gpus, "device": args.device,
              "preset": args.preset or None, "checks": checks}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    for c in checks:
        value = c["value"]
        if isinstance(value, float):
            value = f"{value:.4g}"
        elif isinstance(value, dict):
            value = "/".join(str(v) for v in value.values())
        print(f"{c['verdict']:<9} {c['name']:<62} {str(value):>10} {c['unit']:<8} "
              f"target {c['target'] or '-'}" + (f"  ({c['note']})" if c["note"] else ""))
    print(f"gpu_check: {result['verdict']} ({len(failed)} of {len(checks)} checks failed); "
          f"{args.out}")
    return 1 if failed else 0


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("preset")
    p.add_argument("device")
    r = sub.add_parser("report")
    r.add_argument("--work", required=True)
    r.add_argument("--gpus", type=int, required=True)
    r.add_argument("--device", default="")
    r.add_argument("--preset", default="")
    r.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.command == "preset":
        print(preset_for(args.device))
        return 0
    return report(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
