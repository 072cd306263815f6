// The two posteriors of the online tuner (docs/search.md §2–§4): one over the time-model coefficients θ, one
// over a scale/offset correction of the analytic memory model. Both are NigRegression underneath.
//
// Defaults (one table, as limbo keeps them):
//
// clang-format off
//   what                                      value     why
//   θ_k prior sd, compute features            0.15      the analytic model is 3–15% off on compute
//   θ_k prior sd, communication features      0.5       collectives miss by up to 2× (topology,
//                                                       NCCL algorithm, contention)
//   θ₀ prior sd (seconds)                     0.05·t̃    t̃ the median analytic step time
//   relative step-time noise σ₀, strength a₀  5%, 2     weakly informative (a₀ = 2: 4 pseudo-rows)
//   probe floor on a tightened sd             0.05 /    a micro-benchmark is not the whole
//     (compute / communication)               0.15      program
//   memory scale α, offset β (GiB) prior sd   0.1, 2    the model's overhead term is a guess
//   relative memory noise σ₀, strength a₀     3%, 2     allocator behaviour varies little
//   an OOM is a surprise (not imputed) below  1e-3      P(OOM) predicted before it happened
//   level effects δ: prior sd of their sum    0.05      a configuration's knob values move its
//     for one configuration (each δ: / √knobs)          step by a few percent beyond what the
//                                                       components say
//   smallest θ_k a draw may take              0.05      no component of a step takes no time
// clang-format on
#pragma once

#include <array>
#include <vector>

#include "autopar/search/candidates.h"
#include "autopar/search/regression.h"
#include "autopar/search/rng.h"

namespace autopar::search {

// True for the features that model communication (their prior is wider).
bool IsCommunication(int feature);

// Prior over θ: independent normals per coefficient, plus the expected relative noise.
struct TimePrior {
  std::array<double, kNumCoefficients> mean{};
  std::array<double, kNumCoefficients> sd{};
  // How far the level effects may move a configuration: the prior sd of its summed effects (each
  // δ, mean 0, gets scale/√q for the q knobs that vary, so the discrepancy allowed does not grow
  // with them). The scale is not known in advance: the posterior weighs these hypotheses by their
  // evidence, 0 being "the components explain everything" (equal prior weights).
  std::vector<double> level_scales = {0, 0.05, 0.1, 0.2};
  double noise_sd = 0.05;  // expected relative noise of a measured step time
  double noise_a0 = 2.0;   // its strength (Inverse-Gamma shape)

  // Centred on the analytic model (θ = 1, θ₀ = 0) with the defaults of the table above;
  // `typical_step_s` sets the scale of θ₀.
  static TimePrior Default(double typical_step_s);

  // Tightens the prior of one feature with the probe's ratios (measured / predicted time of its
  // micro-benchmarks). The probe's estimate N(mean r, max(sd r, floor)²) is combined with the
  // prior by precision weighting (the normal–normal update). Throws std::invalid_argument on an
  // empty list, an unknown feature or a non-finite or non-positive ratio.
  void Tighten(int feature, const std::vector<double>& ratios);
};

// Posterior over θ (features, intercept and the candidate set's level effects) given measured
// step times.
//
// Noise is proportional to the step time, so each row is divided by the analytic prediction ŷ_c:
// the regression is y/ŷ = (x/ŷ)ᵀθ + ε with ε ~ N(0, σ²), i.e. weighted least squares with weights
// 1/ŷ² (ŷ rather than y so the weights do not depend on the noise they correct for).
//
// The level-effect scale τ is a discrete hyperparameter: one Normal–Inverse-Gamma regression per
// value of TimePrior::level_scales (τ = 0 has no level coefficients at all), each fed every row,
// weighted by prior × evidence (NigRegression::LogEvidence). A draw first picks a regression by
// its weight, then θ from it: Thompson sampling over the whole hierarchical posterior. Data with
// no level structure pull the weight to τ = 0 and the search to the components' model alone.
class TimePosterior {
 public:
  // Over the coefficients of `candidates`: kNumCoefficients from `prior`, then its level effects.
  // Throws std::invalid_argument on no or negative level scales.
  TimePosterior(const TimePrior& prior, const CandidateSet& candidates);

