// Small specs shared by the space and perf tests, built by hand so the tests do not depend on
// the preset tables.
#pragma once

#include "autopar/spec/cluster.h"
#include "autopar/spec/model.h"
#include "autopar/spec/train.h"

namespace autopar::testing {

inline ModelSpec TinyModel() {
  ModelSpec m;
  m.name = "tiny";
  m.num_layers = 4;
  m.hidden_size = 64;
  m.ffn_hidden_size = 176;
  m.num_attention_heads = 4;
  m.num_query_groups = 2;
  m.vocab_size = 256;
  m.max_position_embeddings = 64;
  return m;
}

inline ClusterSpec SmallCluster(int64_t nnodes, int64_t gpus_per_node) {
  ClusterSpec c;
  c.nnodes = nnodes;
  c.gpus_per_node = gpus_per_node;
  c.gpu.name = "test-gpu";
  c.gpu.memory_gib = 80;
  c.gpu.peak_flops_bf16 = c.gpu.peak_flops_fp16 = 300e12;
  c.gpu.peak_flops_fp32 = 20e12;
  c.gpu.hbm_bandwidth = 2e12;
  c.gpu.intra_node_bandwidth = 300e9;
  c.gpu.intra_node_latency_s = 5e-6;
  c.gpu.inter_node_bandwidth = 25e9;
  c.gpu.inter_node_latency_s = 10e-6;
  return c;
}

inline TrainSpec SmallTrain(int64_t gbs, int64_t seq) {
  TrainSpec t;
  t.global_batch_size = gbs;
  t.seq_length = seq;
  return t;
}

}  // namespace autopar::testing
