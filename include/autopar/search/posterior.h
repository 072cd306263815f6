// The two posteriors of the online tuner (docs/search.md §2–§4): one over the time-model
// coefficients θ, one over a scale/offset correction of the analytic memory model. Both are
// NigRegression underneath.
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
//   level effects δ: prior sd of their sum    0, 0.05,  a configuration's knob values move its
//     (each δ: × √relevance of its knob)      0.1, 0.2  step by a few percent beyond what the
//                                                       components say (weighed by evidence)
//   interactions γ: prior sd of their sum     0, 0.05,  pairs of knob values that a cluster
//     (each γ: × √relevance of its pair)      0.15, 0.3 treats unlike the sum of the two
//   relevance of a knob / pair: its share     learnt    a cluster's discrepancy sits in a few
//     of the family's variance (δ, γ)         (ARD)     knobs and pairs (docs/search.md §3)
//   smallest θ_k a draw may take              0.05      no component of a step takes no time
// clang-format on
#pragma once

#include <array>
#include <vector>

#include "autopar/search/candidates.h"
#include "autopar/search/dual_regression.h"
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
  // δ, mean 0, gets scale·√r for its knob's relevance r, the relevances of the q knobs that vary
  // summing to 1 (1/q each until the data say otherwise), so the discrepancy allowed does not
  // grow with them). The scale is not known in advance: the posterior weighs these hypotheses by
  // their evidence, 0 being "the components explain everything" (equal prior weights).
  std::vector<double> level_scales = {0, 0.05, 0.1, 0.2};
  // The same for the pairwise interactions γ (each γ gets scale·√r for its pair's relevance r):
  // every combination of a level scale and an interaction scale is one hypothesis.
  std::vector<double> interaction_scales = {0, 0.05, 0.15, 0.3};
  // Their prior weights (relative): interactions must earn their place, so "none" starts with as
  // much weight as the others together (the level scales start equal).
  std::vector<double> interaction_weights = {3, 1, 1, 1};
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

// Posterior over θ (features, intercept, the candidate set's level effects and interactions)
// given measured step times.
//
// Noise is proportional to the step time, so each row is divided by the analytic prediction ŷ_c:
// the regression is y/ŷ = (x/ŷ)ᵀθ + ε with ε ~ N(0, σ²), i.e. weighted least squares with weights
// 1/ŷ² (ŷ rather than y so the weights do not depend on the noise they correct for).
//
// The scales τ of the level effects and of the interactions are discrete hyperparameters: one
// Normal–Inverse-Gamma regression per pair (τ_level, τ_interaction) of TimePrior's lists (a scale
// 0 holds those coefficients at 0), each fed every row, weighted by prior × evidence. A draw first
// picks a regression by its weight, then θ from it: Thompson sampling over the whole hierarchical
// posterior. Data with no structure beyond the components pull the weight to τ = 0 and the search
// to the components' model alone; data with structure move it to the scale they need, and widen
// every prediction accordingly. The regressions work in observation space (DualNigRegression):
// the interactions have hundreds of coefficients, a study tens of measurements.
class TimePosterior {
 public:
  struct Hypothesis {
    double level_scale, interaction_scale;
  };

  // Over the coefficients of `candidates`. Throws std::invalid_argument on no or negative scales.
  TimePosterior(const TimePrior& prior, const CandidateSet& candidates);

  // Learns a measured step time. Returns its standardised error under the predictive before it
  // was learnt, (y/ŷ − E)/sd over the mixture: about N(0, 1) while the model describes the
  // cluster, and large when the cluster surprises it. Throws std::invalid_argument when the
  // measurement is not finite and positive.
  double Observe(const CandidateSet& candidates, int64_t i, double measured_s);

  // One draw of θ (dim() values, zeros where the picked hypothesis has scale 0; feature
  // coefficients floored at 0.05). Returns the draw's relative noise σ: a step time is then
  // N(t(θ), (σ·ŷ)²). `any_hypothesis`: the hypothesis is picked uniformly, not by its weight;
  // `widen` (≥ 1): θ is spread that many times wider about the picked regression's mean (a check
  // trial's draw, and the stop rule's under the calibration of the checks, stop.h); σ is not.
  double Draw(Rng& rng, double* theta, bool any_hypothesis = false, double widen = 1) const;
  int dim() const { return dim_; }
  // The posterior mean and marginal sd of θ over the mixture.
  const std::vector<double>& mean() const { return mean_; }
  double MarginalSd(int k) const;
  // Posterior mean step time of candidate i (seconds).
  double PredictMean(const CandidateSet& candidates, int64_t i) const;
  // Candidate i's step time relative to its analytic time, z = y/ŷ, over the mixture: the mean
  // and variance of the model's value (`with_noise` false) or of a new measurement (true). A
  // Student-t's variance is s²·ν/(ν − 2); the spread of the hypotheses' means adds to it.
  struct Relative {
    double mean, variance;
  };
  Relative Predict(const CandidateSet& candidates, int64_t i, bool with_noise) const;
  // E[σ]: the relative noise the data show.
  double noise_sd() const;
  // The hypotheses and their posterior weights (summing to 1).
  const std::vector<Hypothesis>& hypotheses() const { return hypotheses_; }
  const std::vector<double>& weights() const { return weights_; }
  // The share of its family's prior variance each group holds: the knobs' level effects (sum 1)
  // and then the pairs' interactions (sum 1), varying_knobs() + num_pairs() values.
  const std::vector<double>& relevance() const { return relevance_; }
  void AddToDigest(Hasher* h) const;

