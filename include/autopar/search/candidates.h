// CandidateSet: the configurations the online search may propose, with the analytic model's
// feature matrix precomputed once (DESIGN §4).
//
// The step time of candidate i under coefficients θ is t_i(θ) = Σ_k θ_k·x_ik + θ₀, with x_ik the
// component times of CostModel::Time (seconds, θ = 1 gives the analytic prediction) and θ₀ a
// constant per-step overhead in seconds. A proposal evaluates every candidate, so the matrix is
// stored feature-major: one contiguous column per coefficient makes X·θ a handful of vectorised
// axpy passes (about 1 ms for 100,000 candidates).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "autopar/perf/cost_model.h"
#include "autopar/space/config.h"
#include "autopar/space/space.h"

namespace autopar::search {

// Coefficient layout: θ_k for Feature k in [0, kNumFeatures), then the intercept θ₀.
inline constexpr int kIntercept = kNumFeatures;
inline constexpr int kNumCoefficients = kNumFeatures + 1;

class CandidateSet {
 public:
  // `configs` must be complete (dp set) and distinct; throws std::invalid_argument otherwise.
  // `memory_capacity_gib` is the device memory a trial may use.
  CandidateSet(std::vector<ParallelConfig> configs, const CostModel& model,
               double memory_capacity_gib);

  // Every valid configuration of `space`, in its enumeration order.
  static CandidateSet FromSpace(const SearchSpace& space, const CostModel& model);

  int64_t size() const { return static_cast<int64_t>(configs_.size()); }
  const ParallelConfig& config(int64_t i) const { return configs_[i]; }
  const std::vector<ParallelConfig>& configs() const { return configs_; }
  double feature(int64_t i, int k) const { return columns_[k][i]; }
  const std::vector<double>& column(int k) const { return columns_[k]; }
  // The analytic prediction (θ = 1, θ₀ = 0) and the analytic peak memory of the most loaded rank.
  double nominal_time_s(int64_t i) const { return nominal_time_s_[i]; }
  double nominal_memory_gib(int64_t i) const { return nominal_memory_gib_[i]; }
  double capacity_gib() const { return capacity_gib_; }
  double median_nominal_time_s() const { return median_time_s_; }

  std::optional<int64_t> Find(const ParallelConfig& c) const;
  // Hash of every candidate's canonical text, features and memory, in order: a study resumed
  // with another build of the analytic model (or another space) has a different fingerprint.
  uint64_t fingerprint() const { return fingerprint_; }

  // out[i] = t_i(θ) for every candidate; θ has kNumCoefficients entries.
  void Predict(const double* theta, std::vector<double>* out) const;
  // t_i(θ) for one candidate.
  double PredictOne(int64_t i, const double* theta) const;

 private:
  std::vector<ParallelConfig> configs_;
  std::vector<double> columns_[kNumFeatures];
  std::vector<double> nominal_time_s_, nominal_memory_gib_;
  std::unordered_map<std::string, int64_t> index_;
  double capacity_gib_ = 0;
  double median_time_s_ = 0;
  uint64_t fingerprint_ = 0;
};

}  // namespace autopar::search
