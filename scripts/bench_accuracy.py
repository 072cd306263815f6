#!/usr/bin/env python3
"""Predicts every row of the calibration files (default: shared/calibration/published.csv, the
Megatron-LM of 2020-2022, and published_2024.csv, today's Megatron-core/NeMo stacks) that the model
can express, prints measured vs predicted in each source's own metric, then a table per source:
rows, MAPE, median and max APE, bias and Kendall's tau inside groups (docs/models.md §5.1).

One set of per-GPU efficiency constants (src/perf/constants.cc) serves every row; nothing here is
fitted per row. What each row needs beyond the CSV (the software stack, defaults for what the
source does not state, the FLOP convention of its metric) is stated once per source in SOURCES.
A row the model cannot express is listed with the reason, never dropped silently.

Error of a row: (predicted - measured) / measured in the source's metric. Bias: the mean signed
error oriented as speed, + when the model predicts a faster step (errors of time metrics
negated). Kendall's tau: tau-b between measured and predicted inside each group of >= 2 rows that
share model, cluster (GPU and count), sequence length and metric, pooled with each group weighted
by its pairs. Exit status 0 (a report, not a gate); 1 when the binary fails (an exit other than 0,
2 or 3, or output that is not its JSON); 2 when a calibration file cannot be read.
"""
import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("AUTOPAR_BIN", os.path.join(ROOT, "build", "autopar-tune"))
CALIBRATION = os.path.join(ROOT, "..", "shared", "calibration")
DEFAULT_CSVS = [os.path.join(CALIBRATION, "published.csv"),
                os.path.join(CALIBRATION, "published_2024.csv")]


class BinaryFailure(RuntimeError):
    """The binary failed: not a row it refuses (exit 2) but a crash or unreadable output."""


# ---- FLOP conventions of the sources' TFLOP/s ----

def narayanan_flops(row, recompute_factor=4):
    """Narayanan et al. 2021 eq. (3): FLOPs per iteration including the recomputed forward."""
    B, s, l, h, V = (int(row[k]) for k in ("gbs", "seq_len", "layers", "hidden", "vocab"))
    return 24 * recompute_factor * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def megatron_flops(row, swiglu, causal=False, kv_channels=None):
    """Megatron-LM's `num_floating_point_operations` (megatron/training/training.py):
    12·B·s·L·h²·[(1 + g/a + s/h·c)·q/h + ffn·k·m/h + V/(2·L·h)], i.e. 6·(matmul params)·tokens
    plus the attention scores and values (full square, c = 1; c = 1/2 where the version counts
    the causal half), logits without the embedding lookup, no recomputed forward. q = a·kv_channels
    (h when not set), k the routed experts (1 when dense), m = 3/2 with SwiGLU. NeMo's
    flops_formulas.llama2/llama3 are the same expression (12 + 12g/a + 18·ffn/h + 12s/h +
    6V/(L·h), times B·s·L·h²)."""
    B, s, L, h, V, a = (int(row[k]) for k in ("gbs", "seq_len", "layers", "hidden", "vocab",
                                               "heads"))
    g = int(row["kv_heads"]) if row["kv_heads"].strip().isdigit() else a
    q = a * kv_channels if kv_channels else h
    moe = expert_ffn(row)
    ffn = moe * int(row["moe_topk"]) if moe else dense_ffn(row)
    attention = (1 + g / a + s / h * (0.5 if causal else 1.0)) * q / h
    mlp = ffn * (1.5 if swiglu else 1.0) / h
    return 12 * B * s * L * h * h * (attention + mlp + V / (2 * L * h))


def dense_ffn(row):
    """The ffn column: a number, 'dense N / expert M' for MoE rows, or blank (Megatron's 4h)."""
    text = row["ffn"].strip()
    if text.isdigit():
        return int(text)
    m = re.search(r"dense\s+(\d+)", text)
    return int(m.group(1)) if m else 4 * int(row["hidden"])


def expert_ffn(row):
    m = re.search(r"expert\s+(\d+)", row["ffn"])
    return int(m.group(1)) if m and row["moe_experts"].strip() else 0


# ---- the sources: software stack, defaults and metric, stated once each ----

