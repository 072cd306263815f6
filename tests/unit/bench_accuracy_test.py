#!/usr/bin/env python3
"""scripts/bench_accuracy.py on made-up rows: Kendall's tau-b and its pooling over groups, the
per-source and per-era aggregation (MAPE, median, max, bias as speed), the reading of a row into
a configuration or the reasons it cannot be expressed, the sources' FLOP conventions, and a whole
run against a stand-in binary (a refused row is listed as skipped, a failing binary exits 1).

usage: bench_accuracy_test.py SOURCE_DIR
"""
import contextlib
import csv
import importlib.util
import io
import json
import os
import stat
import sys
import tempfile
import unittest

SOURCE_DIR = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                                    "..", "..")
spec = importlib.util.spec_from_file_location(
    "bench_accuracy", os.path.join(SOURCE_DIR, "scripts", "bench_accuracy.py"))
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

COLUMNS = ["id", "quality", "gpu_norm", "source_key", "model", "layers", "hidden", "heads",
           "kv_heads", "ffn", "vocab", "seq_len", "moe_experts", "moe_topk", "gpu", "num_gpus",
           "nodes_x_gpn", "gbs", "mbs", "tp", "pp", "dp", "cp", "ep", "etp", "vpp", "sp",
           "recompute", "dist_opt_zero", "precision", "metric_value", "metric_unit"]


def row(**fields):
    """A made-up 2024-style row: a small GPT on 16 H100s, tp 2, dp 8, 450 TFLOP/s."""
    r = {"id": "X1", "quality": "A", "gpu_norm": "H100-80GB-SXM",
         "source_key": "MEGATRON_README_2024", "model": "GPT 1B", "layers": "16",
         "hidden": "2048", "heads": "16", "kv_heads": "16", "ffn": "", "vocab": "32768",
         "seq_len": "4096", "moe_experts": "", "moe_topk": "", "gpu": "H100", "num_gpus": "16",
         "nodes_x_gpn": "2x8", "gbs": "64", "mbs": "", "tp": "2", "pp": "1", "dp": "8",
         "cp": "1", "ep": "", "etp": "", "vpp": "", "sp": "", "recompute": "not stated",
         "dist_opt_zero": "yes", "precision": "BF16", "metric_value": "450",
         "metric_unit": "TFLOP/s/GPU"}
    r.update(fields)
    return r


def result(measured, predicted, model="m", cluster=("H100", 8), seq=4096, metric="tflops",
           source="MEGATRON_README_2024", era="2024"):
    return {"id": "X", "source": source, "era": era, "model": model, "cluster": cluster,
            "seq": seq, "metric": metric, "spec": "", "measured": measured,
            "predicted": predicted, "err": (predicted - measured) / measured, "flops_ratio": 1.0}


class KendallTau(unittest.TestCase):
    def test_agreement_reversal_and_one_swap(self):
        self.assertEqual(bench.kendall_tau_b([1, 2, 3], [10, 20, 30]), 1.0)
        self.assertEqual(bench.kendall_tau_b([1, 2, 3], [30, 20, 10]), -1.0)
        self.assertAlmostEqual(bench.kendall_tau_b([1, 2, 3], [1, 3, 2]), 1 / 3)

    def test_ties(self):
        # One pair tied in measured: 2 concordant of sqrt((3 - 1)·3) comparable pairs.
        self.assertAlmostEqual(bench.kendall_tau_b([1, 1, 2], [1, 2, 3]), 2 / 6 ** 0.5)
        self.assertIsNone(bench.kendall_tau_b([5, 5], [1, 2]))  # nothing to rank
        self.assertEqual(bench.kendall_tau_b([1, 2], [7, 7]), 0.0)  # no ranking predicted

    def test_groups_share_model_cluster_sequence_and_metric(self):
        results = [result(1, 1), result(2, 2), result(3, 3),  # tau 1, 3 pairs
                   result(1, 2, model="n"), result(2, 1, model="n"),  # tau -1, 1 pair
                   result(5, 5, model="alone"),  # a group of one: left out
                   result(1, 9, cluster=("H100", 16)),  # another cluster: alone
                   result(9, 1, metric="iteration_s")]  # another metric: alone
        tau, groups = bench.grouped_tau(results)
        self.assertEqual(groups, 2)
        self.assertAlmostEqual(tau, (3 * 1 + 1 * -1) / 4)
        self.assertEqual(bench.grouped_tau([result(1, 1)]), (None, 0))


