#include "autopar/search/regression.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "autopar/search/math.h"

namespace autopar::search {
namespace {

constexpr int kSmallDim = 16;

// log|A| = 2·Σ log L_ii for A = L·Lᵀ.
double LogDetFromCholesky(const std::vector<double>& l, int d) {
  double s = 0;
  for (int i = 0; i < d; ++i) s += std::log(l[static_cast<size_t>(i) * d + i]);
  return 2 * s;
}

}  // namespace

NigRegression::NigRegression(std::vector<double> prior_mean, std::vector<double> prior_precision,
                             double a0, double b0)
    : d_(static_cast<int>(prior_mean.size())),
      prior_mean_(std::move(prior_mean)),
      prior_precision_(std::move(prior_precision)),
      a0_(a0),
      b0_(b0) {
  if (prior_precision_.size() != static_cast<size_t>(d_) * d_) {
    throw std::invalid_argument("NigRegression: prior precision is not d×d");
  }
  if (!(a0_ > 0) || !(b0_ > 0)) {
    throw std::invalid_argument("NigRegression: a0 and b0 must be positive");
  }
  gram_.assign(prior_precision_.size(), 0.0);
  cross_.assign(d_, 0.0);
  Refresh();  // with no rows yet chol_ factors Λ₀ itself
  prior_log_det_ = LogDetFromCholesky(chol_, d_);
}

void NigRegression::Add(const double* u, double z) {
  for (int i = 0; i < d_; ++i) {
    if (!std::isfinite(u[i])) {
      throw std::invalid_argument("NigRegression: non-finite regressor " + std::to_string(u[i]) +
                                  " in column " + std::to_string(i));
    }
  }
  if (!std::isfinite(z)) {
    throw std::invalid_argument("NigRegression: non-finite observation " + std::to_string(z));
  }
  for (int i = 0; i < d_; ++i) {
    for (int j = 0; j < d_; ++j) gram_[i * d_ + j] += u[i] * u[j];
    cross_[i] += u[i] * z;
  }
  sum_sq_ += z * z;
  ++n_;
  Refresh();
}

void NigRegression::Refresh() {
  std::vector<double> precision(prior_precision_);
  for (size_t i = 0; i < precision.size(); ++i) precision[i] += gram_[i];
  if (!Cholesky(precision, d_, &chol_)) {
    throw std::invalid_argument("NigRegression: posterior precision is not positive definite");
  }
  // η = Λ₀μ₀ + Σuz, μ_n = Λ_n⁻¹η.
  std::vector<double> eta(d_, 0.0);
  double prior_quad = 0;  // μ₀ᵀΛ₀μ₀
  for (int i = 0; i < d_; ++i) {
    double s = 0;
    for (int j = 0; j < d_; ++j) s += prior_precision_[i * d_ + j] * prior_mean_[j];
    eta[i] = s + cross_[i];
    prior_quad += prior_mean_[i] * s;
  }
  mean_ = eta;
  SolveLower(chol_, d_, mean_.data());
  SolveUpperT(chol_, d_, mean_.data());
  double post_quad = 0;  // μ_nᵀΛ_nμ_n = μ_nᵀη
  for (int i = 0; i < d_; ++i) post_quad += mean_[i] * eta[i];
  // b_n ≥ b₀ in exact arithmetic; rounding must not take it below.
  b_ = std::max(b0_, b0_ + 0.5 * (sum_sq_ + prior_quad - post_quad));
}

double NigRegression::ExpectedNoiseVariance() const {
  const double a_n = a();
  return a_n > 1 ? b_ / (a_n - 1) : b_ / a_n;
}

double NigRegression::Draw(Rng& rng, double* theta) const {
  const double sigma2 = b_ / rng.Gamma(a());
  // θ = μ + σ·L⁻ᵀw with w ~ N(0, I) has covariance σ²(LLᵀ)⁻¹ = σ²Λ_n⁻¹.
  std::vector<double> w(d_);
  for (int i = 0; i < d_; ++i) w[i] = rng.Normal();
  SolveUpperT(chol_, d_, w.data());
  const double sigma = std::sqrt(sigma2);
  for (int i = 0; i < d_; ++i) theta[i] = mean_[i] + sigma * w[i];
  return sigma2;
}

double NigRegression::PredictMean(const double* u) const {
  double s = 0;
  for (int i = 0; i < d_; ++i) s += u[i] * mean_[i];
  return s;
}

double NigRegression::PredictScale(const double* u, bool with_noise) const {
  // uᵀΛ_n⁻¹u = |L⁻¹u|². Called per candidate, so small dimensions avoid the heap.
  double small[kSmallDim];
  std::vector<double> large;
  double* v = small;
  if (d_ > kSmallDim) {
    large.resize(d_);
    v = large.data();
  }
  std::copy(u, u + d_, v);
  SolveLower(chol_, d_, v);
  double q = 0;
  for (int i = 0; i < d_; ++i) q += v[i] * v[i];
  return std::sqrt(b_ / a() * ((with_noise ? 1.0 : 0.0) + q));
}

double NigRegression::MarginalSd(int k) const {
  std::vector<double> e(d_, 0.0);
  e[k] = 1;
  SolveLower(chol_, d_, e.data());
  double q = 0;
  for (double x : e) q += x * x;
  return std::sqrt(ExpectedNoiseVariance() * q);
}

double NigRegression::LogEvidence() const {
  const double a_n = a();
  return 0.5 * (prior_log_det_ - LogDetFromCholesky(chol_, d_)) + a0_ * std::log(b0_) -
         a_n * std::log(b_) + std::lgamma(a_n) - std::lgamma(a0_);
}

void NigRegression::AddToDigest(Hasher* h) const {
  h->Add(static_cast<uint64_t>(n_));
  for (double v : gram_) h->Add(v);
  for (double v : cross_) h->Add(v);
  h->Add(sum_sq_);
  for (double v : mean_) h->Add(v);
  h->Add(b_);
}

}  // namespace autopar::search