GPT_ARCH = []  # Megatron-LM's defaults: GeLU, LayerNorm, learned positions, tied, biases
LLAMA_ARCH = ["--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
              "--untie-embeddings-and-output-weights", "--disable-bias-linear"]
# The Megatron-LM of 2020-2022: unfused attention with dropout, fp16, activations sent between
# stages with scatter/gather; gradients reduced in fp16, the parameters' dtype (the SC21 scripts,
# examples/academic_paper_scripts/sc21/SRUN.sh, pass --fp16 without
# --accumulate-allreduce-grads-in-fp32, which Megatron then leaves off).
ERA_2020_2022 = ["--no-flash-attention", "--attention-dropout", "0.1", "--hidden-dropout", "0.1",
                 "--no-overlap-param-gather", "--fp16", "--fix", "grad_reduce_dtype=bf16"]
# Before September 2021 Megatron-LM ran every backward tensor-parallel all-reduce after the GEMMs
# that need it: the asynchronous all-reduce under the weight-gradient GEMM came with the merge of
# slym/allreduce-overlap (b462d2545d, 2021-09-07; megatron/mpu/layers.py). The runs of Narayanan
# et al. (arXiv 2104.04473, April 2021) and the README table of the same code predate it;
# Korthikanti et al. (2022) postdate it.
ERA_2021 = ERA_2020_2022 + ["--no-async-tp-backward"]
# Megatron-core / NeMo of 2024-2026: Transformer Engine with flash (cuDNN fused) attention,
# gradient reduce and parameter gather overlapped with compute (the tool's defaults), distributed
# optimizer (in the configuration), fp32 gradient reduction (Megatron's default for bf16). Each
# source adds what its runs state: TP communication overlapped with the GEMMs
# (--tp-comm-overlap), the fused cross-entropy (--cross-entropy-loss-fusion). Not modelled: CUDA
# graphs.
STACK_2024 = []
# NeMo's runs: the fused cross-entropy (NeMo 1.x's launcher conf training/llama/llama2_7b.yaml
# cross_entropy_loss_fusion: true; NeMo 2.0's GPTConfig defaults it on) and no TP overlap (the
# launcher's ub_tp_comm_overlap: False; NeMo 2.0's llama3_8b performance recipe passes
# MegatronCommOverlapCallback(tp_comm_overlap=False)).
NEMO_STACK = STACK_2024 + ["--cross-entropy-loss-fusion"]


@dataclass
class Source:
    era: str
    metric: str                    # "tflops", "mfu", "layer_ms", "iteration_s", "iteration_ms"
    stack: list
    arch: list = field(default_factory=list)
    flops: object = None           # row -> FLOPs per iteration as the source counts them
    preset: bool = False           # --model from the row's model name (llama2-7b, ...)
    mbs: object = None             # default micro-batch when the row has none (None: gbs/dp)
    recompute: str = "none"        # default when the row does not state it
    sp_when_tp: bool = False       # sequence parallel on when tp > 1, unless the row says
    dist_opt: str = ""             # "on"/"off" written into SPEC (2020-2022: the tool's default)
    etp: int = 0                   # expert tensor parallel size of the recipe (0: tp)
    gpus_from_config: bool = False  # the cluster is tp·pp·dp·cp GPUs: the GPU column is wrong
    counted_split: bool = False    # --account-for-embedding/loss-in-pipeline-split (with vpp)
    flex_dispatcher: bool = False  # --moe-token-dispatcher-type flex (DeepEP) where ep > 1
    not_modelled: str = ""         # a source-wide reason no row of it can be expressed
    vpp: object = None             # row -> virtual stages, where the source's text gives them
    cp_allgather: bool = False     # cp by all-gathered K and V (--cp-comm-type all_gather)