class Aggregation(unittest.TestCase):
    def test_summary_and_bias_as_speed(self):
        # +10% and -20% on TFLOP/s; a predicted iteration 25% longer is a slower step: -25%.
        s = bench.summarize([result(100, 110), result(100, 80),
                             result(4, 5, metric="iteration_s", model="t")])
        self.assertEqual(s["rows"], 3)
        self.assertAlmostEqual(s["mape"], (0.10 + 0.20 + 0.25) / 3)
        self.assertAlmostEqual(s["median"], 0.20)
        self.assertAlmostEqual(s["max"], 0.25)
        self.assertAlmostEqual(s["bias"], (0.10 - 0.20 - 0.25) / 3)
        self.assertEqual(bench.summarize([]), {"rows": 0})

    def test_table_per_source_then_all_then_eras(self):
        results = [result(100, 110), result(100, 90, model="n"),
                   result(10, 12, source="KORTHIKANTI22_T5", era="2020-2022",
                          metric="iteration_s")]
        skipped = [(row(id="S1"), "why"), (row(id="S2", source_key="LLAMA3_T4"), "why")]
        lines = {name: (era, s, n_skipped) for name, era, s, n_skipped, _
                 in bench.table(results, skipped)}
        self.assertEqual(list(lines), ["MEGATRON_README_2024", "KORTHIKANTI22_T5", "LLAMA3_T4",
                                       "all", "2020-2022", "2024", "uneven stages or etp",
                                       "the other rows"])
        era, s, n = lines["MEGATRON_README_2024"]
        self.assertEqual((era, s["rows"], n), ("2024", 2, 1))
        self.assertAlmostEqual(s["mape"], 0.10)
        self.assertAlmostEqual(s["bias"], 0.0)
        self.assertEqual((lines["LLAMA3_T4"][1]["rows"], lines["LLAMA3_T4"][2]), (0, 1))
        self.assertEqual((lines["all"][1]["rows"], lines["all"][2]), (3, 2))
        self.assertAlmostEqual(lines["2020-2022"][1]["bias"], -0.2)
        self.assertEqual((lines["2024"][1]["rows"], lines["2024"][2]), (2, 2))
        self.assertIn("(no row expressed)", bench.table_line(*bench.table([], skipped)[0]))


