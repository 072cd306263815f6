// FP8 training's own terms (docs/models.md §3.2, §4.2, §5): Transformer Engine's casts counted
// from a layer's shapes, the FP8 copies it keeps, and nothing of it in a BF16 run.
#include <gtest/gtest.h>

#include "autopar/perf/cost_model.h"
#include "autopar/spec/parse.h"
#include "src/perf/fp8.h"

namespace autopar {
namespace {

constexpr double kT = 4096;  // one sequence of 4096 tokens, mbs 1

ModelSpec Llama2() { return ModelPreset("llama2-7b"); }  // h 4096, ffn 11008, MHA, SwiGLU

ClusterSpec Node(const std::string& gpu) {
  ClusterSpec c;
  c.nnodes = 1;
  c.gpus_per_node = 8;
  c.gpu = GpuPreset(gpu);
  return c;
}

TrainSpec Train(Precision p) {
  TrainSpec t;
  t.global_batch_size = 8;
  t.seq_length = static_cast<int64_t>(kT);
  t.precision = p;
  return t;
}

ParallelConfig Config(const std::string& spec) { return Complete(ParseSpec(spec), 8); }

// One dense layer at tp = 1 on Hopper (e = 2, a transposed copy of every operand): forward, the
// QKV and fc1 inputs come from fused norms writing FP8 (1 − e bytes) plus a transpose (2), the
// projection and fc2 inputs are cast (e + 1 + 1); backward, each output gradient is cast (4).
TEST(Fp8Layer, CastBytesOfADenseLayerFromItsShapes) {
  const double h = 4096, ffn = 11008;
  const Fp8LayerTraffic hopper = Fp8Layer(Llama2(), Config("tp=1,pp=1"), kT, 2, true, false);
  EXPECT_DOUBLE_EQ(hopper.forward_bytes, 2 * (-1 + 2) * kT * h + 4 * kT * h + 4 * kT * ffn);
  EXPECT_DOUBLE_EQ(hopper.backward_bytes, 4 * kT * (3 * h + h + 2 * ffn + h));
  // Saved: the two norm outputs in FP8 (1 byte less each), the projection's extra FP8 copy of
  // the attention output, the activation output in FP8.
  EXPECT_DOUBLE_EQ(hopper.saved_delta_bytes, -2 * kT * h + kT * h - kT * ffn);
  EXPECT_DOUBLE_EQ(hopper.routed_saved_delta_bytes, 0);

  // Blackwell: no transposed copies.
  const Fp8LayerTraffic blackwell = Fp8Layer(Llama2(), Config("tp=1,pp=1"), kT, 2, false, false);
  EXPECT_DOUBLE_EQ(blackwell.forward_bytes, 2 * -1 * kT * h + 3 * kT * h + 3 * kT * ffn);
  EXPECT_DOUBLE_EQ(blackwell.backward_bytes, 3 * kT * (3 * h + h + 2 * ffn + h));
  EXPECT_DOUBLE_EQ(blackwell.saved_delta_bytes, hopper.saved_delta_bytes);
}

// Under tp = 4 with SP a rank casts its quarter of the rows of a column-parallel input, gathers
// the FP8 copy and transposes the gathered rows in backward.
TEST(Fp8Layer, SequenceParallelTransposesTheGatheredRowsInBackward) {
  const double h = 4096, ffn = 11008 / 4.0, t = 4;
  const Fp8LayerTraffic q = Fp8Layer(Llama2(), Config("tp=4,pp=1,sp=on"), kT, 2, true, false);
  EXPECT_DOUBLE_EQ(q.forward_bytes, 2 * -1 * kT / t * h + 4 * kT * h / t + 4 * kT * ffn);
  const double row_parallel_grad = 3 * kT / t * h + 2 * kT * h;
  EXPECT_DOUBLE_EQ(q.backward_bytes,
                   2 * 2 * kT * h + 4 * kT * 3 * h / t + 4 * kT * 2 * ffn + 2 * row_parallel_grad);
}

// The memory of an FP8 run against the same BF16 run: the activations differ by the saved
// delta of every layer (one micro-batch in flight at pp = 1), the weights by TE's cached FP8
// copies (2 bytes per linear weight on Hopper); gradients and optimizer do not change.
TEST(Fp8Memory, SmallerActivationsAndCachedWeightsByTheExpectedBytes) {
  const ModelSpec m = Llama2();
  const ClusterSpec cluster = Node("h100");
  const ParallelConfig c = Config("tp=1,pp=1,dist_opt=on");
  const MemoryBreakdown bf16 =
      CostModel(m, Train(Precision::kBF16), cluster, DefaultConstants("h100")).Memory(c);
  const MemoryBreakdown fp8 =
      CostModel(m, Train(Precision::kFP8), cluster, DefaultConstants("h100")).Memory(c);
  const Fp8LayerTraffic layer = Fp8Layer(m, c, kT, 2, true, false);
  EXPECT_LT(layer.saved_delta_bytes, 0);
  EXPECT_NEAR(fp8.activations - bf16.activations, m.num_layers * layer.saved_delta_bytes, 1);
  const ParamCounts p = CountParams(m);
  const double linear = static_cast<double>(p.dense_layer() - p.norms_per_layer);
  EXPECT_NEAR(fp8.weights - bf16.weights, 2 * m.num_layers * linear, 1);
  EXPECT_DOUBLE_EQ(fp8.gradients, bf16.gradients);
  EXPECT_DOUBLE_EQ(fp8.optimizer, bf16.optimizer);
  EXPECT_DOUBLE_EQ(fp8.logits, bf16.logits);
}

// The step's memory-bound time of an FP8 run is the BF16 run's plus the casts of every
// micro-batch slot and one cast of the weights a step; collectives do not change without SP.
TEST(Fp8Time, CastsAreMemoryBoundTrafficOnTopOfTheBf16Kernels) {
  const ModelSpec m = Llama2();
  const ClusterSpec cluster = Node("h100");
  const PerfConstants k = DefaultConstants("h100");
  const ParallelConfig c = Config("tp=1,pp=1,dist_opt=on");
  const TimeBreakdown bf16 = CostModel(m, Train(Precision::kBF16), cluster, k).Time(c);
  const TimeBreakdown fp8 = CostModel(m, Train(Precision::kFP8), cluster, k).Time(c);
  const Fp8LayerTraffic layer = Fp8Layer(m, c, kT, 2, true, false);
  const double hbm = cluster.gpu.hbm_bandwidth * k.eff.memory_bound;
  const ParamCounts p = CountParams(m);
  const double weights = m.num_layers * static_cast<double>(p.dense_layer() - p.norms_per_layer);
  const double casts =
      fp8.microbatches * m.num_layers * (layer.forward_bytes + layer.backward_bytes) / hbm +
      (2 + 2) * weights / hbm;
  EXPECT_NEAR(fp8.features[kMemoryBound], bf16.features[kMemoryBound] + casts, 1e-9);
  EXPECT_DOUBLE_EQ(fp8.features[kTpComm], bf16.features[kTpComm]);
  EXPECT_DOUBLE_EQ(fp8.features[kAttention], bf16.features[kAttention]);  // BF16 attention
  // The layers' GEMMs run at the FP8 peak times Fp8Traits::gemm_ratio; the logits stay BF16.
  const double ratio = Fp8TraitsOf("h100").gemm_ratio;
  EXPECT_LT(ratio, 1);
  const double speedup = cluster.gpu.peak_flops_fp8 * ratio / cluster.gpu.peak_flops_bf16;
  EXPECT_LT(fp8.features[kGemm], bf16.features[kGemm]);
  EXPECT_GT(fp8.features[kGemm], bf16.features[kGemm] / speedup);
}

// With SP, TE all-gathers FP8 copies: two of the four gathers and scatters each way move one
// byte an element (counted here with every backward collective exposed).
TEST(Fp8Time, SequenceParallelGathersFp8) {
  const ModelSpec m = Llama2();
  const ClusterSpec cluster = Node("h100");
  PerfConstants k = DefaultConstants("h100");
  k.stack.async_tp_backward = false;
  const ParallelConfig c = Config("tp=4,pp=1,sp=on");
  const CostModel bf16(m, Train(Precision::kBF16), cluster, k);
  const CostModel fp8(m, Train(Precision::kFP8), cluster, k);
  const double per_slot = fp8.Time(c).features[kTpComm] / fp8.Time(c).microbatches;
  const double gather_bf16 = bf16.AllGatherTime(2 * kT * m.hidden_size, 4, 1);
  const double gather_fp8 = bf16.AllGatherTime(kT * m.hidden_size, 4, 1);
  // Per layer and micro-batch: forward and backward, each 2 FP8 gathers and 2 BF16 scatters;
  // the last stage's final-norm gather (BF16, for the BF16 logits) once each way.
  EXPECT_NEAR(per_slot, m.num_layers * 2 * (2 * gather_fp8 + 2 * gather_bf16) + 2 * gather_bf16,
              1e-12);
  EXPECT_LT(fp8.Time(c).features[kTpComm], bf16.Time(c).features[kTpComm]);
}

// FP8 parameters (fp8_param_gather, Megatron's --fp8-param-gather): the linear weights lose
// their BF16 copy (2 bytes each), nothing else in memory moves; the distributed optimizer's
// gather moves them in one byte; the step writes only their transposes (Hopper: read and write a
// byte each) instead of quantizing BF16 weights; the optimizer goes through a BF16 copy of its
// shard and quantizes it (3 bytes more per element of the shard).
TEST(Fp8Params, NoBf16CopyOneByteGatherAndTheCastMovedToTheOptimizer) {
  const ModelSpec m = Llama2();
  const ClusterSpec cluster = Node("h100");
  const PerfConstants k = DefaultConstants("h100");
  const CostModel model(m, Train(Precision::kFP8), cluster, k);
  const ParallelConfig plain = Config("tp=1,pp=1,dp=8,dist_opt=on");
  ParallelConfig fp8_params = plain;
  fp8_params.fp8_param_gather = true;
  const ParamCounts p = CountParams(m);
  const double linear = m.num_layers * static_cast<double>(p.dense_layer() - p.norms_per_layer);

  const MemoryBreakdown before = model.Memory(plain), after = model.Memory(fp8_params);
  EXPECT_NEAR(before.weights - after.weights, 2 * linear, 1);
  EXPECT_DOUBLE_EQ(after.gradients, before.gradients);
  EXPECT_DOUBLE_EQ(after.optimizer, before.optimizer);
  EXPECT_DOUBLE_EQ(after.activations, before.activations);

  const TimeBreakdown t0 = model.Time(plain), t1 = model.Time(fp8_params);
  const double hbm = cluster.gpu.hbm_bandwidth * k.eff.memory_bound;
  EXPECT_NEAR(t0.features[kMemoryBound] - t1.features[kMemoryBound], (2 + 2 - 2) * linear / hbm,
              1e-9);
  EXPECT_NEAR(t1.features[kOptimizer] - t0.features[kOptimizer], 3 * linear / 8 / hbm, 1e-12);
  // The gather (not overlapped here) moves the linear weights in one byte, the rest in two.
  ParallelConfig exposed = plain;
  exposed.overlap_grad_reduce = exposed.overlap_param_gather = false;
  ParallelConfig exposed_fp8 = exposed;
  exposed_fp8.fp8_param_gather = true;
  const double total = static_cast<double>(p.total());
  const double gather_saved =
      model.AllGatherTime(2 * total, 8, 1) - model.AllGatherTime(2 * total - linear, 8, 1);
  EXPECT_GT(gather_saved, 0);
  EXPECT_NEAR(model.Time(exposed).features[kDpComm] - model.Time(exposed_fp8).features[kDpComm],
              gather_saved, 1e-12);
  // On Blackwell there is no transpose to write: the step's weight cast is gone altogether.
  const ClusterSpec b200 = Node("b200");
  const PerfConstants kb = DefaultConstants("b200");
  const CostModel blackwell(m, Train(Precision::kFP8), b200, kb);
  EXPECT_NEAR(blackwell.Time(plain).features[kMemoryBound] -
                  blackwell.Time(fp8_params).features[kMemoryBound],
              (2 + 1) * linear / (b200.gpu.hbm_bandwidth * kb.eff.memory_bound), 1e-9);
}

// A BF16 run carries nothing of FP8: the same prediction whatever the GPU's FP8 traits.
TEST(Fp8Time, Bf16RunsDoNotDependOnTheFp8Traits) {
  const ModelSpec m = Llama2();
  ClusterSpec hopper = Node("h100"), renamed = Node("h100");
  renamed.gpu.name = "my-h100";  // Fp8TraitsOf: the default traits
  ASSERT_NE(Fp8TraitsOf(hopper.gpu.name).gemm_ratio, Fp8TraitsOf(renamed.gpu.name).gemm_ratio);
  const PerfConstants k = DefaultConstants("h100");
  for (const char* spec : {"tp=1,pp=1", "tp=4,pp=2,sp=on,dist_opt=on"}) {
    const ParallelConfig c = Config(spec);
    const Estimate a = CostModel(m, Train(Precision::kBF16), hopper, k).Evaluate(c);
    const Estimate b = CostModel(m, Train(Precision::kBF16), renamed, k).Evaluate(c);
    // (The attention core differs: the flash kernels' shape law is keyed on the name too.)
    for (int f = 0; f < kNumFeatures; ++f) {
      if (f == kAttention) continue;
      EXPECT_EQ(a.time.features[f], b.time.features[f]) << spec << " " << f;
    }
    EXPECT_DOUBLE_EQ(a.memory.total(), b.memory.total()) << spec;
  }
}

TEST(Fp8Traits, HopperTransposesBlackwellDoesNot) {
  EXPECT_TRUE(Fp8TraitsOf("h100").transposed_copy);
  EXPECT_TRUE(Fp8TraitsOf("H200").transposed_copy);
  EXPECT_FALSE(Fp8TraitsOf("b200").transposed_copy);
  EXPECT_FALSE(Fp8TraitsOf("gb300").transposed_copy);
  EXPECT_NEAR(Fp8TraitsOf("h100").gemm_ratio, 0.89, 1e-12);
  EXPECT_NEAR(Fp8TraitsOf("b200").gemm_ratio, 0.96, 1e-12);
}

}  // namespace
}  // namespace autopar
