// NigRegression: conjugate Bayesian linear regression with unknown noise variance, the
// Normal–Inverse-Gamma model (Murphy, "Machine Learning: a Probabilistic Perspective" 2012,
// §7.6.3; O'Hagan & Forster, Kendall's Advanced Theory of Statistics 2B, §11).
//
//   σ² ~ IG(a₀, b₀),   θ | σ² ~ N(μ₀, σ²·Λ₀⁻¹),   z_i | θ, σ² ~ N(u_iᵀθ, σ²).
//
// After n rows u_i with targets z_i the posterior is again Normal–Inverse-Gamma, in closed form:
//
//   Λ_n = Λ₀ + Σ u_i u_iᵀ,   μ_n = Λ_n⁻¹ (Λ₀μ₀ + Σ u_i z_i),   a_n = a₀ + n/2,
//   b_n = b₀ + ½ (Σ z_i² + μ₀ᵀΛ₀μ₀ − μ_nᵀΛ_nμ_n).
//
// The posterior is kept as the prior plus the sufficient statistics (Σuuᵀ, Σuz, Σz², n), so it is
// the same whatever the grouping of the updates, and a digest of it is cheap.
#pragma once

#include <cstdint>
#include <vector>

#include "autopar/search/rng.h"

namespace autopar::search {

class NigRegression {
 public:
  // `prior_precision` is Λ₀ (d×d, row-major, positive definite); a₀, b₀ > 0.
  NigRegression(std::vector<double> prior_mean, std::vector<double> prior_precision, double a0,
                double b0);

  // One observation. Throws std::invalid_argument when u or z is not finite: a NaN would
  // silently poison every later proposal.
  void Add(const double* u, double z);

  int dim() const { return d_; }
  int64_t count() const { return n_; }
  const std::vector<double>& mean() const { return mean_; }  // μ_n
  double a() const { return a0_ + 0.5 * static_cast<double>(n_); }
  double b() const { return b_; }
  // E[σ²] = b/(a − 1) (for a > 1).
  double ExpectedNoiseVariance() const;

  // One posterior draw: σ² ~ IG(a_n, b_n), then θ ~ N(μ_n, σ²·Λ_n⁻¹). Writes d values to
  // `theta` and returns the σ² of the draw.
  double Draw(Rng& rng, double* theta) const;

  // Posterior predictive of z at u: Student-t with 2a_n degrees of freedom, location uᵀμ_n and
  // squared scale (b_n/a_n)(noise + uᵀΛ_n⁻¹u), noise = 1 for a new observation, 0 for the mean.
  double PredictMean(const double* u) const;
  double PredictScale(const double* u, bool with_noise) const;
  double dof() const { return 2 * a(); }
  // Marginal posterior standard deviation of θ_k: sqrt(b/(a − 1) · (Λ_n⁻¹)_kk).
  double MarginalSd(int k) const;
  // log p(z₁…z_n), the evidence of the data under this prior (Murphy 2012, eq. 7.127 with the
  // constant −n/2·log 2π left out, the same for every model of the same rows):
  //   ½ log|Λ₀| − ½ log|Λ_n| + a₀ log b₀ − a_n log b_n + log Γ(a_n) − log Γ(a₀).
  double LogEvidence() const;

  // The sufficient statistics, for digests and tests.
  const std::vector<double>& gram() const { return gram_; }    // Σ u uᵀ
  const std::vector<double>& cross() const { return cross_; }  // Σ u z
  double sum_sq() const { return sum_sq_; }                    // Σ z²
  void AddToDigest(Hasher* h) const;

 private:
  void Refresh();

  int d_;
  std::vector<double> prior_mean_, prior_precision_;
  double a0_, b0_;
  double prior_log_det_ = 0;  // log|Λ₀|
  std::vector<double> gram_, cross_;
  double sum_sq_ = 0;
  int64_t n_ = 0;
  // Derived: μ_n, the Cholesky factor of Λ_n, b_n.
  std::vector<double> mean_, chol_;
  double b_ = 0;
};

}  // namespace autopar::search