class Rows(unittest.TestCase):
    def test_a_2024_row_with_its_source_defaults(self):
        src = bench.SOURCES["MEGATRON_README_2024"]
        spec_, world, reasons = bench.config_of(row(), src)
        self.assertEqual(reasons, [])
        self.assertEqual(world, 16)
        self.assertEqual(spec_, "tp=2,pp=1,dp=8,cp=1,ep=1,vpp=1,mbs=1,sp=on,recompute=none,"
                                "dist_opt=on")
        self.assertIn("sp=off", bench.config_of(row(tp="1", dp="16"), src)[0])

    def test_reasons_a_row_cannot_be_expressed(self):
        src = bench.SOURCES["MEGATRON_README_2024"]
        def why(**fields):
            return " ".join(bench.config_of(row(**fields), src)[2])
        self.assertIn("not given", why(tp="", pp="", dp=""))
        self.assertEqual(why(layers="15", pp="2", dp="4"), "")  # uneven stages, balanced
        self.assertIn("exceeds the 15 layers", why(layers="15", pp="16", dp="1"))
        self.assertIn("virtual stages is not stated", why(vpp="interleaved (V not stated)"))
        self.assertIn("is not the 16 GPUs", why(dp="4"))
        self.assertEqual(why(ep="8", etp="1"), "")
        self.assertIn("etp=1,", bench.config_of(row(ep="8", etp="1"), src)[0])
        self.assertNotIn("etp", bench.config_of(row(ep="8", etp="2"), src)[0])
        # Megatron's --recompute-modules become SPEC's recompute_modules; core_attn is the default.
        self.assertEqual(why(recompute="selective (layernorm, moe)"), "")
        self.assertIn("recompute=selective,recompute_modules=layernorm+moe,",
                      bench.config_of(row(recompute="selective (moe, layernorm)"), src)[0])
        self.assertIn("recomputing mla_up_proj is not modelled",
                      why(recompute="selective (mla_up_proj, layernorm)"))
        self.assertEqual(why(recompute="selective (attention core)"), "")
        self.assertNotIn("recompute_modules",
                         bench.config_of(row(recompute="selective (core_attn)"), src)[0])
        moe = bench.SOURCES["MOE_MODELZOO_QWEN3_LC"]
        self.assertIn("etp=1,dispatcher=flex,", bench.config_of(row(ep="8"), moe)[0])

    def test_virtual_stages_from_the_source_text(self):
        # Llama 3's Table 4 leaves V out; its text puts one layer in every chunk, the embedding
        # and the loss a chunk each: 126 + 2 over pp 16 is V = 8. Its CP rows all-gather K and V.
        src = bench.SOURCES["LLAMA3_T4"]
        r = row(source_key="LLAMA3_T4", layers="126", num_gpus="8192", tp="8", pp="16", dp="64",
                vpp="interleaved (V not stated)")
        spec_, world, reasons = bench.config_of(r, src)
        self.assertEqual((world, reasons), (8192, []))
        self.assertIn("vpp=8,split_embedding=on,split_loss=on,", spec_)
        r.update(cp="16", dp="4")
        spec_, _, reasons = bench.config_of(r, src)
        self.assertEqual(reasons, [])
        self.assertIn("cp=16,cp_comm=allgather,", spec_)
        r.update(cp="1", dp="64")
        self.assertNotIn("cp_comm", bench.config_of(r, src)[0])
        # A source without such a rule still reports V as not stated.
        other = row(vpp="interleaved (V not stated)", pp="2", dp="4")
        self.assertIn("not stated",
                      " ".join(bench.config_of(other, bench.SOURCES["MEGATRON_README_2024"])[2]))

    def test_cluster_from_the_printed_configuration(self):
        src = bench.SOURCES["NEMO_LONGCTX_B200"]
        r = row(source_key="NEMO_LONGCTX_B200", gpu="B200", num_gpus="64", nodes_x_gpn="8x8",
                tp="4", dp="2", cp="2")
        spec_, world, reasons = bench.config_of(r, src)
        self.assertEqual((world, reasons), (16, []))
        cmd = bench.command(r, src, spec_, world)
        self.assertEqual(cmd[cmd.index("--nnodes") + 1], "2")
        self.assertEqual(cmd[cmd.index("--gpu") + 1], "b200")
        self.assertIn("--fp8-format", cmd)

    def test_model_flags(self):
        flags = bench.model_flags(row(model="LLAMA3-8B", kv_heads="8", ffn="14336"),
                                  bench.SOURCES["NEMO_LONGCTX_H100"])
        self.assertEqual(flags[:2], ["--model", "llama3-8b"])
        self.assertIn("--num-query-groups", flags)
        flags = bench.model_flags(row(), bench.SOURCES["MEGATRON_README_2024"])
        self.assertEqual(flags[flags.index("--ffn-hidden-size") + 1], str(4 * 2048))
        self.assertNotIn("--num-query-groups", flags)
        self.assertEqual(bench.preset_of(row(model="Llama 3 405B")), "llama3-405b")
        moe = row(ffn="dense 12288 (unused) / expert 1536", moe_experts="128", moe_topk="8")
        flags = bench.model_flags(moe, bench.SOURCES["MOE_MODELZOO_QWEN3_LC"])
        self.assertEqual(flags[flags.index("--moe-ffn-hidden-size") + 1], "1536")
        self.assertEqual(flags[flags.index("--ffn-hidden-size") + 1], "12288")


