#!/usr/bin/env python3
"""scripts/gpu_check_report.py on made-up measurements: targets, their scaling to other GPUs, the
MFU arithmetic, and that anything missing is a FAIL, never a silent pass.

usage: gpu_check_report_test.py SOURCE_DIR
"""
import importlib.util
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

SOURCE_DIR = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                                    "..", "..")
spec = importlib.util.spec_from_file_location(
    "gpu_check_report", os.path.join(SOURCE_DIR, "scripts", "gpu_check_report.py"))
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)

H100 = {"name": "h100", "peak_flops_bf16": 989e12, "intra_node_bandwidth": 450e9}
A100 = {"name": "a100-80gb", "peak_flops_bf16": 312e12, "intra_node_bandwidth": 300e9}

JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="Linux-c++" tests="3" failures="{failures}" disabled="0" skipped="1" hostname=""
    time="1" timestamp="2026-01-01T00:00:00">
  <testcase name="CudaOps.A" classname="CudaOps.A" time="0.1" status="run">
    <system-out>ok</system-out>
  </testcase>
  <testcase name="CudaOps.B" classname="CudaOps.B" time="0.1" status="{b_status}">
    {b_body}
  </testcase>
  <testcase name="CudaOps.C" classname="CudaOps.C" time="0" status="notrun">
    <skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
  </testcase>