SOURCES = {
    # Narayanan et al. 2021 Table 1: their TFLOP/s count the recomputed forward (eq. 3).
    "NARAYANAN21_T1": Source("2020-2022", "tflops", ERA_2021, GPT_ARCH, narayanan_flops,
                             recompute="full"),
    "KORTHIKANTI22_T4": Source("2020-2022", "layer_ms", ERA_2020_2022, GPT_ARCH,
                               recompute="full"),
    "KORTHIKANTI22_T5": Source("2020-2022", "iteration_s", ERA_2020_2022, GPT_ARCH,
                               recompute="full"),
    # Megatron README 2020: recompute not stated, but its TFLOP/s match the 96·B·s·l·h² formula,
    # which counts the recomputed forward: activation checkpointing was on.
    "MEGATRON_README_2020": Source("2020-2022", "iteration_ms", ERA_2021, GPT_ARCH,
                                   recompute="full"),
    # Megatron-core r0.8.0 README table (July 2024): TFLOP/s from r0.8's
    # num_floating_point_operations (full attention square, no recompute counted). Not stated,
    # taken from Megatron-LM: mbs 1 (examples/gpt3/train_gpt3_175b_distributed.sh), ffn 4h, no
    # interleaving, no recompute, dropout 0.1 (its defaults), bf16 (the MFU is against 989
    # TFLOP/s); --tp-comm-overlap implies sequence parallel with tp > 1 and
    # --overlap-param-gather the distributed optimizer.
    "MEGATRON_README_2024": Source(
        "2024", "tflops", STACK_2024 + ["--bf16", "--attention-dropout", "0.1",
                                        "--hidden-dropout", "0.1", "--tp-comm-overlap"], GPT_ARCH,
        lambda r: megatron_flops(r, swiglu=False), mbs=1, sp_when_tp=True, dist_opt="on"),
    # NeMo long-context tables (H100: NeMo 24.03.01, B200: 25.04.rc2), Llama presets: TFLOP/s from
    # NeMo's llama2/llama3 formulas (= Megatron's, full square). FP8 recipes: hybrid E4M3/E5M2.
    # Not stated, NeMo recipe defaults: mbs 1, no interleaving, no recompute, distributed
    # optimizer, dropout 0; sequence parallel with tp > 1.
    # H100 (NeMo 24.03, NeMo 1.x's launcher): gradients reduced in bf16, as the launcher's FP8
    # example for this model does (NVIDIA/NeMo-Framework-Launcher
    # examples/training/llama/h100/llama2_7b_fp8.sh: +training.model.optim.grad_sync_dtype=bf16,
    # April 2024); with fp32 gradients Llama-2-7B at tp = 1 (the 4k row) would not fit in 80 GB.
    # Attention: flash-attn 2. Transformer Engine 1.4 (NeMo's pin then) would pick cuDNN's fused
    # attention on sm90, but that launcher disables it for every model (launcher_scripts/conf/
    # config.yaml env_vars, tags 24.01-24.05: "NVTE_FUSED_ATTN: 0 # Disable cudnn FA until we've
    # tested it more"; tag 24.05 defaults to the nemo:24.03.01 container), so TE ran flash-attn
    # (<= 2.4.2). Its speed on an H100 SXM5 at head dim 128, 16k tokens: forward 335 TFLOP/s
    # causal, backward 322 (Shah et al. 2024, FlashAttention-3, Fig. 5-6), 0.33 of the BF16 peak
    # over one forward and a 2.5x backward; cudnn-frontend's benchmark of May 2024 (commit
    # b740542, benchmark_results.csv, causal, 16k-64k) 0.31-0.33. The model's efficiency is the
    # long-call one, before the shape law's keys/(keys + 380) (0.977 at 16k): 0.34.
    "NEMO_LONGCTX_H100": Source(
        "2024", "tflops",
        NEMO_STACK + ["--fp8-format", "hybrid", "--fix", "grad_reduce_dtype=bf16",
                      "--attention-efficiency", "0.34"], preset=True,
        flops=lambda r: megatron_flops(r, swiglu=True), mbs=1, sp_when_tp=True, dist_opt="on"),
    # The B200 table prints TP×PP×DP×CP = GPUs/4 on every row; its GBS at 512K and 1024K tokens
    # (8, 4) divides by the printed DP only, so the configuration is taken as printed and the
    # cluster as its TP×PP×DP×CP GPUs (the metric is per GPU).
    "NEMO_LONGCTX_B200": Source(
        "2024", "tflops", NEMO_STACK + ["--fp8-format", "hybrid"], preset=True,
        flops=lambda r: megatron_flops(r, swiglu=True), mbs=1, sp_when_tp=True, dist_opt="on",
        gpus_from_config=True),
    # Llama 3 paper Table 4 (Meta's own stack): the FLOP convention is not stated; Megatron's
    # assumed. mbs 1 assumed (not stated); FSDP sharding optimizer state and gradients, taken as
    # the distributed optimizer. The table does not give V, §3.3.2 does: "we reduce one
    # Transformer layer each from the first and the last stages ... the first model chunk on the
    # first stage has only the embedding, and the last model chunk on the last stage has only
    # output projection and loss calculation": chunks of one layer, the embedding and the loss
    # counted (Megatron's --account-for-embedding/loss-in-pipeline-split), so pp·V = layers + 2.
    # Its context parallelism all-gathers K and V (§3.3.2: "all-gather based method ... we first
    # all-gather the key (K) and value (V) tensors"), Megatron's --cp-comm-type all_gather.
    "LLAMA3_T4": Source(
        "2024", "tflops", STACK_2024 + ["--bf16"], preset=True,
        flops=lambda r: megatron_flops(r, swiglu=True), mbs=1, sp_when_tp=True, dist_opt="on",
        counted_split=True, vpp=lambda r: (int(r["layers"]) + 2) // int(r["pp"]),
        cp_allgather=True),
    # Megatron-core MoE model zoo, Qwen3-235B-A22B long context: Megatron-core of 2025-2026 counts
    # the causal half of the scores. Recipe (model_configs/benchmarking/Qwen3-235B-A22B.yaml):
    # kv_channels 128, qk-layernorm, --expert-tensor-parallel-size 1, sequence parallel,
    # distributed optimizer, dropout 0, --account-for-embedding-in-pipeline-split and
    # --account-for-loss-in-pipeline-split (94 layers + 2 over pp 8 × vpp 4: the first and the last
    # model chunk one layer short of the others' 3); the DeepEP (flex) dispatcher; selective
    # recompute of layernorm and moe (best_practice/qwen3/readme.md's command); the fused
    # cross-entropy (the recipe's --cross-entropy-loss-fusion) and TP communication overlapped
    # with the GEMMs (sbatch_benchmarking.sh adds --tp-comm-overlap to every PR=bf16 run since
    # b09773a, December 2025, before the table's first commit 38ce2ed). The table's "forced
    # balance" and "dropless" rows are one configuration: the first routes evenly (the model's
    # assumption), the second as the trained router does (its imbalance not stated), so the
    # model predicts both alike.
    "MOE_MODELZOO_QWEN3_LC": Source(
        "2024", "tflops",
        STACK_2024 + ["--bf16", "--tp-comm-overlap", "--cross-entropy-loss-fusion"],
        LLAMA_ARCH + ["--kv-channels", "128", "--qk-layernorm"],
        lambda r: megatron_flops(r, swiglu=True, causal=True, kv_channels=128), mbs=1,
        sp_when_tp=True, dist_opt="on", etp=1, counted_split=True, flex_dispatcher=True),
}