class FlopConventions(unittest.TestCase):
    def test_megatron_equals_nemo_llama_and_causal_halves_the_scores(self):
        r = row(layers="32", hidden="4096", heads="32", kv_heads="8", ffn="14336",
                vocab="128256", seq_len="8192", gbs="2")
        B, s, L, h, g, a, f, V = 2, 8192, 32, 4096, 8, 32, 14336, 128256
        nemo = B * s * L * h * h * (12 + 12 * g / a + 18 * f / h + 12 * s / h + 6 * V / (L * h))
        self.assertAlmostEqual(bench.megatron_flops(r, swiglu=True) / nemo, 1.0)
        scores = 12 * B * s * L * h * s
        self.assertAlmostEqual(bench.megatron_flops(r, swiglu=True) -
                               bench.megatron_flops(r, swiglu=True, causal=True), scores / 2)

    def test_moe_counts_the_routed_experts(self):
        r = row(ffn="dense 12288 / expert 1024", moe_experts="128", moe_topk="8")
        dense = row(ffn="12288")
        self.assertLess(bench.megatron_flops(r, swiglu=True),
                        bench.megatron_flops(dense, swiglu=True))  # 8 x 1024 < 12288
        self.assertAlmostEqual(bench.megatron_flops(r, swiglu=True),
                               bench.megatron_flops(row(ffn=str(8 * 1024)), swiglu=True))


FAKE_BIN = """#!/usr/bin/env python3
import json, sys
args = sys.argv[1:]
layers = args[args.index("--num-layers") + 1]
if layers == "7":
    sys.stderr.write("autopar-tune predict: --config: pp=2 does not divide num_layers=7\\n")
    sys.exit(2)
if layers == "9":
    sys.exit(1)
fits = layers != "10"  # exit 3: the estimate of a configuration the model says does not fit
print(json.dumps({"configs": [{"step_time_s": 2.0, "model_tflops_per_gpu": 100.0, "mfu": 0.1,
                               "fits": fits, "peak_memory_gib": 70.0 if fits else 95.5,
                               "breakdown": {"layer_forward_s": 0.001,
                                             "layer_backward_s": 0.002}}]}))
sys.exit(0 if fits else 3)
"""


class WholeRun(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.bin = os.path.join(self.dir.name, "autopar-tune")
        with open(self.bin, "w") as f:
            f.write(FAKE_BIN)
        os.chmod(self.bin, os.stat(self.bin).st_mode | stat.S_IXUSR)
        self.saved, bench.BIN = bench.BIN, self.bin

    def tearDown(self):
        bench.BIN = self.saved
        self.dir.cleanup()

    def run_main(self, rows):
        path = os.path.join(self.dir.name, "rows.csv")
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = bench.main([path])
        return code, out.getvalue(), err.getvalue()

    def test_report_with_a_refused_and_an_unexpressed_row(self):
        code, out, _ = self.run_main([
            row(id="A1"), row(id="A2", tp="4", dp="4"),
            row(id="R1", layers="7", pp="1"), row(id="U1", tp="", pp="", dp="")])
        self.assertEqual(code, 0)
        self.assertIn("rows predicted: 2 of 4", out)
        self.assertIn("R1     MEGATRON_README_2024   the tool refuses it: autopar-tune predict: "
                      "--config: pp=2 does not divide num_layers=7", out)
        self.assertIn("U1     MEGATRON_README_2024   parallel configuration", out)
        # Measured 450 TFLOP/s; predicted: the source's FLOPs over the 2 s step and 16 GPUs.
        flops = bench.megatron_flops(row(), swiglu=False)
        predicted = flops / 2.0 / 16 / 1e12
        self.assertIn(f"{predicted:9.2f}", out)
        self.assertIn(f"{100 * (predicted - 450) / 450:+6.1f}%", out)
        # The source's FLOPs over the tool's: F / (100 TFLOP/s · 2 s · 16).
        self.assertIn(f"{flops / (100e12 * 2.0 * 16):.2f}", out)
        self.assertRegex(out, r"MEGATRON_README_2024\s+2024\s+2\s+2 ")

    def test_a_row_the_model_puts_over_the_memory_is_named(self):
        code, out, _ = self.run_main([row(id="A1"), row(id="M1", layers="10", pp="2", dp="4")])
        self.assertEqual(code, 0)
        self.assertIn("rows predicted: 2 of 2", out)
        self.assertIn("the model puts over the GPU's memory (the source ran them): M1 95.5 GiB",
                      out)

    def test_an_unreadable_file_exits_2(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(bench.main([os.path.join(self.dir.name, "missing.csv")]), 2)
        self.assertIn("missing.csv", err.getvalue())

    def test_a_failing_binary_exits_1(self):
        code, _, err = self.run_main([row(id="A1"), row(id="F1", layers="9", pp="1")])
        self.assertEqual(code, 1)
        self.assertIn("the binary failed: exit 1", err)


if __name__ == "__main__":
    unittest.main()
