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
    : dim_(candidates.num_coefficients()), scales_(prior.level_scales) {
  if (scales_.empty()) throw std::invalid_argument("TimePrior: no level scales");
  const int levels = candidates.num_levels();
  const double per_level = 1 / std::sqrt(std::max(candidates.varying_knobs(), 1));
  for (double scale : scales_) {
    if (!(scale >= 0) || !std::isfinite(scale)) {
      throw std::invalid_argument("TimePrior: level scale " + std::to_string(scale));
    }
    // τ = 0: no level coefficients (and no candidate set has level effects without levels).
    const int d = kNumCoefficients + (scale > 0 ? levels : 0);
    std::vector<double> mean(prior.mean.begin(), prior.mean.end());
    std::vector<double> sd(prior.sd.begin(), prior.sd.end());
    mean.resize(d, 0.0);
    sd.resize(d, scale * per_level);
    models_.emplace_back(std::move(mean), DiagonalPrecision(sd.data(), d, prior.noise_sd),
                         prior.noise_a0, PriorB(prior.noise_sd, prior.noise_a0));
  }
  Refresh();
}

void TimePosterior::Observe(const CandidateSet& candidates, int64_t i, double measured_s) {
  CheckPositive("measured step time", measured_s);
  const double nominal = candidates.nominal_time_s(i);
  CheckPositive("analytic step time", nominal);
  if (candidates.num_coefficients() != dim_) {
    throw std::invalid_argument("candidate set with " +
                                std::to_string(candidates.num_coefficients()) +
                                " coefficients for a posterior over " + std::to_string(dim_));
  }
  std::vector<double> u(static_cast<size_t>(dim_));
  candidates.Row(i, u.data());
  for (double& v : u) v /= nominal;
  // A model without level coefficients takes the leading part of the row.
  for (NigRegression& m : models_) m.Add(u.data(), measured_s / nominal);
  Refresh();
}

void TimePosterior::Refresh() {
  // Weights ∝ evidence (equal priors), normalised in the log domain.
  weights_.resize(models_.size());
  double top = -std::numeric_limits<double>::infinity();
  for (size_t m = 0; m < models_.size(); ++m) {
    weights_[m] = models_[m].LogEvidence();
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
  const NigRegression& m = models_[pick];
  std::fill(theta + m.dim(), theta + dim_, 0.0);
  const double sigma2 = m.Draw(rng, theta);
  for (int k = 0; k < kNumFeatures; ++k) theta[k] = std::max(theta[k], kMinTheta);
  return std::sqrt(sigma2);
}

double TimePosterior::MarginalSd(int k) const {
  // Law of total variance over the mixture; a model without θ_k holds it at 0.
  double second = 0;
  for (size_t m = 0; m < models_.size(); ++m) {
    if (k >= models_[m].dim()) continue;
    const double sd = models_[m].MarginalSd(k), mu = models_[m].mean()[k];
    second += weights_[m] * (sd * sd + mu * mu);
  }
  return std::sqrt(std::max(second - mean_[k] * mean_[k], 0.0));
}

double TimePosterior::PredictMean(const CandidateSet& candidates, int64_t i) const {
  return candidates.PredictOne(i, mean_.data());
}

double TimePosterior::noise_sd() const {
  double variance = 0;
  for (size_t m = 0; m < models_.size(); ++m) {
    variance += weights_[m] * models_[m].ExpectedNoiseVariance();
  }
  return std::sqrt(variance);
}

void TimePosterior::AddToDigest(Hasher* h) const {
  for (const NigRegression& m : models_) m.AddToDigest(h);
}

MemoryPosterior::MemoryPosterior(const MemoryPrior& prior)
    : regression_(
          {prior.scale_mean, prior.offset_mean_gib},
          [&] {
            const double sd[2] = {prior.scale_sd, prior.offset_sd_gib};
            return DiagonalPrecision(sd, 2, prior.noise_sd);
          }(),
          prior.noise_a0, PriorB(prior.noise_sd, prior.noise_a0)) {}

void MemoryPosterior::ObservePeak(double nominal_gib, double measured_gib) {
  CheckPositive("analytic peak memory", nominal_gib);
  CheckPositive("measured peak memory", measured_gib);
  const double u[2] = {1, 1 / nominal_gib};
  regression_.Add(u, measured_gib / nominal_gib);
}

bool MemoryPosterior::ObserveOom(double nominal_gib, double capacity_gib) {
  CheckPositive("analytic peak memory", nominal_gib);
  CheckPositive("memory capacity", capacity_gib);
  const double u[2] = {1, 1 / nominal_gib};
  const double mu = regression_.PredictMean(u);
  const double s = regression_.PredictScale(u, /*with_noise=*/true);
  const double a = (capacity_gib / nominal_gib - mu) / s;
  if (1 - StudentTCdf(a, regression_.dof()) < kSurpriseOom) return false;
  const double tail = 1 - NormalCdf(a);
  const double imputed = tail > 1e-12 ? mu + s * NormalPdf(a) / tail : capacity_gib / nominal_gib;
  regression_.Add(u, std::max(imputed, capacity_gib / nominal_gib));
  return true;
}

MemoryPosterior::Sample MemoryPosterior::Draw(Rng& rng) const {
  double ab[2];
  const double sigma2 = regression_.Draw(rng, ab);
  return {ab[0], ab[1], std::sqrt(sigma2)};
}

double MemoryPosterior::PredictMean(double nominal_gib) const {
  const double u[2] = {1, 1 / nominal_gib};
  return nominal_gib * regression_.PredictMean(u);
}

double MemoryPosterior::Margin(double nominal_gib, double capacity_gib) const {
  const double u[2] = {1, 1 / nominal_gib};
  return (capacity_gib / nominal_gib - regression_.PredictMean(u)) /
         regression_.PredictScale(u, /*with_noise=*/true);
}

double MemoryPosterior::POom(double nominal_gib, double capacity_gib) const {
  return 1 - StudentTCdf(Margin(nominal_gib, capacity_gib), regression_.dof());
}

double MemoryPosterior::FitQuantile(double max_p_oom) const {
  return StudentTQuantile(1 - max_p_oom, regression_.dof());
}

}  // namespace autopar::search
