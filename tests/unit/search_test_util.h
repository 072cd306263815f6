// Candidate sets and a synthetic "truth" shared by the search and coord tests.
#pragma once

#include <cmath>
#include <memory>
#include <vector>

#include "autopar/perf/cost_model.h"
#include "autopar/search/candidates.h"
#include "autopar/search/rng.h"
#include "autopar/search/state.h"
#include "autopar/space/space.h"
#include "autopar/spec/parse.h"

namespace autopar::testing {

// llama2-7b on 2 x 8 A100-80GB, global batch 64 x 4096: a few hundred candidates.
struct Llama7bCase {
  ModelSpec model = ModelPreset("llama2-7b");
  TrainSpec train;
  ClusterSpec cluster;
  PerfConstants constants;
  std::unique_ptr<SearchSpace> space;
  std::unique_ptr<CostModel> cost;
  std::unique_ptr<search::CandidateSet> candidates;

  explicit Llama7bCase(int64_t nnodes = 2, int64_t gbs = 64) {
    train.global_batch_size = gbs;
    train.seq_length = 4096;
    cluster.nnodes = nnodes;
    cluster.gpus_per_node = 8;
    cluster.gpu = GpuPreset("a100-80gb");
    constants = DefaultConstants(cluster.gpu.name);
    space = std::make_unique<SearchSpace>(model, train, cluster, SpaceOptions{});
    cost = std::make_unique<CostModel>(model, train, cluster, constants);
    candidates =
        std::make_unique<search::CandidateSet>(search::CandidateSet::FromSpace(*space, *cost));
  }
};

// A mis-specified truth: every feature scaled by its own factor, plus per-config noise.
struct SyntheticTruth {
  std::vector<double> step_time_s;
  SyntheticTruth(const search::CandidateSet& cs, uint64_t seed, double noise = 0.03) {
    search::Rng rng(seed, 0, search::Purpose::kSynthetic);
    std::vector<double> theta(static_cast<size_t>(cs.num_coefficients()), 0.0);
    for (int k = 0; k < kNumFeatures; ++k) {
      theta[k] = search::IsCommunication(k)
                     ? std::exp(std::log(0.5) + rng.Uniform() * std::log(4.0))
                     : 0.8 + 0.4 * rng.Uniform();
    }
    for (int64_t i = 0; i < cs.size(); ++i) {
      step_time_s.push_back(cs.PredictOne(i, theta.data()) * std::exp(noise * rng.Normal()));
    }
  }
};

}  // namespace autopar::testing
