// CandidateSet: the configurations the online search may propose, with the analytic model's
// feature matrix precomputed once (docs/search.md §1).
//
// The step time of candidate i under coefficients θ is
//
//   t_i(θ) = Σ_k θ_k·x_ik + θ₀ + ŷ_i · (Σ_q δ_{q, c_i(q)} + Σ_{q<r} γ_{qr, c_i(q), c_i(r)})
//
// with x_ik the component times of CostModel::Time (seconds, θ = 1 gives the analytic prediction
// ŷ_i = Σ_k x_ik), θ₀ a constant per-step overhead in seconds, and δ the level effects: for each
// knob q that takes more than one value in the set (tp, pp, ..., recompute, dist_opt), one relative
// correction per value, the model discrepancy (Kennedy & O'Hagan 2001) that the component scales
// cannot express. Recompute costing more than its extra forward, an interleaved schedule filling
// bubbles with other ranks' work on shared cores, a micro-batch size the kernels like: each is a
// relative effect shared by every configuration with that value, which the posterior learns from
// a few of them and carries to the rest. γ are the pairwise interactions: one relative correction
// per pair of knob values that occurs together (tp=2 with pp=4, mbs=2 with recompute=full, ...),
// what a cluster does that is neither the components nor one knob alone (a kernel slow at one
// shape, a pipeline that suffers at one tensor-parallel width). As a Gaussian process over the
// configurations, δ and γ are a second-order ANOVA kernel (Duvenaud et al. 2011, "Additive Gaussian
// processes"). θ = 1, θ₀ = 0, δ = γ = 0 is the analytic model.
//
// A proposal evaluates every candidate, so the matrix is stored feature-major: one contiguous
// column per feature makes X·θ a handful of vectorised axpy passes, plus one gather per knob for
// the level effects (about 2 ms for 100,000 candidates).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "autopar/perf/cost_model.h"
#include "autopar/search/dual_regression.h"
#include "autopar/space/config.h"
#include "autopar/space/space.h"

namespace autopar::search {

// Coefficient layout: θ_k for Feature k in [0, kNumFeatures), then the intercept θ₀, then the
// candidate set's level effects δ, then its interactions γ (CandidateSet::num_coefficients() in
// all).
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

  // Level effects: one coefficient per value of every knob that varies over the set, in knob
  // order (tp, pp, dp, cp, up, ep, vpp, mbs, sp, recompute, dist_opt) and ascending value.
  int num_levels() const { return static_cast<int>(level_names_.size()); }
  // Interactions: one coefficient per pair of values of two varying knobs that occurs in the set,
  // after the levels; pairs in knob order, so a candidate's coefficients ascend. A pair whose
  // cells partition the set exactly as an earlier pair's do (its alias: tp and pp fixing dp) has
  // no coefficients of its own, so num_pairs() counts the distinct partitions.
  int num_interactions() const { return static_cast<int>(interaction_names_.size()); }
  int num_pairs() const { return num_pairs_; }
  int num_coefficients() const { return kNumCoefficients + num_levels() + num_interactions(); }
  // "tp=2*pp=4", ... for interaction m (coefficient kNumCoefficients + num_levels() + m); with
  // the aliases' names after it, "tp=2*pp=4 | tp=2*dp=2 | pp=4*dp=2".
  const std::string& interaction_name(int m) const { return interaction_names_[m]; }
  uint32_t interaction_coefficient(int64_t i, int p) const {
    return interaction_coefficient_[static_cast<size_t>(i) * num_pairs_ + p];
  }
  // "tp=2", "recompute=full/2", ... for level l.
  const std::string& level_name(int l) const { return level_names_[l]; }
  // The knobs that vary, and the coefficient index (≥ kNumCoefficients) of candidate i's value of
  // knob q < varying_knobs().
  int varying_knobs() const { return varying_knobs_; }
  int level_coefficient(int64_t i, int q) const {
    return level_coefficient_[static_cast<size_t>(i) * varying_knobs_ + q];
  }
  // Candidate i's varying_knobs() level coefficients.
  const uint16_t* levels_of(int64_t i) const {
    return level_coefficient_.data() + static_cast<size_t>(i) * varying_knobs_;
  }

  // The regression row of candidate i: x_ik, 1 for θ₀, ŷ_i for each of its levels and
  // interactions, 0 elsewhere (num_coefficients() values), so that t_i(θ) = rowᵀθ.
  void Row(int64_t i, double* row) const;
  // The same row divided by ŷ_i, sparse: x_ik/ŷ_i and 1/ŷ_i dense, the levels and interactions
  // as unit entries (the time posterior regresses y/ŷ on it).
  SparseRow RelativeRow(int64_t i) const;
  // The knob values alone, as unit entries: memory's levels and interactions, numbered from
  // `first` instead of kNumCoefficients (`dense` is left empty).
  SparseRow KnobRow(int64_t i, uint32_t first) const;
  // out[i] = t_i(θ) for every candidate; θ has num_coefficients() entries.
  void Predict(const double* theta, std::vector<double>* out) const;
  // t_i(θ) for one candidate.
  double PredictOne(int64_t i, const double* theta) const;

 private:
  void BuildInteractions();

  std::vector<ParallelConfig> configs_;
  std::vector<double> columns_[kNumFeatures];
  std::vector<std::string> level_names_;
  int varying_knobs_ = 0;
  std::vector<uint16_t> level_coefficient_;  // candidate-major, varying_knobs_ per candidate
  std::vector<std::string> interaction_names_;
  int num_pairs_ = 0;
  std::vector<uint32_t> interaction_coefficient_;  // candidate-major, num_pairs_ per candidate
  std::vector<double> nominal_time_s_, nominal_memory_gib_;
  std::unordered_map<std::string, int64_t> index_;
  double capacity_gib_ = 0;
  double median_time_s_ = 0;
  uint64_t fingerprint_ = 0;
};

}  // namespace autopar::search
