// The small job every numerical trial test runs, on the CPU and the CUDA platform alike.
#pragma once

#include "autopar/trial/trial.h"
#include "src/trial/groups.h"
#include "src/trial/shard.h"

namespace autopar::trial::testing {

// 8 sequences of 64 tokens.
inline TrainSpec SmallTrain(Precision precision) {
  TrainSpec t;
  t.global_batch_size = 8;
  t.seq_length = 64;
  t.precision = precision;
  return t;
}

// Every micro-batch, two steps (the second reads Adam's moments of the first), weight
// fingerprints, and Adam's eps raised so the update is proportional to the gradient.
inline TrialOptions NumericOptions() {
  TrialOptions o;
  o.warmup_iterations = 0;
  o.timed_iterations = 2;
  o.max_microbatches = -1;
  o.fingerprint = true;
  o.learning_rate = 1e-2f;
  o.adam_eps = 1.0f;
  o.timeout_s = 120;
  return o;
}

// A MoE layer wholly on one rank: 2 sequences of `seq` tokens of width `hidden`, routed top-`topk`
// over `experts` SwiGLU experts of width `ffn`, by the all-to-all or the flex dispatcher.
inline Shapes OneRankMoe(int64_t seq, int64_t hidden, int64_t experts, int64_t topk, int64_t ffn,
                         bool flex) {
  Shapes s{};
  s.tp = s.pp = s.vpp = s.cp = s.up = 1;
  s.mbs = 2;
  s.seq = s.seq_local = seq;
  s.tokens = s.local_tokens = s.mbs * s.seq;
  s.hidden = hidden;
  s.experts = s.local_experts = experts;
  s.topk = topk;
  s.etp = 1;
  s.expert_ffn = ffn;
  s.swiglu = true;
  s.flex = flex;
  return s;
}

// A MoE layer's weights over one flat tensor `w` (the router [E, h], then each expert's fc1
// [2·ffn, h] and fc2 [h, ffn]) and their gradients over `dw`, laid out alike.
inline LayerWeights MoeWeights(const Shapes& s, device::Tensor w, device::Tensor dw) {
  const int64_t router = s.experts * s.hidden, fc1 = 2 * s.expert_ffn * s.hidden;
  const int64_t fc2 = s.hidden * s.expert_ffn;
  LayerWeights lw;
  lw.moe = true;
  lw.router = w.Slice(0, router);
  lw.d_router = dw.Slice(0, router);
  for (int64_t e = 0; e < s.experts; ++e) {
    const int64_t at = router + e * (fc1 + fc2);
    lw.experts.push_back(
        {w.Slice(at, fc1), w.Slice(at + fc1, fc2), dw.Slice(at, fc1), dw.Slice(at + fc1, fc2)});
  }
  return lw;
}

}  // namespace autopar::trial::testing
