#include "autopar/search/math.h"

#include <cmath>
#include <limits>

namespace autopar::search {
namespace {

// Continued fraction of the incomplete beta function (modified Lentz), Numerical Recipes §6.4.
double BetaContinuedFraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300;
  constexpr double kEps = 1e-15;
  const double qab = a + b, qap = a + 1, qam = a - 1;
  double c = 1, d = 1 - qab * x / qap;
  if (std::fabs(d) < kTiny) d = kTiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 300; ++m) {
    const int m2 = 2 * m;
    double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
    d = 1 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    h *= d * c;
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
    d = 1 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < kEps) break;
  }
  return h;
}

// Regularised incomplete beta I_x(a, b).
double IncompleteBeta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double log_front =
      std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x);
  if (x < (a + 1) / (a + b + 2)) return std::exp(log_front) * BetaContinuedFraction(a, b, x) / a;
  return 1 - std::exp(log_front) * BetaContinuedFraction(b, a, 1 - x) / b;
}

}  // namespace

double NormalPdf(double z) { return 0.3989422804014327 * std::exp(-0.5 * z * z); }

double NormalCdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

double StudentTCdf(double t, double nu) {
  if (std::isinf(t)) return t > 0 ? 1 : 0;
  const double tail = 0.5 * IncompleteBeta(nu / 2, 0.5, nu / (nu + t * t));
  return t > 0 ? 1 - tail : tail;
}

double StudentTQuantile(double p, double nu) {
  if (p <= 0) return -std::numeric_limits<double>::infinity();
  if (p >= 1) return std::numeric_limits<double>::infinity();
  if (p < 0.5) return -StudentTQuantile(1 - p, nu);
  double lo = 0, hi = 1;
  while (StudentTCdf(hi, nu) < p && hi < 1e12) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (StudentTCdf(mid, nu) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

bool Cholesky(const std::vector<double>& a, int d, std::vector<double>* l) {
  l->assign(static_cast<size_t>(d) * d, 0.0);
  std::vector<double>& L = *l;
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j <= i; ++j) {
      double s = a[i * d + j];
      for (int k = 0; k < j; ++k) s -= L[i * d + k] * L[j * d + k];
      if (i == j) {
        if (!(s > 0)) return false;
        L[i * d + i] = std::sqrt(s);
      } else {
        L[i * d + j] = s / L[j * d + j];
      }
    }
  }
  return true;
}

void SolveLower(const std::vector<double>& l, int d, double* b) {
  for (int i = 0; i < d; ++i) {
    double s = b[i];
    for (int k = 0; k < i; ++k) s -= l[i * d + k] * b[k];
    b[i] = s / l[i * d + i];
  }
}

void SolveUpperT(const std::vector<double>& l, int d, double* b) {
  for (int i = d - 1; i >= 0; --i) {
    double s = b[i];
    for (int k = i + 1; k < d; ++k) s -= l[k * d + i] * b[k];
    b[i] = s / l[i * d + i];
  }
}

}  // namespace autopar::search
