#include "autopar/search/dual_regression.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace autopar::search {

DualNigRegression::DualNigRegression(std::vector<double> prior_mean,
                                     std::vector<double> prior_variance, double a0, double b0)
    : prior_mean_(std::move(prior_mean)),
      prior_variance_(std::move(prior_variance)),
      a0_(a0),
      b0_(b0),
      mean_(prior_mean_),
      b_(b0) {
  if (prior_variance_.size() != prior_mean_.size()) {
    throw std::invalid_argument("DualNigRegression: prior mean and variance differ in length");
  }
  for (size_t k = 0; k < prior_mean_.size(); ++k) {
    if (!std::isfinite(prior_mean_[k]) || !(prior_variance_[k] >= 0) ||
        !std::isfinite(prior_variance_[k])) {
      throw std::invalid_argument("DualNigRegression: bad prior for coefficient " +
                                  std::to_string(k));
    }
  }
  if (!(a0_ > 0) || !(b0_ > 0)) {
    throw std::invalid_argument("DualNigRegression: a0 and b0 must be positive");
  }
}

void DualNigRegression::CheckRow(const SparseRow& row) const {
  const size_t d = prior_mean_.size();
  if (row.dense.size() > d) throw std::invalid_argument("DualNigRegression: row too long");
  for (double v : row.dense) {
    if (!std::isfinite(v)) {
      throw std::invalid_argument("DualNigRegression: non-finite regressor " + std::to_string(v));
    }
  }
  uint32_t previous = 0;
  for (size_t i = 0; i < row.ones.size(); ++i) {
    const uint32_t k = row.ones[i];
    if (k < row.dense.size() || k >= d || (i > 0 && k <= previous)) {
      throw std::invalid_argument("DualNigRegression: unit index " + std::to_string(k) +
                                  " out of range or order");
    }
    previous = k;
  }
}

double DualNigRegression::Kernel(const SparseRow& x, const SparseRow& y) const {
  double s = 0;
  const size_t head = std::min(x.dense.size(), y.dense.size());
  for (size_t k = 0; k < head; ++k) s += prior_variance_[k] * x.dense[k] * y.dense[k];
  // Shared unit entries: a merge of the two ascending lists.
  size_t i = 0, j = 0;
  while (i < x.ones.size() && j < y.ones.size()) {
    if (x.ones[i] < y.ones[j]) {
      ++i;
    } else if (y.ones[j] < x.ones[i]) {
      ++j;
    } else {
      s += prior_variance_[x.ones[i]];
      ++i;
      ++j;
    }
  }
  return s;
}

double DualNigRegression::Dot(const SparseRow& x, const double* beta) const {
  double s = 0;
  for (size_t k = 0; k < x.dense.size(); ++k) s += x.dense[k] * beta[k];
  for (uint32_t k : x.ones) s += beta[k];
  return s;
}

void DualNigRegression::SolveL(double* x) const {
  const size_t n = rows_.size();
  for (size_t i = 0; i < n; ++i) {
    double s = x[i];
    const double* row = chol_.data() + i * (i + 1) / 2;
    for (size_t k = 0; k < i; ++k) s -= row[k] * x[k];
    x[i] = s / row[i];
  }
}

void DualNigRegression::SolveLt(double* x) const {
  const size_t n = rows_.size();
  for (size_t i = n; i-- > 0;) {
    x[i] /= L(i, i);
    // Column i of L lies across the rows below it: subtract it from the entries above.
    const double* row = chol_.data() + i * (i + 1) / 2;
    for (size_t k = 0; k < i; ++k) x[k] -= row[k] * x[i];
  }
}

void DualNigRegression::Add(const SparseRow& row, double z) {
  CheckRow(row);
  if (!std::isfinite(z)) {
    throw std::invalid_argument("DualNigRegression: non-finite observation " + std::to_string(z));
  }
  const size_t n = rows_.size();
  // The new row of L: l = L⁻¹g with g_j = k(u_j, u), and the Schur complement of G. G = I + K
  // makes it ≥ 1 in exact arithmetic; rounding must not take it below.
  std::vector<double> l(n + 1);
  for (size_t j = 0; j < n; ++j) l[j] = Kernel(rows_[j], row);
  SolveL(l.data());
  double schur = 1 + Kernel(row, row);
  for (size_t j = 0; j < n; ++j) schur -= l[j] * l[j];
  schur = std::max(schur, 1.0);
  l[n] = std::sqrt(schur);
  const double r = z - Dot(row, prior_mean_.data());
  double y = r;
  for (size_t j = 0; j < n; ++j) y -= l[j] * y_[j];
  y /= l[n];
  chol_.insert(chol_.end(), l.begin(), l.end());
  y_.push_back(y);
  log_det_ += std::log(schur);
  quad_ += y * y;
  rows_.push_back(row);
  z_.push_back(z);
  b_ = b0_ + 0.5 * quad_;
  // μ_n = μ₀ + V·Uᵀα with α = G⁻¹r = L⁻ᵀy.
  std::vector<double> alpha(y_);
  SolveLt(alpha.data());
  mean_ = prior_mean_;
  for (size_t j = 0; j <= n; ++j) {
    const SparseRow& u = rows_[j];
    for (size_t k = 0; k < u.dense.size(); ++k)
      mean_[k] += prior_variance_[k] * u.dense[k] * alpha[j];
    for (uint32_t k : u.ones) mean_[k] += prior_variance_[k] * alpha[j];
  }
}