 private:
  // The regressions of every hypothesis under the current relevance, fed the rows so far.
  void Build();
  void Refresh();
  // Re-estimates the relevance from the data (below) and rebuilds when it moved.
  void Reprofile();
  Relative Mixture(const SparseRow& row, bool with_noise) const;

  TimePrior prior_;
  int dim_ = 0;
  int num_knobs_ = 0;  // groups [0, num_knobs_) are knobs, the rest pairs
  // Per coefficient, its group (−1 for θ and θ₀).
  std::vector<int> group_of_;
  std::vector<double> relevance_;
  std::vector<SparseRow> rows_;
  std::vector<double> z_;
  std::vector<Hypothesis> hypotheses_;
  std::vector<DualNigRegression> models_;
  std::vector<double> log_prior_, weights_, mean_;
};

// Prior of the memory correction: peak = m̂·(α + β/m̂ + Σ_q δ_q) with m̂ the analytic peak (GiB)
// and δ one relative effect per knob value, as for the step time (a per-tp workspace, a stage
// the model loads unevenly, an allocator that rounds one micro-batch size up).
struct MemoryPrior {
  double scale_mean = 1, scale_sd = 0.1;
  double offset_mean_gib = 0, offset_sd_gib = 2;
  double level_sd = 0.05;  // prior sd of a configuration's summed level effects
  double noise_sd = 0.03;
  double noise_a0 = 2.0;
};

// A configuration as the memory model sees it: its analytic peak and the CandidateSet level
// coefficients of its knob values (none for a bare figure).
struct MemoryRow {
  double nominal_gib = 0;
  const uint16_t* levels = nullptr;
  int num_levels = 0;
};

// Posterior over (α, β, δ) from measured peaks and OOMs. Rows are divided by m̂ as above:
// peak/m̂ = α + β/m̂ + Σ δ + ε.
//
// An OOM is a censored observation (the peak exceeds the capacity). It enters by single
// imputation of its conditional mean under the current predictive, E[z | z > cap/m̂] =
// μ + s·φ(a)/(1 − Φ(a)) with a = (cap/m̂ − μ)/s (the Tobit mean, Amemiya 1984). A lone OOM the
// predictive gave probability below 1e-3 is a surprise that says more about that configuration
// (fragmentation, a driver's reserve) than about the model, and is left to the dominance pruning
// of SearchState; but a run of OOMs with no measured peak between them says the model is wrong,
// and from the second on every one is imputed: the residuals widen the posterior (b_n grows) and
// move the level effects of the knob values that failed.
class MemoryPosterior {
 public:
  // `levels` is the number of level coefficients of the candidate set (0: the scale/offset model).
  explicit MemoryPosterior(const MemoryPrior& prior, int levels = 0, int varying_knobs = 0);

  // Throws std::invalid_argument unless both values are finite and positive.
  void ObservePeak(const MemoryRow& row, double measured_gib);
  // Returns whether the OOM was imputed (false: a lone surprise, ignored by the regression).
  bool ObserveOom(const MemoryRow& row, double capacity_gib);

  double PredictMean(const MemoryRow& row) const;  // E[peak], GiB
  // One draw of the peak model: its coefficients and σ from the posterior. A candidate's peak in
  // that world is then m̂·(uᵀβ + σ·ε) with its own ε ~ N(0, 1): a draw from the Student-t
  // predictive.
  struct Sample {
    std::vector<double> beta;
    double sigma = 0;
    bool Fits(const MemoryRow& row, double capacity_gib, double epsilon) const;
  };
  Sample Draw(Rng& rng) const;
  // P(peak > capacity) under the Student-t predictive.
  double POom(const MemoryRow& row, double capacity_gib) const;
  // P(OOM) < max_p ⟺ Margin(row, cap) > StudentTQuantile(1 − max_p, dof): the quantile is
  // computed once per posterior, the margin per candidate (no special functions in the loop).
  double Margin(const MemoryRow& row, double capacity_gib) const;
  double FitQuantile(double max_p_oom) const;
  // cap/m̂ − E[peak/m̂]: the sign of Margin without its scale (a cheap first test).
  double Headroom(const MemoryRow& row, double capacity_gib) const;

  double scale() const { return regression_.mean()[0]; }
  double offset_gib() const { return regression_.mean()[1]; }
  const NigRegression& regression() const { return regression_; }
  int oom_run() const { return oom_run_; }

 private:
  // The relative row u of a configuration (2 + levels values).
  void Row(const MemoryRow& row, double* u) const;
  double RelativeMean(const MemoryRow& row) const;

  int levels_;
  NigRegression regression_;
  int oom_run_ = 0;
};

}  // namespace autopar::search