</testsuite>
"""


def bench_np1(preset=H100, fwd=(400.0, 380.0, 360.0), gemm=650.0, out_err=1e-3, engine="cudnn"):
    return {
        "ranks": 1, "device": "NVIDIA H100 80GB HBM3", "AUTOPAR_ATTENTION": engine,
        "gpus_visible": 8, "preset": preset,
        "attention": [{"seq": s, "batch": max(1, 16384 // s), "heads_q": 32, "heads_kv": 4,
                       "head_dim": 128, "forward_s": 0.01, "backward_s": 0.03,
                       "forward_tflops": f, "backward_tflops": f * 0.8}
                      for s, f in zip((4096, 8192, 32768), fwd)],
        "gemm": {"m": 8192, "n": 8192, "k": 8192, "dtype": "bf16", "seconds": 0.002,
                 "tflops": gemm},
        "attention_error": {"seq": 1024, "path": "default", "out": out_err, "lse_abs": 1e-4,
                            "dq": 5e-3, "dk": 5e-3, "dv": 5e-3},
    }


def trial(step, status="ok", config="tp=1,pp=1,dp=1", peak=37.0, predicted_peak=40.0, aux=0.0):
    return {"config": config, "status": status, "message": "", "step_time_s": step,
            "predicted_step_time_s": 0.9, "tokens_per_s": 32768 / step,
            "peak_memory_gib": [peak], "predicted_peak_memory_gib": predicted_peak,
            "aux_loss": aux, "iteration_times_s": [0.98 * step, step, 1.03 * step]}


# 494.5 TFLOP per step on one 989 TFLOP/s GPU: 0.5 s is 100% MFU, 1.0 s is 50%.
PLAN = {"nnodes": 1, "gpus_per_node": 1,
        "configs": [{"config": "tp=1", "step_time_s": 0.8, "model_tflops_per_gpu": 618.125,
                     "mfu": 0.625}]}


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.work = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def put(self, name, value):
        with open(os.path.join(self.work, name), "w") as f:
            f.write(value if isinstance(value, str) else "log line\n" + json.dumps(value) + "\n")

    def junit(self, name, failed=False):
        self.put(name, JUNIT.format(failures=int(failed), b_status="fail" if failed else "run",
                                    b_body='<failure message="Failed"/>' if failed else ""))

    def healthy(self, gpus=1):
        self.junit("ctest_gpu.xml")
        self.junit("ctest_bench.xml")
        self.put("gpu_bench_np1.json", bench_np1())
        # gpu_bench leaves the 32k shape out on the kernel (gpu_check's time budget).
        self.put("gpu_bench_kernel_np1.json", bench_np1(fwd=(100.0, 90.0), engine="kernel"))
        self.put("trial_1gpu.json", trial(1.0))
        self.put("trial_1gpu_fp8.json", trial(0.8))
        self.put("trial_1gpu_modules.json", trial(1.1, peak=35.0, predicted_peak=37.7))
        self.put("trial_1gpu_dropout.json", trial(1.0, peak=37.25, predicted_peak=40.3))
        self.put("trial_1gpu_moe.json", trial(0.5, peak=30.0, aux=0.02))
        self.put("trial_1gpu_all.json", trial(1.02))
        self.put("trial_1gpu_moe_all.json", trial(0.48, peak=30.0, aux=0.02))
        self.put("plan.json", PLAN)
        if gpus >= 2:
            self.put("gpu_bench_np2.json",
                     {"ranks": 2, "preset": H100, "allreduce": [
                         {"bytes": 1 << 24, "busbw_gbps": 100.0},
                         {"bytes": 1 << 30, "busbw_gbps": 300.0}]})
            for tag in ("pp2", "cp2", "tp2"):
                self.put(f"trial_{tag}.json", trial(0.6, config=tag))

    def run_report(self, gpus=1):
        out = os.path.join(self.work, "gpu_check.json")
        with redirect_stdout(io.StringIO()) as text:
            rc = report.main(["report", "--work", self.work, "--gpus", str(gpus), "--device",
                              "NVIDIA H100 80GB HBM3", "--preset", "h100", "--out", out])
        with open(out) as f:
            result = json.load(f)
        return rc, result, {c["name"]: c for c in result["checks"]}, text.getvalue()

    def find(self, checks, prefix):
        found = [c for name, c in checks.items() if name.startswith(prefix)]
        self.assertTrue(found, f"no check named {prefix}...")
        return found

    def test_healthy_one_gpu_passes_and_skips_the_multi_gpu_checks(self):
        self.healthy()
        rc, result, checks, text = self.run_report()
        self.assertEqual(rc, 0, text)
        self.assertEqual(result["verdict"], "PASS")
        for c in result["checks"]:
            self.assertIn(c["verdict"], ("PASS", "info", "skipped"), c)
        for prefix in ("NCCL all-reduce", "trial pp=2", "trial cp=2", "trial tp=2"):
            self.assertEqual({c["verdict"] for c in self.find(checks, prefix)}, {"skipped"})
        self.assertIn("PASS", text)

    def test_mfu_is_model_flops_over_step_time_and_peak(self):
        self.healthy()
        self.put("trial_1gpu.json", trial(1.0))
        _, _, checks, _ = self.run_report()
        mfu = checks["trial llama-7B-shaped 8 layers, 1 GPU: MFU"]
        self.assertAlmostEqual(mfu["value"], 0.5)
        self.assertEqual(mfu["verdict"], "PASS")
        self.assertIn("model predicts 0.9000 s", mfu["note"])
        self.put("trial_1gpu.json", trial(1.2))  # 41.7% < 45%
        rc, result, checks, _ = self.run_report()
        mfu = checks["trial llama-7B-shaped 8 layers, 1 GPU: MFU"]
        self.assertAlmostEqual(mfu["value"], 0.5 / 1.2)
        self.assertEqual(mfu["verdict"], "FAIL")
        self.assertEqual((rc, result["verdict"]), (1, "FAIL"))

    def test_the_fp8_trial_must_be_faster_than_the_bf16_one(self):
        self.healthy()
        _, _, checks, _ = self.run_report()
        name = "trial llama-7B-shaped 8 layers, 1 GPU, fp8 hybrid"
        speedup = checks[f"{name}: speed-up over bf16"]
        self.assertAlmostEqual(speedup["value"], 1.25)
        self.assertEqual(speedup["verdict"], "PASS")
        self.assertIn("model predicts 1.00x", speedup["note"])
        self.assertEqual(checks[f"{name}: step time"]["verdict"], "info")
        self.put("trial_1gpu_fp8.json", trial(1.05))  # slower than bf16: would rank FP8 wrongly
        rc, _, checks, _ = self.run_report()
        self.assertEqual(checks[f"{name}: speed-up over bf16"]["verdict"], "FAIL")
        self.assertEqual(rc, 1)
        # A GPU without fp8: the trial refuses (exit 2, no JSON) and the check is skipped.
        os.remove(os.path.join(self.work, "trial_1gpu_fp8.json"))
        self.put("trial_1gpu_fp8.err", "autopar-tune trial: --fp8-format: cuda:0 (NVIDIA A100) "
                 "has no fp8 GEMMs; fp8 trials run on --backend cuda with a GPU of compute "
                 "capability 8.9 or newer\n")
        rc, _, checks, _ = self.run_report()
        self.assertEqual(checks[f"{name}: ends ok"]["verdict"], "skipped")
        self.assertNotIn(f"{name}: speed-up over bf16", checks)
        self.assertEqual(rc, 0)
        # Any other failure fails both.
        self.put("trial_1gpu_fp8.err", "autopar-tune trial: cuBLASLt: CUBLAS_STATUS_NOT_SUPPORTED\n")
        rc, _, checks, _ = self.run_report()
        self.assertEqual(checks[f"{name}: ends ok"]["verdict"], "FAIL")
        self.assertEqual(checks[f"{name}: speed-up over bf16"]["verdict"], "FAIL")
        self.assertEqual(rc, 1)

    def test_the_feature_trials_end_ok_and_show_what_they_run(self):
        self.healthy()
        rc, _, checks, text = self.run_report()
        self.assertEqual(rc, 0, text)
        modules = "trial llama-7B-shaped, recompute_modules core_attn+layernorm+mlp"
        dropout = "trial llama-7B-shaped, hidden dropout 0.1"
        moe = "trial mixtral-8x7b-shaped 1 layer, 1 GPU"
        for name in (modules, dropout, moe):
            self.assertEqual(checks[f"{name}: ends ok"]["verdict"], "PASS")
            self.assertEqual(checks[f"{name}: step time"]["verdict"], "info")
        self.assertEqual(checks[f"{modules}: peak below core_attn alone"]["verdict"], "PASS")
        self.assertIn("the model says -2.30 GiB",
                      checks[f"{modules}: peak below core_attn alone"]["note"])
        self.assertIn("the masks add +0.250 GiB; the model says +0.300 GiB",
                      checks[f"{dropout}: peak"]["note"])
        self.assertEqual(checks[f"{moe}: load-balancing loss"]["verdict"], "PASS")

        # Recomputing more modules that keeps as much as core_attn alone did not drop them.
        self.put("trial_1gpu_modules.json", trial(1.1, peak=37.0))
        # A router that never ran has no load-balancing loss.
        self.put("trial_1gpu_moe.json", trial(0.5, aux=0.0))
        os.remove(os.path.join(self.work, "trial_1gpu_dropout.json"))
        self.put("trial_1gpu_dropout.err", "autopar-tune trial: cuda: out of memory\n")
        rc, _, checks, _ = self.run_report()
        self.assertEqual(rc, 1)
        self.assertEqual(checks[f"{modules}: peak below core_attn alone"]["verdict"], "FAIL")
        self.assertEqual(checks[f"{moe}: load-balancing loss"]["verdict"], "FAIL")
        self.assertEqual(checks[f"{dropout}: ends ok"]["verdict"], "FAIL")
        self.assertEqual(checks[f"{dropout}: ends ok"]["note"],
                         "autopar-tune trial: cuda: out of memory")

    def test_the_extrapolated_step_must_match_the_step_with_every_micro_batch(self):
        self.healthy()
        rc, _, checks, text = self.run_report()
        self.assertEqual(rc, 0, text)
        dense = "trial llama-7B-shaped 8 layers, 1 GPU: step from 2 of 8 micro-batches / all 8"
        moe = "trial mixtral-8x7b-shaped 1 layer, 1 GPU: step from 2 of 8 micro-batches / all 8"
        self.assertEqual(checks[dense]["verdict"], "PASS")
        self.assertAlmostEqual(checks[dense]["value"], 1.0 / 1.02)
        self.assertIn("(iterations 0.980-1.030)", checks[dense]["note"])
        self.assertEqual(checks[moe]["verdict"], "PASS")
        # What one H200 measured before (docs/trial.md §14.1): 0.509 s from 2, 0.424 s from 8.
        self.put("trial_1gpu_moe.json", trial(0.509))
        self.put("trial_1gpu_moe_all.json", trial(0.424))
        os.remove(os.path.join(self.work, "trial_1gpu_all.json"))
        self.put("trial_1gpu_all.err", "autopar-tune trial: timeout\n")
        rc, _, checks, _ = self.run_report()
        self.assertEqual(rc, 1)
        self.assertEqual(checks[moe]["verdict"], "FAIL")
        self.assertEqual(checks[dense]["verdict"], "FAIL")
        self.assertEqual(checks[dense]["note"], "autopar-tune trial: timeout")

    def test_targets_on_an_h100(self):
        self.healthy()
        self.put("gpu_bench_np1.json", bench_np1(fwd=(400.0, 349.0, 351.0), gemm=599.0))
        rc, _, checks, _ = self.run_report()
        fwd = [c for c in self.find(checks, "attention [cudnn] seq=") if c["name"].endswith("forward")]
        self.assertEqual([c["verdict"] for c in fwd], ["PASS", "FAIL", "PASS"])
        self.assertEqual(fwd[0]["target"], ">= 350 TFLOP/s")
        bwd = [c for c in self.find(checks, "attention [cudnn] seq=") if c["name"].endswith("backward")]
        self.assertEqual({c["verdict"] for c in bwd}, {"info"})
        self.assertEqual(checks["bf16 GEMM 8192^3"]["verdict"], "FAIL")
        self.assertEqual(rc, 1)

    def test_targets_scale_with_the_preset_peak_and_vanish_without_one(self):
        self.healthy()
        self.put("gpu_bench_np1.json", bench_np1(preset=A100, fwd=(120.0, 100.0, 111.0),
                                                 gemm=200.0))
        _, _, checks, _ = self.run_report()
        fwd = [c for c in self.find(checks, "attention [cudnn] seq=") if c["name"].endswith("forward")]
        self.assertEqual([c["verdict"] for c in fwd], ["PASS", "FAIL", "PASS"])  # >= 110.4
        self.assertEqual(checks["bf16 GEMM 8192^3"]["target"], ">= 189.3 TFLOP/s")
        self.assertEqual(checks["bf16 GEMM 8192^3"]["verdict"], "PASS")
        self.put("gpu_bench_np1.json", bench_np1(preset=None, fwd=(1.0, 1.0, 1.0), gemm=1.0))
        rc, _, checks, _ = self.run_report()
        self.assertEqual(checks["bf16 GEMM 8192^3"]["verdict"], "no target")
        self.assertEqual(rc, 0)  # nothing else failed; MFU keeps its target on any GPU

    def test_the_kernel_run_is_for_comparison_but_must_run_and_be_accurate(self):
        self.healthy()
        _, _, checks, _ = self.run_report()
        kernel = self.find(checks, "attention [kernel] seq=")
        self.assertEqual(len(kernel), 4)  # forward and backward at 4k and 8k
        self.assertEqual({c["verdict"] for c in kernel}, {"info"})  # 100 TFLOP/s: no target
        self.put("gpu_bench_kernel_np1.json", bench_np1(out_err=0.1, engine="kernel"))
        rc, _, checks, _ = self.run_report()
        self.assertEqual(self.find(checks, "attention [kernel] out error")[0]["verdict"], "FAIL")
        self.assertEqual(rc, 1)
        os.remove(os.path.join(self.work, "gpu_bench_kernel_np1.json"))
        rc, _, checks, _ = self.run_report()
        self.assertEqual(checks["attention [kernel]"]["verdict"], "FAIL")
        self.assertEqual(rc, 1)

    def test_attention_error_limits(self):
        self.healthy()
        self.put("gpu_bench_np1.json", bench_np1(out_err=0.05))
        rc, _, checks, _ = self.run_report()
        self.assertEqual(self.find(checks, "attention [cudnn] out error")[0]["verdict"], "FAIL")
        self.assertEqual(self.find(checks, "attention [cudnn] dq error")[0]["verdict"], "PASS")
        self.assertEqual(rc, 1)

    def test_two_gpus_add_all_reduce_and_the_three_trials(self):
        self.healthy(gpus=2)
        rc, _, checks, text = self.run_report(gpus=2)
        self.assertEqual(rc, 0, text)
        busbw = checks["NCCL all-reduce busbw, 2 GPUs, 1 GiB"]
        self.assertEqual((busbw["value"], busbw["target"], busbw["verdict"]),
                         (300.0, ">= 270 GB/s", "PASS"))
        self.assertEqual(checks["NCCL all-reduce busbw, 8 GPUs, 1 GiB"]["verdict"], "skipped")
        for tag in ("pp", "cp", "tp"):
            self.assertEqual(checks[f"trial {tag}=2, 2 GPUs: ends ok"]["verdict"], "PASS")
        self.put("trial_cp2.json", trial(0.6, status="oom"))
        os.remove(os.path.join(self.work, "gpu_bench_np2.json"))
        rc, _, checks, _ = self.run_report(gpus=2)
        self.assertEqual(checks["trial cp=2, 2 GPUs: ends ok"]["verdict"], "FAIL")
        self.assertEqual(checks["NCCL all-reduce busbw, 2 GPUs, 1 GiB"]["verdict"], "FAIL")
        self.assertEqual(rc, 1)

    def test_benchmark_entries_may_skip_for_want_of_gpus(self):
        self.healthy()
        self.put("ctest_bench.xml", JUNIT.format(
            failures=0, b_status="notrun", b_body='<skipped message="no GPU"/>'))
        rc, _, checks, _ = self.run_report()
        self.assertEqual(self.find(checks, "ctest -L '^bench$'")[0]["verdict"], "PASS")
        self.assertEqual(rc, 0)

    def test_a_failed_or_missing_ctest_run_fails(self):
        self.healthy()
        self.junit("ctest_gpu.xml", failed=True)
        rc, _, checks, _ = self.run_report()
        gpu = self.find(checks, "ctest -L '^gpu$'")[0]
        self.assertEqual(gpu["value"], {"passed": 1, "failed": 1, "skipped": 1})
        self.assertEqual(gpu["verdict"], "FAIL")
        self.assertIn("CudaOps.B", gpu["note"])
        self.assertEqual(rc, 1)
        os.remove(os.path.join(self.work, "ctest_bench.xml"))
        _, _, checks, _ = self.run_report()
        self.assertEqual(self.find(checks, "ctest -L '^bench$'")[0]["verdict"], "FAIL")

    def test_tests_that_skip_on_a_gpu_machine_did_not_see_the_gpu(self):
        self.healthy()
        self.put("ctest_gpu.xml", JUNIT.format(
            failures=0, b_status="notrun", b_body='<skipped message="no CUDA device"/>'))
        rc, _, checks, _ = self.run_report()
        gpu = self.find(checks, "ctest -L '^gpu$'")[0]
        self.assertEqual(gpu["value"], {"passed": 1, "failed": 0, "skipped": 2})
        self.assertEqual(gpu["verdict"], "FAIL")
        self.assertIn("skipped: CudaOps.B, CudaOps.C", gpu["note"])
        self.assertEqual(rc, 1)

    def test_a_trial_without_output_reports_what_it_printed(self):
        self.healthy()
        os.remove(os.path.join(self.work, "trial_1gpu.json"))
        self.put("trial_1gpu.err", "mpirun noise\nautopar-tune trial: --backend: CUDA backend "
                                   "unavailable\nmore noise\n")
        rc, _, checks, _ = self.run_report()
        ends = checks["trial llama-7B-shaped 8 layers, 1 GPU: ends ok"]
        self.assertEqual(ends["verdict"], "FAIL")
        self.assertEqual(ends["note"], "autopar-tune trial: --backend: CUDA backend unavailable")
        self.assertEqual(checks["trial llama-7B-shaped 8 layers, 1 GPU: MFU"]["verdict"], "FAIL")
        self.assertEqual(rc, 1)

    def test_nothing_measured_is_all_fail(self):
        rc, result, _, _ = self.run_report()
        self.assertEqual(rc, 1)
        verdicts = {c["verdict"] for c in result["checks"]}
        self.assertNotIn("PASS", verdicts)
        self.assertIn("FAIL", verdicts)

    def test_a_skipped_benchmark_on_a_gpu_machine_fails(self):
        self.healthy()
        self.put("gpu_bench_np1.json", {"ranks": 1, "skipped": "no GPU"})
        rc, _, checks, _ = self.run_report()
        self.assertEqual(checks["gemm"]["verdict"], "FAIL")
        self.assertEqual(rc, 1)

    def test_a_failed_part_fails_its_checks_and_keeps_the_others(self):
        self.healthy(gpus=2)
        broken = bench_np1()
        broken["attention"][1] = {"error": "invalid: cuDNN does not support this call"}
        broken["gemm"] = {"error": "device_error: cublas"}
        self.put("gpu_bench_np1.json", broken)
        self.put("gpu_bench_np2.json", {"ranks": 2, "allreduce": {"error": "comm_error: x"}})
        rc, _, checks, _ = self.run_report(gpus=2)
        self.assertEqual(checks["attention [cudnn]"]["verdict"], "FAIL")
        self.assertIn("cuDNN does not support", checks["attention [cudnn]"]["note"])
        self.assertEqual(checks["bf16 GEMM 8192^3"]["verdict"], "FAIL")
        self.assertIn("cublas", checks["bf16 GEMM 8192^3"]["note"])
        self.assertEqual(checks["NCCL all-reduce busbw, 2 GPUs, 1 GiB"]["note"], "comm_error: x")
        fwd = [c for c in self.find(checks, "attention [cudnn] seq=") if c["name"].endswith("forward")]
        self.assertEqual([c["verdict"] for c in fwd], ["PASS", "PASS"])
        self.assertEqual(rc, 1)

    def test_presets_of_device_names(self):
        for name, preset in (("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", ""),
                             ("NVIDIA H100 NVL", ""), ("NVIDIA H200", "h200"),
                             ("NVIDIA H800", "h800"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
                             ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA B200", "b200"),
                             ("NVIDIA GB200", "gb200"), ("NVIDIA B300 SXM6 AC", "b300"),
                             ("NVIDIA GB300", "gb300"),
                             ("NVIDIA GeForce RTX 4090", ""), ("Tesla V100-SXM2-16GB", "")):
            self.assertEqual(report.preset_for(name), preset, name)


if __name__ == "__main__":
    unittest.main()
