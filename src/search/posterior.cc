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
    : dim_(candidates.num_coefficients()) {
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
  const int levels = candidates.num_levels();
  const double per_level = 1 / std::sqrt(std::max(candidates.varying_knobs(), 1));
  const double per_pair = 1 / std::sqrt(std::max(candidates.num_pairs(), 1));
  // V = Λ₀⁻¹ = sd²/σ₀²: then θ_k | σ² = σ₀² has standard deviation sd_k.
  const double noise2 = prior.noise_sd * prior.noise_sd;
  if (prior.interaction_weights.size() != prior.interaction_scales.size()) {
    throw std::invalid_argument("TimePrior: one prior weight per interaction scale");
  }
  for (double level : prior.level_scales) {
    for (size_t m = 0; m < prior.interaction_scales.size(); ++m) {
      const double interaction = prior.interaction_scales[m];
      CheckPositive("interaction scale weight", prior.interaction_weights[m]);
      log_prior_.push_back(std::log(prior.interaction_weights[m]));
      std::vector<double> mean(prior.mean.begin(), prior.mean.end());
      std::vector<double> variance(static_cast<size_t>(dim_));
      for (int k = 0; k < dim_; ++k) {
        const double sd = k < kNumCoefficients            ? prior.sd[k]
                          : k < kNumCoefficients + levels ? level * per_level
                                                          : interaction * per_pair;
        variance[k] = sd * sd / noise2;
      }
      mean.resize(dim_, 0.0);
      hypotheses_.push_back({level, interaction});
      models_.emplace_back(std::move(mean), std::move(variance), prior.noise_a0,
                           PriorB(prior.noise_sd, prior.noise_a0));
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
  Refresh();
  return error;
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

double TimePosterior::Draw(Rng& rng, double* theta) const {
  double u = rng.Uniform();
  size_t pick = 0;
  while (pick + 1 < models_.size() && u >= weights_[pick]) u -= weights_[pick++];
  const double sigma2 = models_[pick].Draw(rng, theta);
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