double DualNigRegression::ExpectedNoiseVariance() const {
  const double a_n = a();
  return a_n > 1 ? b_ / (a_n - 1) : b_ / a_n;
}

double DualNigRegression::Draw(Rng& rng, double* beta) const {
  const double sigma2 = b_ / rng.Gamma(a());
  const double sigma = std::sqrt(sigma2);
  const size_t d = prior_mean_.size(), n = rows_.size();
  for (size_t k = 0; k < d; ++k) {
    beta[k] = prior_mean_[k] + sigma * std::sqrt(prior_variance_[k]) * rng.Normal();
  }
  if (n == 0) return sigma2;
  // e = z − Uβ' − ε', then α = G⁻¹e and β += V·Uᵀα.
  std::vector<double> e(n);
  for (size_t j = 0; j < n; ++j) e[j] = z_[j] - Dot(rows_[j], beta) - sigma * rng.Normal();
  SolveL(e.data());
  SolveLt(e.data());
  for (size_t j = 0; j < n; ++j) {
    const SparseRow& u = rows_[j];
    for (size_t k = 0; k < u.dense.size(); ++k) beta[k] += prior_variance_[k] * u.dense[k] * e[j];
    for (uint32_t k : u.ones) beta[k] += prior_variance_[k] * e[j];
  }
  return sigma2;
}

double DualNigRegression::PredictMean(const SparseRow& row) const { return Dot(row, mean_.data()); }

double DualNigRegression::PredictScale(const SparseRow& row, bool with_noise) const {
  const size_t n = rows_.size();
  std::vector<double> k(n);
  for (size_t j = 0; j < n; ++j) k[j] = Kernel(rows_[j], row);
  SolveL(k.data());
  double q = Kernel(row, row);
  for (double v : k) q -= v * v;
  return std::sqrt(b_ / a() * ((with_noise ? 1.0 : 0.0) + std::max(q, 0.0)));
}

double DualNigRegression::ExplainedVariance(int k) const {
  const double v = prior_variance_[static_cast<size_t>(k)];
  const size_t n = rows_.size();
  std::vector<double> c(n, 0.0);
  bool touched = false;
  for (size_t j = 0; j < n; ++j) {
    const SparseRow& u = rows_[j];
    if (static_cast<size_t>(k) < u.dense.size()) {
      c[j] = v * u.dense[k];
    } else if (std::binary_search(u.ones.begin(), u.ones.end(), static_cast<uint32_t>(k))) {
      c[j] = v;
    }
    touched = touched || c[j] != 0;
  }
  if (!touched) return 0;
  SolveL(c.data());
  double explained = 0;
  for (double x : c) explained += x * x;
  return std::min(explained, v);
}

double DualNigRegression::MarginalSd(int k) const {
  const double q = prior_variance_[static_cast<size_t>(k)] - ExplainedVariance(k);
  return std::sqrt(ExpectedNoiseVariance() * std::max(q, 0.0));
}

double DualNigRegression::Determined(int k) const {
  const double v = prior_variance_[static_cast<size_t>(k)];
  return v > 0 ? ExplainedVariance(k) / v : 0.0;
}

double DualNigRegression::LogEvidence() const {
  const double a_n = a();
  return -0.5 * log_det_ + a0_ * std::log(b0_) - a_n * std::log(b_) + std::lgamma(a_n) -
         std::lgamma(a0_);
}

void DualNigRegression::AddToDigest(Hasher* h) const {
  h->Add(static_cast<uint64_t>(rows_.size()));
  for (double v : z_) h->Add(v);
  for (double v : y_) h->Add(v);
  h->Add(log_det_);
  for (double v : mean_) h->Add(v);
  h->Add(b_);
}

}  // namespace autopar::search
