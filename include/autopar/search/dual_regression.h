// DualNigRegression: the Normal–Inverse-Gamma regression of regression.h in observation space, for
// models with many more coefficients than observations (docs/search.md §3).
//
// The model is the same:
//
//   σ² ~ IG(a₀, b₀),   β | σ² ~ N(μ₀, σ²·V),   z_j | β, σ² ~ N(u_jᵀβ, σ²),
//
// with V diagonal (entries may be 0: such a coefficient stays at its prior mean). The primal form
// inverts a D×D precision; this one works with the n×n matrix G = I + U·V·Uᵀ of the n rows, a
// Gaussian process whose kernel is k(u, u') = uᵀVu' (Rasmussen & Williams 2006, §2.1.2, "weight-
// space and function-space views"). With r = z − Uμ₀ and G = L·Lᵀ:
//
//   μ_n = μ₀ + V·Uᵀ·G⁻¹r,   a_n = a₀ + n/2,   b_n = b₀ + ½·rᵀG⁻¹r,
//   log p(z) = −½·log|G| + a₀·log b₀ − a_n·log b_n + log Γ(a_n) − log Γ(a₀)   (−n/2·log 2π left
//   out),
//
// the same numbers as NigRegression's (matrix determinant lemma and Woodbury identity), so the
// evidence of a dual model and a primal one compare. A row adds one row to L (O(n²)), so a study
// of n measurements costs O(n³) in all and O(n²) memory per model.
//
// A posterior draw is exact and joint over every coefficient, by Matheron's rule (pathwise
// conditioning, Wilson et al. 2020, "Efficiently sampling functions from Gaussian process
// posteriors"): draw σ², then β' ~ N(μ₀, σ²V) and ε' ~ N(0, σ²I) from the prior, and correct
//
//   β = β' + V·Uᵀ·G⁻¹(z − Uβ' − ε').
//
// Rows are sparse: a dense head (the first dense.size() coefficients) and unit entries elsewhere
// (the level and interaction indicators of a configuration), so a kernel entry costs the head plus
// a merge of two sorted index lists.
#pragma once

#include <cstdint>
#include <vector>

#include "autopar/search/rng.h"

namespace autopar::search {

struct SparseRow {
  std::vector<double> dense;   // values of coefficients [0, dense.size())
  std::vector<uint32_t> ones;  // ascending coefficients ≥ dense.size() whose value is 1
};

class DualNigRegression {
 public:
  // Prior mean μ₀ and the diagonal of V (≥ 0) over D coefficients; a₀, b₀ > 0. Throws
  // std::invalid_argument otherwise.
  DualNigRegression(std::vector<double> prior_mean, std::vector<double> prior_variance, double a0,
                    double b0);

  // One observation. Throws std::invalid_argument when a value is not finite or an index is out
  // of range or out of order.
  void Add(const SparseRow& row, double z);

  int dim() const { return static_cast<int>(prior_mean_.size()); }
  int64_t count() const { return static_cast<int64_t>(rows_.size()); }
  const std::vector<double>& mean() const { return mean_; }  // μ_n
  double a() const { return a0_ + 0.5 * static_cast<double>(rows_.size()); }
  double b() const { return b_; }
  double dof() const { return 2 * a(); }
  double ExpectedNoiseVariance() const;

  // One posterior draw of every coefficient (dim() values in `beta`); returns its σ².
  double Draw(Rng& rng, double* beta) const;

  // Posterior predictive at a row: Student-t with dof() degrees of freedom, this location and
  // squared scale (b_n/a_n)·(noise + uᵀVu − kᵀG⁻¹k), k_j = u_jᵀVu (noise 1 for a new observation).
  double PredictMean(const SparseRow& row) const;
  double PredictScale(const SparseRow& row, bool with_noise) const;
  // Marginal posterior sd of coefficient k: sqrt(E[σ²]·(V_kk − V_kk²·c_kᵀG⁻¹c_k)), c_k column k.
  double MarginalSd(int k) const;
  // How much the data determine coefficient k: 1 − (posterior variance / prior variance) =
  // V_kk·c_kᵀG⁻¹c_k, in [0, 1): 0 for a coefficient no row touches (or of prior variance 0).
  double Determined(int k) const;
  double LogEvidence() const;
  void AddToDigest(Hasher* h) const;

 private:
  double Kernel(const SparseRow& x, const SparseRow& y) const;  // xᵀVy
  // V_kk²·c_kᵀG⁻¹c_k: the part of coefficient k's prior variance (per unit σ²) the data explain.
  double ExplainedVariance(int k) const;
  double Dot(const SparseRow& x, const double* beta) const;     // xᵀβ
  void CheckRow(const SparseRow& row) const;
  // x ← L⁻¹x and x ← L⁻ᵀx with the packed lower factor.
  void SolveL(double* x) const;
  void SolveLt(double* x) const;
  double L(size_t i, size_t j) const { return chol_[i * (i + 1) / 2 + j]; }

  std::vector<double> prior_mean_, prior_variance_;
  double a0_, b0_;
  std::vector<SparseRow> rows_;
  std::vector<double> z_;
  std::vector<double> chol_;  // L, row-major packed lower triangle
  std::vector<double> y_;     // L⁻¹r
  double log_det_ = 0;        // log|G|
  double quad_ = 0;           // rᵀG⁻¹r = |y|²
  std::vector<double> mean_;
  double b_ = 0;
};

}  // namespace autopar::search
