#include "autopar/search/posterior.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "autopar/search/math.h"

namespace autopar::search {
namespace {

constexpr double kComputeSd = 0.15;
constexpr double kCommunicationSd = 0.5;
constexpr double kInterceptSdOfStep = 0.05;
constexpr double kProbeFloorCompute = 0.05;
constexpr double kProbeFloorCommunication = 0.15;
constexpr double kMinTheta = 0.05;
constexpr double kSurpriseOom = 1e-3;
// Relevance (TimePosterior::Reprofile): re-estimated after every one of the first 30 rows, every
// 5th up to 100 and every 20th after; a group counts once its coefficients are determined by the
// data to a sum of 0.5; a quarter of each family's variance stays spread evenly; a rebuild only
// when a share moves by more than 5%.
constexpr size_t kReprofileEvery1 = 30;
constexpr size_t kReprofileEvery5 = 100;
constexpr double kDeterminedEnough = 0.5;
constexpr double kEvenShare = 0.25;
constexpr double kRelevanceTolerance = 0.05;

// Λ₀ = diag(σ₀²/sd_k²): then θ_k | σ² = σ₀² has standard deviation sd_k.
std::vector<double> DiagonalPrecision(const double* sd, int d, double noise_sd) {
  std::vector<double> p(static_cast<size_t>(d) * d, 0.0);
  for (int k = 0; k < d; ++k) p[k * d + k] = noise_sd * noise_sd / (sd[k] * sd[k]);
  return p;
}

// b₀ so that E[σ²] = σ₀² (a₀ > 1), else the mode-matching b₀ = σ₀²·(a₀ + 1).
double PriorB(double noise_sd, double a0) {
  return noise_sd * noise_sd * (a0 > 1 ? a0 - 1 : a0 + 1);
}

void CheckPositive(const char* what, double v) {
  if (!std::isfinite(v) || !(v > 0)) {
    throw std::invalid_argument(std::string(what) + " must be finite and positive, got " +
                                std::to_string(v));
  }
}

}  // namespace

bool IsCommunication(int feature) {
  switch (feature) {
    case kTpComm:
    case kCpComm:
    case kUlyssesComm:
    case kEpComm:
    case kPpComm:
    case kDpComm:
      return true;
    default:
      return false;
  }
}

TimePrior TimePrior::Default(double typical_step_s) {
  TimePrior p;
  for (int k = 0; k < kNumFeatures; ++k) {
    p.mean[k] = 1;
    p.sd[k] = IsCommunication(k) ? kCommunicationSd : kComputeSd;
  }
  p.mean[kIntercept] = 0;
  p.sd[kIntercept] = kInterceptSdOfStep * std::max(typical_step_s, 1e-6);
  return p;
}

void TimePrior::Tighten(int feature, const std::vector<double>& ratios) {
  if (feature < 0 || feature >= kNumFeatures) {
    throw std::invalid_argument("probe: unknown feature " + std::to_string(feature));
  }
  if (ratios.empty())
    throw std::invalid_argument("probe: no ratios for " + std::string(FeatureName(feature)));
  double sum = 0;
  for (double r : ratios) {
    CheckPositive("probe ratio", r);
    sum += r;
  }
  const double n = static_cast<double>(ratios.size());
  const double probe_mean = sum / n;
  double ss = 0;
  for (double r : ratios) ss += (r - probe_mean) * (r - probe_mean);
  const double floor = IsCommunication(feature) ? kProbeFloorCommunication : kProbeFloorCompute;
  const double probe_sd = std::max(n > 1 ? std::sqrt(ss / (n - 1)) : 0.0, floor);
  const double w_prior = 1 / (sd[feature] * sd[feature]);
  const double w_probe = 1 / (probe_sd * probe_sd);
  mean[feature] = (w_prior * mean[feature] + w_probe * probe_mean) / (w_prior + w_probe);
  sd[feature] = 1 / std::sqrt(w_prior + w_probe);
}

TimePosterior::TimePosterior(const TimePrior& prior, const CandidateSet& candidates)
    : prior_(prior), dim_(candidates.num_coefficients()), num_knobs_(candidates.varying_knobs()) {
  if (prior.level_scales.empty() || prior.interaction_scales.empty()) {
    throw std::invalid_argument("TimePrior: no level or interaction scales");
  }
  for (const std::vector<double>* list : {&prior.level_scales, &prior.interaction_scales}) {
    for (double scale : *list) {
      if (!(scale >= 0) || !std::isfinite(scale)) {
        throw std::invalid_argument("TimePrior: scale " + std::to_string(scale));
      }
    }
  }
  if (prior.interaction_weights.size() != prior.interaction_scales.size()) {
    throw std::invalid_argument("TimePrior: one prior weight per interaction scale");
  }
  for (double w : prior.interaction_weights) CheckPositive("interaction scale weight", w);
  // Each level coefficient belongs to its knob, each interaction to its pair of knobs; every one
  // occurs in some candidate.
  group_of_.assign(static_cast<size_t>(dim_), -1);
  const int pairs = candidates.num_pairs();
  for (int64_t i = 0; i < candidates.size(); ++i) {
    for (int q = 0; q < num_knobs_; ++q) group_of_[candidates.level_coefficient(i, q)] = q;
    for (int p = 0; p < pairs; ++p) {
      group_of_[candidates.interaction_coefficient(i, p)] = num_knobs_ + p;
    }
  }
  // Until the data say otherwise every knob, and every pair, holds an equal share.
  relevance_.assign(static_cast<size_t>(num_knobs_) + static_cast<size_t>(pairs), 0.0);
  for (int g = 0; g < num_knobs_ + pairs; ++g)
    relevance_[g] = 1.0 / (g < num_knobs_ ? num_knobs_ : pairs);
  Build();
}

void TimePosterior::Build() {
  models_.clear();
  hypotheses_.clear();
  log_prior_.clear();
  // V = Λ₀⁻¹ = sd²/σ₀²: then θ_k | σ² = σ₀² has standard deviation sd_k.
  const double noise2 = prior_.noise_sd * prior_.noise_sd;
  for (double level : prior_.level_scales) {
    for (size_t m = 0; m < prior_.interaction_scales.size(); ++m) {
      const double interaction = prior_.interaction_scales[m];
      log_prior_.push_back(std::log(prior_.interaction_weights[m]));
      std::vector<double> mean(prior_.mean.begin(), prior_.mean.end());
      std::vector<double> variance(static_cast<size_t>(dim_));
      for (int k = 0; k < dim_; ++k) {
        const int g = group_of_[k];
        double var = 0;  // a coefficient of no group stays at 0
        if (k < kNumCoefficients) {
          var = prior_.sd[k] * prior_.sd[k];
        } else if (g >= 0) {
          const double scale = g < num_knobs_ ? level : interaction;
          var = scale * scale * relevance_[g];
        }
        variance[k] = var / noise2;
      }
      mean.resize(dim_, 0.0);
      hypotheses_.push_back({level, interaction});
      models_.emplace_back(std::move(mean), std::move(variance), prior_.noise_a0,
                           PriorB(prior_.noise_sd, prior_.noise_a0));
      for (size_t j = 0; j < rows_.size(); ++j) models_.back().Add(rows_[j], z_[j]);
    }
  }
  Refresh();
}

double TimePosterior::Observe(const CandidateSet& candidates, int64_t i, double measured_s) {
  CheckPositive("measured step time", measured_s);
  const double nominal = candidates.nominal_time_s(i);
  CheckPositive("analytic step time", nominal);
  if (candidates.num_coefficients() != dim_) {
    throw std::invalid_argument("candidate set with " +
                                std::to_string(candidates.num_coefficients()) +
                                " coefficients for a posterior over " + std::to_string(dim_));
  }
  const SparseRow row = candidates.RelativeRow(i);
  const Relative before = Mixture(row, /*with_noise=*/true);
  const double z = measured_s / nominal;
  const double error = (z - before.mean) / std::sqrt(std::max(before.variance, 1e-300));
  for (DualNigRegression& m : models_) m.Add(row, z);
  rows_.push_back(row);
  z_.push_back(z);
  Refresh();
  const size_t n = rows_.size();
  if (n <= kReprofileEvery1 || (n <= kReprofileEvery5 && n % 5 == 0) || n % 20 == 0) Reprofile();
  return error;
}

void TimePosterior::Reprofile() {
  std::vector<double> next(relevance_.size());
  for (const bool levels : {true, false}) {
    const int first = levels ? 0 : num_knobs_;
    const int count = levels ? num_knobs_ : static_cast<int>(relevance_.size()) - num_knobs_;
    if (count < 2) {
      for (int g = first; g < first + count; ++g) next[g] = relevance_[g];
      continue;
    }
    // The hypothesis of this family (scale > 0) that the data favour most.
    int ref = -1;
    for (size_t m = 0; m < models_.size(); ++m) {
      const double scale = levels ? hypotheses_[m].level_scale : hypotheses_[m].interaction_scale;
      if (scale > 0 && (ref < 0 || weights_[m] > weights_[ref])) ref = static_cast<int>(m);
    }
    if (ref < 0) {
      for (int g = first; g < first + count; ++g) next[g] = relevance_[g];
      continue;
    }
    const double scale = levels ? hypotheses_[ref].level_scale : hypotheses_[ref].interaction_scale;
    // MacKay's fixed point per group: v_g = Σ μ_k² / Σ γ_k over its coefficients, γ_k the share
    // of coefficient k the data determine. A group the data hardly touch keeps its variance.
    std::vector<double> squares(count, 0.0), determined(count, 0.0);
    const std::vector<double>& mu = models_[ref].mean();
    for (int k = kNumCoefficients; k < dim_; ++k) {
      const int g = group_of_[k] - first;
      if (g < 0 || g >= count) continue;
      squares[g] += mu[k] * mu[k];
      determined[g] += models_[ref].Determined(k);
    }
    double total = 0;
    for (int g = 0; g < count; ++g) {
      const double current = scale * scale * relevance_[first + g];
      next[first + g] = determined[g] >= kDeterminedEnough ? squares[g] / determined[g] : current;
      total += next[first + g];
    }
    for (int g = 0; g < count; ++g) {
      const double share = total > 0 ? next[first + g] / total : 1.0 / count;
      next[first + g] = (1 - kEvenShare) * share + kEvenShare / count;
    }
  }
  bool moved = false;
  for (size_t g = 0; g < next.size(); ++g) {
    moved = moved || std::abs(next[g] - relevance_[g]) > kRelevanceTolerance * relevance_[g];
  }
  if (!moved) return;
  relevance_ = std::move(next);
  Build();
}

void TimePosterior::Refresh() {
  // Weights ∝ prior × evidence, normalised in the log domain.
  weights_.resize(models_.size());
  double top = -std::numeric_limits<double>::infinity();
  for (size_t m = 0; m < models_.size(); ++m) {
    weights_[m] = log_prior_[m] + models_[m].LogEvidence();
    top = std::max(top, weights_[m]);
  }
  double total = 0;
  for (double& w : weights_) total += (w = std::exp(w - top));
  for (double& w : weights_) w /= total;
  mean_.assign(dim_, 0.0);
  for (size_t m = 0; m < models_.size(); ++m) {
    const std::vector<double>& mu = models_[m].mean();
    for (size_t k = 0; k < mu.size(); ++k) mean_[k] += weights_[m] * mu[k];
  }
}

double TimePosterior::Draw(Rng& rng, double* theta, bool any_hypothesis, double widen) const {
  double u = rng.Uniform();
  size_t pick = 0;
  if (any_hypothesis) {
    pick =
        std::min(models_.size() - 1, static_cast<size_t>(u * static_cast<double>(models_.size())));
  } else {
    while (pick + 1 < models_.size() && u >= weights_[pick]) u -= weights_[pick++];
  }
  const double sigma2 = models_[pick].Draw(rng, theta);
  if (widen != 1) {
    const std::vector<double>& mu = models_[pick].mean();
    for (int k = 0; k < dim_; ++k) theta[k] = mu[k] + widen * (theta[k] - mu[k]);
  }
  for (int k = 0; k < kNumFeatures; ++k) theta[k] = std::max(theta[k], kMinTheta);
  return std::sqrt(sigma2);
}

double TimePosterior::MarginalSd(int k) const {
  // Law of total variance over the mixture.
  double second = 0;
  for (size_t m = 0; m < models_.size(); ++m) {
    const double sd = models_[m].MarginalSd(k), mu = models_[m].mean()[k];
    second += weights_[m] * (sd * sd + mu * mu);
  }
  return std::sqrt(std::max(second - mean_[k] * mean_[k], 0.0));
}

double TimePosterior::PredictMean(const CandidateSet& candidates, int64_t i) const {
  return candidates.PredictOne(i, mean_.data());
}

TimePosterior::Relative TimePosterior::Mixture(const SparseRow& row, bool with_noise) const {
  double mean = 0, second = 0;
  for (size_t m = 0; m < models_.size(); ++m) {
    const double mu = models_[m].PredictMean(row);
    const double s = models_[m].PredictScale(row, with_noise);
    const double nu = models_[m].dof();
    mean += weights_[m] * mu;
    second += weights_[m] * (s * s * nu / (nu - 2) + mu * mu);
  }
  return {mean, std::max(second - mean * mean, 0.0)};
}

TimePosterior::Relative TimePosterior::Predict(const CandidateSet& candidates, int64_t i,
                                               bool with_noise) const {
  return Mixture(candidates.RelativeRow(i), with_noise);
}

double TimePosterior::noise_sd() const {
  double variance = 0;
  for (size_t m = 0; m < models_.size(); ++m) {
    variance += weights_[m] * models_[m].ExpectedNoiseVariance();
  }
  return std::sqrt(variance);
}

void TimePosterior::AddToDigest(Hasher* h) const {
  for (double r : relevance_) h->Add(r);
  for (const DualNigRegression& m : models_) m.AddToDigest(h);
}

MemoryPosterior::MemoryPosterior(const MemoryPrior& prior, int levels, int varying_knobs)
    : levels_(levels),
      regression_(
          [&] {
            std::vector<double> mean(2 + static_cast<size_t>(levels), 0.0);
            mean[0] = prior.scale_mean;
            mean[1] = prior.offset_mean_gib;
            return mean;
          }(),
          [&] {
            std::vector<double> sd(2 + static_cast<size_t>(levels),
                                   prior.level_sd / std::sqrt(std::max(varying_knobs, 1)));
            sd[0] = prior.scale_sd;
            sd[1] = prior.offset_sd_gib;
            return DiagonalPrecision(sd.data(), static_cast<int>(sd.size()), prior.noise_sd);
          }(),
          prior.noise_a0, PriorB(prior.noise_sd, prior.noise_a0)) {}

void MemoryPosterior::Row(const MemoryRow& row, double* u) const {
  std::fill(u, u + 2 + levels_, 0.0);
  u[0] = 1;
  u[1] = 1 / row.nominal_gib;
  for (int q = 0; q < row.num_levels; ++q) u[2 + row.levels[q] - kNumCoefficients] = 1;
}

double MemoryPosterior::RelativeMean(const MemoryRow& row) const {
  const std::vector<double>& mu = regression_.mean();
  double z = mu[0] + mu[1] / row.nominal_gib;
  for (int q = 0; q < row.num_levels; ++q) z += mu[2 + row.levels[q] - kNumCoefficients];
  return z;
}

void MemoryPosterior::ObservePeak(const MemoryRow& row, double measured_gib) {
  CheckPositive("analytic peak memory", row.nominal_gib);
  CheckPositive("measured peak memory", measured_gib);
  std::vector<double> u(2 + static_cast<size_t>(levels_));
  Row(row, u.data());
  regression_.Add(u.data(), measured_gib / row.nominal_gib);
  oom_run_ = 0;
}

bool MemoryPosterior::ObserveOom(const MemoryRow& row, double capacity_gib) {
  CheckPositive("analytic peak memory", row.nominal_gib);
  CheckPositive("memory capacity", capacity_gib);
  std::vector<double> u(2 + static_cast<size_t>(levels_));
  Row(row, u.data());
  const double mu = regression_.PredictMean(u.data());
  const double s = regression_.PredictScale(u.data(), /*with_noise=*/true);
  const double bound = capacity_gib / row.nominal_gib;
  const double a = (bound - mu) / s;
  const bool surprise = 1 - StudentTCdf(a, regression_.dof()) < kSurpriseOom;
  const bool lone = oom_run_++ == 0;
  if (surprise && lone) return false;
  const double tail = 1 - NormalCdf(a);
  const double imputed = tail > 1e-12 ? mu + s * NormalPdf(a) / tail : bound;
  regression_.Add(u.data(), std::max(imputed, bound));
  return true;
}

bool MemoryPosterior::Sample::Fits(const MemoryRow& row, double capacity_gib,
                                   double epsilon) const {
  double z = beta[0] + beta[1] / row.nominal_gib + sigma * epsilon;
  for (int q = 0; q < row.num_levels; ++q) z += beta[2 + row.levels[q] - kNumCoefficients];
  return z <= capacity_gib / row.nominal_gib;
}

MemoryPosterior::Sample MemoryPosterior::Draw(Rng& rng) const {
  Sample sample;
  sample.beta.resize(2 + static_cast<size_t>(levels_));
  sample.sigma = std::sqrt(regression_.Draw(rng, sample.beta.data()));
  return sample;
}

double MemoryPosterior::PredictMean(const MemoryRow& row) const {
  return row.nominal_gib * RelativeMean(row);
}

double MemoryPosterior::Headroom(const MemoryRow& row, double capacity_gib) const {
  return capacity_gib / row.nominal_gib - RelativeMean(row);
}

double MemoryPosterior::Margin(const MemoryRow& row, double capacity_gib) const {
  std::vector<double> u(2 + static_cast<size_t>(levels_));
  Row(row, u.data());
  return Headroom(row, capacity_gib) / regression_.PredictScale(u.data(), /*with_noise=*/true);
}

double MemoryPosterior::POom(const MemoryRow& row, double capacity_gib) const {
  return 1 - StudentTCdf(Margin(row, capacity_gib), regression_.dof());
}

double MemoryPosterior::FitQuantile(double max_p_oom) const {
  return StudentTQuantile(1 - max_p_oom, regression_.dof());
}

}  // namespace autopar::search
