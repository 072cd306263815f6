// Small numerical pieces of the posterior: distribution functions and dense linear algebra on
// d×d matrices with d ≤ a dozen (row-major std::vector<double>).
#pragma once

#include <vector>

namespace autopar::search {

double NormalPdf(double z);
double NormalCdf(double z);
// Student-t CDF with `nu` > 0 degrees of freedom, through the regularised incomplete beta
// function I_x(ν/2, 1/2) with x = ν/(ν + t²) (Abramowitz & Stegun 26.7.1), evaluated by
// Lentz's continued fraction (Numerical Recipes 3rd ed. §6.4).
double StudentTCdf(double t, double nu);
// Its inverse, by bisection (called once per posterior update, not per candidate).
double StudentTQuantile(double p, double nu);

// Lower Cholesky factor L of a symmetric positive-definite matrix A = L·Lᵀ (d×d, row-major).
// Returns false when A is not positive definite.
bool Cholesky(const std::vector<double>& a, int d, std::vector<double>* l);
// Solves L·x = b (forward) and Lᵀ·x = b (backward) in place.
void SolveLower(const std::vector<double>& l, int d, double* b);
void SolveUpperT(const std::vector<double>& l, int d, double* b);

}  // namespace autopar::search