  // Throws std::invalid_argument when the measurement is not finite and positive.
  void Observe(const CandidateSet& candidates, int64_t i, double measured_s);

  // One draw of θ (dim() values, level effects 0 under τ = 0; feature coefficients floored at
  // 0.05). Returns the draw's relative noise σ: a step time is then N(t(θ), (σ·ŷ)²).
  double Draw(Rng& rng, double* theta) const;
  int dim() const { return dim_; }
  // The posterior mean and marginal sd of θ over the mixture.
  const std::vector<double>& mean() const { return mean_; }
  double MarginalSd(int k) const;
  // Posterior mean step time of candidate i (seconds).
  double PredictMean(const CandidateSet& candidates, int64_t i) const;
  // E[σ]: the relative noise the data show.
  double noise_sd() const;
  // The level scales and their posterior weights (summing to 1).
  const std::vector<double>& level_scales() const { return scales_; }
  const std::vector<double>& weights() const { return weights_; }
  void AddToDigest(Hasher* h) const;

 private:
  void Refresh();

  int dim_ = 0;
  std::vector<double> scales_;
  std::vector<NigRegression> models_;
  std::vector<double> weights_, mean_;
};

// Prior of the memory correction: peak = α·m̂ + β with m̂ the analytic peak (GiB).
struct MemoryPrior {
  double scale_mean = 1, scale_sd = 0.1;
  double offset_mean_gib = 0, offset_sd_gib = 2;
  double noise_sd = 0.03;
  double noise_a0 = 2.0;
};

// Posterior over (α, β) from measured peaks and OOMs. Rows are divided by m̂ as above:
// peak/m̂ = α + β/m̂ + ε.
//
// An OOM is a censored observation (the peak exceeds the capacity). It enters by single
// imputation of its conditional mean under the current predictive, E[z | z > cap/m̂] =
// μ + s·φ(a)/(1 − Φ(a)) with a = (cap/m̂ − μ)/s (the Tobit mean, Amemiya 1984), unless the
// predictive gave it probability below 1e-3: such a surprise says more about that configuration
// than about the model, and is left to the dominance pruning of SearchState.
class MemoryPosterior {
 public:
  explicit MemoryPosterior(const MemoryPrior& prior);

  // Throws std::invalid_argument unless both values are finite and positive.
  void ObservePeak(double nominal_gib, double measured_gib);
  // Returns whether the OOM was imputed (false: a surprise, ignored by the regression).
  bool ObserveOom(double nominal_gib, double capacity_gib);

  double PredictMean(double nominal_gib) const;  // E[peak], GiB
  // One draw of the peak model: (α, β) and σ from the posterior. A candidate's peak in that world
  // is then m̂·(α + β/m̂ + σ·ε) with its own ε ~ N(0, 1): a draw from the Student-t predictive.
  struct Sample {
    double scale, offset_gib, sigma;
    bool Fits(double nominal_gib, double capacity_gib, double epsilon) const {
      return scale + offset_gib / nominal_gib + sigma * epsilon <= capacity_gib / nominal_gib;
    }
  };
  Sample Draw(Rng& rng) const;
  // P(peak > capacity) under the Student-t predictive.
  double POom(double nominal_gib, double capacity_gib) const;
  // P(OOM) < max_p ⟺ Margin(m̂, cap) > StudentTQuantile(1 − max_p, dof): the quantile is
  // computed once per posterior, the margin per candidate (no special functions in the loop).
  double Margin(double nominal_gib, double capacity_gib) const;
  double FitQuantile(double max_p_oom) const;

  double scale() const { return regression_.mean()[0]; }
  double offset_gib() const { return regression_.mean()[1]; }
  const NigRegression& regression() const { return regression_; }

 private:
  NigRegression regression_;
};

}  // namespace autopar::search