# Gradient all-reduce: the 2020 README runs used PyTorch DDP (--DDP-impl torch, the default then),
# which overlaps it with the backward pass; the 2021-2022 papers used Megatron's local DDP, which
# all-reduces after the backward pass.
NO_OVERLAP = {"NARAYANAN21_T1", "KORTHIKANTI22_T4", "KORTHIKANTI22_T5"}

METRIC_LABEL = {"tflops": "TFLOP/s/GPU", "mfu": "MFU %", "layer_ms": "layer ms",
                "iteration_s": "iteration s", "iteration_ms": "iteration ms"}
TIME_METRICS = {"layer_ms", "iteration_s", "iteration_ms"}


# ---- a row as the tool's inputs ----

def num(text):
    """The integer a column holds, or None when it is blank or words ('not stated', ...)."""
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


def gpu_of(row):
    g = row["gpu"]
    if "V100" in g:
        return os.path.join(ROOT, "scripts", "data", "v100-dgx2.yaml"), 16
    if "B200" in g:
        return "b200", 8
    if "H100" in g:
        return "h100", 8
    if "80GB" in g:
        return "a100-80gb", 8
    return "a100-40gb", 8  # the DGX-A100 of 2020 carried A100-40GB


def nodes_of(row, gpus_per_node):
    m = re.match(r"(\d+)x(\d+)", row["nodes_x_gpn"])
    if m:
        return int(m.group(1)), int(m.group(2))
    n = int(row["num_gpus"])
    return max(1, n // gpus_per_node), min(n, gpus_per_node)


# Megatron's --recompute-modules names (TransformerConfig.recompute_modules) the model runs.
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts")


def recompute_of(row, src):
    """(mode, modules, reason): the row's recompute, the source's default when not stated, with
    selective recompute's modules as SPEC's recompute_modules ('' for core_attn alone); a reason
    when it names a module the model does not run."""
    r = row["recompute"].strip().lower()
    for mode in ("full", "selective", "none"):
        if r.startswith(mode):
            listed = re.match(r"selective\s*\(([^)]*)\)", r)
            names = [re.sub(r"^attention$", "core_attn", n.strip().split()[0])
                     for n in listed.group(1).split(",")] if listed else []
            unknown = [n for n in names if n not in RECOMPUTE_MODULES]
            if unknown:
                return mode, "", (f"recompute '{row['recompute']}': recomputing "
                                  f"{', '.join(unknown)} is not modelled")
            modules = "+".join(m for m in RECOMPUTE_MODULES if m in names)
            return mode, "" if modules in ("", "core_attn") else modules, None
    return src.recompute, "", None


def sp_of(row, src, tp):
    s = row["sp"].strip().lower()
    if s.startswith("on"):
        return "on"
    if s.startswith("off") or s.startswith("n/a") or not src.sp_when_tp:
        return "off"
    return "on" if tp > 1 else "off"


def config_of(row, src):
    """(SPEC, world, reasons): the configuration as --config takes it; reasons why the model
    cannot express the row (empty when it can)."""
    reasons = []
    tp, pp, dp, cp = (num(row[k]) for k in ("tp", "pp", "dp", "cp"))
    if tp is None or pp is None or dp is None:
        return None, 0, ["parallel configuration (tp, pp, dp) not given in the source"]
    cp = cp or 1
    gpus = tp * pp * dp * cp if src.gpus_from_config else int(row["num_gpus"])
    if tp * pp * dp * cp != gpus:
        reasons.append(f"tp·pp·dp·cp = {tp * pp * dp * cp} is not the {gpus} GPUs")
    vpp = num(row["vpp"]) if row["vpp"].strip() else 1
    if vpp is None and src.vpp:
        vpp = src.vpp(row)
    if vpp is None:
        reasons.append(f"vpp '{row['vpp']}': the number of virtual stages is not stated")
        vpp = 1
    layers = int(row["layers"])
    counted = 2 if src.counted_split and vpp > 1 else 0  # the embedding and the loss
    if pp * vpp > layers + counted:
        reasons.append(f"pp·vpp = {pp * vpp} exceeds the {layers + counted} layers")
    # pp·vpp not dividing the layers: uneven stages, which predict splits by the stage balancer
    # (the sources do not state their split); such rows are reported apart (uneven_or_etp).
    ep = num(row["ep"]) or 1
    etp = num(row["etp"]) or src.etp
    recompute, modules, why = recompute_of(row, src)
    if why:
        reasons.append(why)
    if src.not_modelled:
        reasons.append(src.not_modelled)
    gbs = int(row["gbs"])
    mbs = num(row["mbs"]) or src.mbs or gbs // dp
    spec = f"tp={tp},pp={pp},dp={dp},"
    if src.era != "2020-2022":
        spec += f"cp={cp}," + ("cp_comm=allgather," if cp > 1 and src.cp_allgather else "")
        spec += f"ep={ep},"
    if ep > 1 and etp and etp != tp:
        spec += f"etp={etp},"
    if ep > 1 and src.flex_dispatcher:
        spec += "dispatcher=flex,"
    spec += f"vpp={vpp},"
    if src.counted_split and vpp > 1:
        spec += "split_embedding=on,split_loss=on,"
    spec += f"mbs={mbs},sp={sp_of(row, src, tp)},recompute={recompute}"
    if modules:
        spec += f",recompute_modules={modules}"
    if src.dist_opt:
        stated_off = row["dist_opt_zero"].strip().lower().startswith("no")
        spec += f",dist_opt={'off' if stated_off else src.dist_opt}"
    return spec, tp * pp * dp * cp, reasons


def preset_of(row):
    """'LLAMA2-7B' -> llama2-7b, 'Llama 3 405B' -> llama3-405b."""
    name = re.sub(r"llama\s*(\d)", r"llama\1", row["model"].strip().lower())
    return re.sub(r"\s+", "-", name)


def model_flags(row, src):
    """The model from the columns (Megatron flags), on top of a preset where the source uses
    one; the architecture the columns cannot say (activation, norm, ...) is the source's."""
    flags = ["--model", preset_of(row)] if src.preset else list(src.arch)
    flags += ["--num-layers", row["layers"], "--hidden-size", row["hidden"],
              "--num-attention-heads", row["heads"], "--ffn-hidden-size", str(dense_ffn(row)),
              "--vocab-size", row["vocab"], "--seq-length", row["seq_len"],
              "--max-position-embeddings", row["seq_len"]]
    g = num(row["kv_heads"])
    if g and g != int(row["heads"]):
        flags += ["--group-query-attention", "--num-query-groups", str(g)]
    if expert_ffn(row):
        flags += ["--num-experts", row["moe_experts"], "--moe-router-topk", row["moe_topk"],
                  "--moe-ffn-hidden-size", str(expert_ffn(row))]
    return flags


def command(row, src, spec, world):
    gpu, gpn = gpu_of(row)
    if src.gpus_from_config:
        nnodes, gpn = max(1, world // gpn), min(world, gpn)
    else:
        nnodes, gpn = nodes_of(row, gpn)
    cmd = [BIN, "predict", "--format", "json", "--gpu", gpu, "--nnodes", str(nnodes),
           "--nproc-per-node", str(gpn)] + model_flags(row, src) + [
           "--global-batch-size", row["gbs"], "--config", spec] + src.stack
    if row["source_key"] in NO_OVERLAP:
        cmd.append("--no-overlap-grad-reduce")
    return cmd


def run(cmd):
    """The estimate; None and the message when the binary refuses the input (exit 2)."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise BinaryFailure(f"{cmd[0]}: {e}") from e
    if out.returncode == 2:
        return None, out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "exit 2"
    # Exit 3: the model says the configuration does not fit; its estimate is printed all the same
    # (the published runs did fit, so the time is still compared).
    if out.returncode not in (0, 3):
        raise BinaryFailure(f"exit {out.returncode}: {' '.join(cmd)}\n{out.stderr}")
    try:
        return json.loads(out.stdout)["configs"][0], None
    except (ValueError, KeyError, IndexError) as e:
        raise BinaryFailure(f"unreadable output ({e}): {' '.join(cmd)}\n{out.stdout}") from e


# ---- the source's metric, predicted ----

def metric_of(row, src):
    if src.metric == "tflops" and row["metric_unit"].strip() == "%":
        return "mfu"  # MFU: the same FLOPs over the GPU's dense peak
    return src.metric


def predicted_value(metric, row, src, est, world):
    """The estimate in the source's metric. Throughput: the source's FLOPs per iteration over the
    predicted step and the GPUs (= the tool's model_tflops_per_gpu × F_source / F_tool)."""
    step = est["step_time_s"]
    if metric == "tflops":
        return src.flops(row) / step / world / 1e12
    if metric == "mfu":
        peak = est["model_tflops_per_gpu"] / est["mfu"]
        return 100 * src.flops(row) / step / world / 1e12 / peak
    if metric == "layer_ms":
        b = est["breakdown"]
        return 1e3 * (b["layer_forward_s"] + b["layer_backward_s"])
    if metric == "iteration_s":
        return step
    return 1e3 * step


def result_of(row, src, spec, world, est):
    metric = metric_of(row, src)
    measured = float(row["metric_value"].strip().rstrip("%"))
    predicted = predicted_value(metric, row, src, est, world)
    ratio = None
    if src.flops and est["model_tflops_per_gpu"] > 0:
        ratio = src.flops(row) / (est["model_tflops_per_gpu"] * 1e12 * est["step_time_s"] * world)
    return {"id": row["id"], "source": row["source_key"], "era": src.era, "model": row["model"],
            "cluster": (row["gpu_norm"], world), "seq": int(row["seq_len"]), "metric": metric,
            "spec": spec, "measured": measured, "predicted": predicted,
            "err": (predicted - measured) / measured, "flops_ratio": ratio,
            "uneven_or_etp": uneven_or_etp(row, spec),
            "fits": est["fits"], "peak_gib": est["peak_memory_gib"]}


def uneven_or_etp(row, spec):
    """Whether the row needs uneven pipeline stages or an etp other than tp (issue 12): rows the
    model could not express before, reported apart."""
    cfg = dict(kv.split("=") for kv in spec.split(","))
    stages = int(cfg["pp"]) * int(cfg["vpp"])
    return int(row["layers"]) % stages != 0 or "etp" in cfg


# ---- statistics ----

def sign(x):
    return (x > 0) - (x < 0)


def kendall_tau_b(xs, ys):
    """Kendall's tau-b of two equally long sequences; None when xs has no untied pair (nothing
    to rank); 0 when xs has one but ys ties every pair (no ranking predicted)."""
    n = len(xs)
    concordant = discordant = ties_x = ties_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = sign(xs[i] - xs[j]), sign(ys[i] - ys[j])
            ties_x += dx == 0
            ties_y += dy == 0
            concordant += dx * dy > 0
            discordant += dx * dy < 0
    pairs = n * (n - 1) // 2
    if pairs - ties_x == 0:
        return None
    if pairs - ties_y == 0:
        return 0.0
    return (concordant - discordant) / ((pairs - ties_x) * (pairs - ties_y)) ** 0.5


def grouped_tau(results):
    """(tau, groups): tau-b inside each group of >= 2 rows sharing model, cluster, sequence length
    and metric, averaged with each group weighted by its pairs; (None, 0) without such a group."""
    groups = {}
    for r in results:
        groups.setdefault((r["model"], r["cluster"], r["seq"], r["metric"]), []).append(r)
    weighted = weight = counted = 0
    for members in groups.values():
        if len(members) < 2:
            continue
        tau = kendall_tau_b([m["measured"] for m in members], [m["predicted"] for m in members])
        if tau is None:
            continue
        pairs = len(members) * (len(members) - 1) // 2
        weighted += tau * pairs
        weight += pairs
        counted += 1
    return (weighted / weight if weight else None), counted


def speed_error(r):
    """The signed error as speed: + when the model predicts a faster step than measured."""
    return -r["err"] if r["metric"] in TIME_METRICS else r["err"]


def summarize(results):
    """rows, MAPE, median and max APE, bias (signed mean speed error), tau, groups; fractions."""
    if not results:
        return {"rows": 0}
    ape = [abs(r["err"]) for r in results]
    tau, groups = grouped_tau(results)
    return {"rows": len(results), "mape": statistics.mean(ape), "median": statistics.median(ape),
            "max": max(ape), "bias": statistics.mean(speed_error(r) for r in results),
            "tau": tau, "groups": groups}


# ---- the report ----

def evaluate(rows):
    """(results, skipped): the rows predicted, and (row, reason) for those the model cannot
    express. BinaryFailure when the binary fails."""
    results, skipped = [], []
    for row in rows:
        src = SOURCES.get(row["source_key"])
        if src is None:
            skipped.append((row, f"source {row['source_key']} has no profile in SOURCES"))
            continue
        spec, world, reasons = config_of(row, src)
        if reasons:
            skipped.append((row, "; ".join(reasons)))
            continue
        est, refusal = run(command(row, src, spec, world))
        if refusal:
            skipped.append((row, f"the tool refuses it: {refusal}"))
            continue
        results.append(result_of(row, src, spec, world, est))
    return results, skipped


def print_rows(results, skipped, total):
    """Per-row lines and the summary of one file, in the format of before."""
    width = max([62] + [len(r["spec"]) for r in results])
    print(f"{'id':6} {'source':22} {'model':14} {'config':{width}} {'metric':>16} "
          f"{'measured':>9} {'predicted':>9} {'error':>7}")
    for r in results:
        print(f"{r['id']:6} {r['source']:22} {r['model'][:14]:14} {r['spec']:{width}} "
              f"{METRIC_LABEL[r['metric']]:>16} {r['measured']:9.2f} {r['predicted']:9.2f} "
              f"{100 * r['err']:+6.1f}%")
    print(f"\nrows predicted: {len(results)} of {total}")
    s = summarize(results)
    if s["rows"]:
        print(f"MAPE: {100 * s['mape']:.1f}%   median APE: {100 * s['median']:.1f}%   "
              f"max APE: {100 * s['max']:.1f}%")
    # The published runs ran: a configuration the model puts over the GPU's memory is a memory
    # model (or a software stack) that differs from the source's there. Not for a one-layer
    # timing (layer_ms), which the source may have taken from a model cut to fewer layers.
    over = [r for r in results if not r["fits"] and r["metric"] != "layer_ms"]
    if over:
        print("the model puts over the GPU's memory (the source ran them): " + ", ".join(
            f"{r['id']} {r['peak_gib']:.1f} GiB" for r in over))
    if skipped:
        print("skipped (the model cannot express them):")
        for row, reason in skipped:
            print(f"  {row['id']:6} {row['source_key']:22} {reason}")


def percent(x):
    return f"{100 * x:.1f}%"


def table_line(name, era, s, skipped, ratios=""):
    if not s["rows"]:
        return f"{name:22} {era:9} {0:>5} {skipped:>7}   (no row expressed)"
    tau = "n/a" if s["tau"] is None else f"{s['tau']:+.2f}"
    return (f"{name:22} {era:9} {s['rows']:>5} {skipped:>7} {percent(s['mape']):>6} "
            f"{percent(s['median']):>6} {percent(s['max']):>6} {100 * s['bias']:>+6.1f}% "
            f"{tau:>5} ({s['groups']}) {ratios}".rstrip())


def ratio_range(results):
    """The source's FLOPs over the tool's (model_tflops_per_gpu), min-max over the rows."""
    ratios = [r["flops_ratio"] for r in results if r["flops_ratio"]]
    if not ratios:
        return ""
    lo, hi = min(ratios), max(ratios)
    return f"{lo:.2f}" if hi - lo < 0.005 else f"{lo:.2f}-{hi:.2f}"


def era_of(key):
    return SOURCES[key].era if key in SOURCES else "?"


def table(results, skipped):
    """[(name, era, summary, skipped, FLOPs ratio)]: each source in order of appearance, then all
    rows, then each era."""
    keys = list(dict.fromkeys([r["source"] for r in results] +
                              [row["source_key"] for row, _ in skipped]))
    lines = []
    for key in keys:
        mine = [r for r in results if r["source"] == key]
        n_skipped = sum(row["source_key"] == key for row, _ in skipped)
        lines.append((key, era_of(key), summarize(mine), n_skipped, ratio_range(mine)))
    lines.append(("all", "", summarize(results), len(skipped), ""))
    for era in ("2020-2022", "2024"):
        mine = [r for r in results if r["era"] == era]
        n_skipped = sum(era_of(row["source_key"]) == era for row, _ in skipped)
        lines.append((era, "", summarize(mine), n_skipped, ""))
    # The rows uneven stages and etp made expressible, and the others, apart.
    lines.append(("uneven stages or etp", "", summarize([r for r in results if r.get("uneven_or_etp")]),
                  0, ""))
    lines.append(("the other rows", "", summarize([r for r in results if not r.get("uneven_or_etp")]),
                  len(skipped), ""))
    return lines


def print_table(results, skipped):
    print(f"\n{'source':22} {'era':9} {'rows':>5} {'skipped':>7} {'MAPE':>6} {'median':>6} "
          f"{'max':>6} {'bias':>7} {'tau':>5} (groups) FLOPs source/tool")
    for line in table(results, skipped):
        print(table_line(*line))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="*", default=DEFAULT_CSVS,
                        help="calibration files (default: published.csv, published_2024.csv)")
    args = parser.parse_args(argv)
    all_results, all_skipped = [], []
    try:
        for i, path in enumerate(args.csv):
            try:
                with open(path, newline="") as f:
                    rows = list(csv.DictReader(f))
            except OSError as e:
                print(f"bench_accuracy: cannot read the calibration file: {e}", file=sys.stderr)
                return 2
            results, skipped = evaluate(rows)
            print(("\n" if i else "") + f"== {os.path.basename(path)} ==")
            print_rows(results, skipped, len(rows))
            all_results += results
            all_skipped += skipped
    except BinaryFailure as e:
        print(f"bench_accuracy: the binary failed: {e}", file=sys.stderr)
        return 1
    print_table(all_results, all_skipped)
    print("\nbias: + = the model predicts a faster step than measured. tau: Kendall's tau-b "
          "inside groups sharing model, cluster, sequence length and metric (groups counted).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
