#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "autopar/search/dual_regression.h"
#include "autopar/search/math.h"
#include "autopar/search/posterior.h"
#include "autopar/search/regression.h"
#include "autopar/search/rng.h"

namespace autopar::search {
namespace {

// The conjugate update of a 2-parameter model computed by hand: explicit 2×2 inverse, the
// formulas of Murphy (2012) §7.6.3 written out term by term.
TEST(NigRegression, MatchesHandComputedConjugateUpdate) {
  const double mu0[2] = {1.0, 0.0};
  const double lambda0[4] = {2.0, 0.0, 0.0, 3.0};
  const double a0 = 2.0, b0 = 0.5;
  NigRegression r({mu0[0], mu0[1]}, {lambda0[0], lambda0[1], lambda0[2], lambda0[3]}, a0, b0);
  const double rows[3][2] = {{1.0, 2.0}, {0.5, -1.0}, {2.0, 1.0}};
  const double z[3] = {3.0, 0.2, 2.5};
  for (int i = 0; i < 3; ++i) r.Add(rows[i], z[i]);

  // Λn = Λ0 + Σ u uᵀ.
  double l11 = lambda0[0], l12 = 0, l22 = lambda0[3];
  double e1 = lambda0[0] * mu0[0], e2 = lambda0[3] * mu0[1];  // η = Λ0 μ0 + Σ u z
  double zz = 0;
  for (int i = 0; i < 3; ++i) {
    l11 += rows[i][0] * rows[i][0];
    l12 += rows[i][0] * rows[i][1];
    l22 += rows[i][1] * rows[i][1];
    e1 += rows[i][0] * z[i];
    e2 += rows[i][1] * z[i];
    zz += z[i] * z[i];
  }
  const double det = l11 * l22 - l12 * l12;
  const double v11 = l22 / det, v12 = -l12 / det, v22 = l11 / det;  // Λn⁻¹
  const double m1 = v11 * e1 + v12 * e2, m2 = v12 * e1 + v22 * e2;
  const double an = a0 + 3 / 2.0;
  const double prior_quad = lambda0[0] * mu0[0] * mu0[0] + lambda0[3] * mu0[1] * mu0[1];
  const double post_quad = m1 * e1 + m2 * e2;
  const double bn = b0 + 0.5 * (zz + prior_quad - post_quad);

  EXPECT_NEAR(r.mean()[0], m1, 1e-12);
  EXPECT_NEAR(r.mean()[1], m2, 1e-12);
  EXPECT_DOUBLE_EQ(r.a(), an);
  EXPECT_NEAR(r.b(), bn, 1e-12);
  EXPECT_NEAR(r.MarginalSd(0), std::sqrt(bn / (an - 1) * v11), 1e-12);
  EXPECT_NEAR(r.MarginalSd(1), std::sqrt(bn / (an - 1) * v22), 1e-12);
  // Predictive at u = (1, 1): location uᵀμ, squared scale (b/a)(1 + uᵀVu).
  const double u[2] = {1, 1};
  EXPECT_NEAR(r.PredictMean(u), m1 + m2, 1e-12);
  EXPECT_NEAR(r.PredictScale(u, true), std::sqrt(bn / an * (1 + v11 + 2 * v12 + v22)), 1e-12);
  EXPECT_NEAR(r.PredictScale(u, false), std::sqrt(bn / an * (v11 + 2 * v12 + v22)), 1e-12);
}

TEST(NigRegression, UpdateOrderDoesNotMatter) {
  NigRegression a({0, 0}, {1, 0, 0, 1}, 2, 1), b({0, 0}, {1, 0, 0, 1}, 2, 1);
  const double u1[2] = {1, 0.5}, u2[2] = {-0.25, 2};
  a.Add(u1, 1.5);
  a.Add(u2, -0.5);
  b.Add(u2, -0.5);
  b.Add(u1, 1.5);
  EXPECT_NEAR(a.mean()[0], b.mean()[0], 1e-14);
  EXPECT_NEAR(a.mean()[1], b.mean()[1], 1e-14);
  EXPECT_NEAR(a.b(), b.b(), 1e-14);
}

TEST(NigRegression, DrawsHaveThePosteriorMoments) {
  NigRegression r({1, 1}, {4, 1, 1, 9}, 3, 0.2);
  const double u[2] = {1, 2};
  r.Add(u, 2.5);
  Rng rng(7, 0, Purpose::kProposal);
  const int n = 40000;
  double s0 = 0, s1 = 0, ss0 = 0;
  for (int i = 0; i < n; ++i) {
    double t[2];
    r.Draw(rng, t);
    s0 += t[0];
    s1 += t[1];
    ss0 += (t[0] - r.mean()[0]) * (t[0] - r.mean()[0]);
  }
  EXPECT_NEAR(s0 / n, r.mean()[0], 0.01);
  EXPECT_NEAR(s1 / n, r.mean()[1], 0.01);
  EXPECT_NEAR(std::sqrt(ss0 / n), r.MarginalSd(0), 0.03 * r.MarginalSd(0));
}

TEST(NigRegression, NonFiniteObservationsAreRejectedLoudly) {
  NigRegression r({0}, {1}, 2, 1);
  const double u[1] = {1};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THROW(r.Add(u, nan), std::invalid_argument);
  EXPECT_THROW(r.Add(u, inf), std::invalid_argument);
  const double bad[1] = {nan};
  EXPECT_THROW(r.Add(bad, 1.0), std::invalid_argument);
  EXPECT_EQ(r.count(), 0);  // nothing half-applied
}

// The evidence in closed form equals the joint density of the data written out directly: z ~
// multivariate Student-t with 2a₀ degrees of freedom, location Uμ₀ and scale (b₀/a₀)(I + UΛ₀⁻¹Uᵀ).
// Two rows of one coefficient keep the 2×2 algebra explicit; −n/2·log 2π is left out by both.
TEST(NigRegression, EvidenceIsTheMarginalDensityOfTheData) {
  const double mu0 = 0.5, lambda0 = 4, a0 = 3, b0 = 0.7;
  NigRegression r({mu0}, {lambda0}, a0, b0);
  EXPECT_NEAR(r.LogEvidence(), 0, 1e-12);  // no data: density 1
  const double u[2] = {1.0, 2.0}, z[2] = {0.9, 0.4};
  for (int i = 0; i < 2; ++i) r.Add(&u[i], z[i]);
  const double s = b0 / a0, nu = 2 * a0;
  const double c11 = s * (1 + u[0] * u[0] / lambda0), c12 = s * u[0] * u[1] / lambda0,
               c22 = s * (1 + u[1] * u[1] / lambda0);
  const double det = c11 * c22 - c12 * c12;
  const double d1 = z[0] - u[0] * mu0, d2 = z[1] - u[1] * mu0;
  const double quad = (c22 * d1 * d1 - 2 * c12 * d1 * d2 + c11 * d2 * d2) / det;
  const double p = 2;
  const double expected = std::lgamma((nu + p) / 2) - std::lgamma(nu / 2) - p / 2 * std::log(nu) +
                          p / 2 * std::log(2.0) - 0.5 * std::log(det) -
                          (nu + p) / 2 * std::log1p(quad / nu);
  // The t density has −p/2·log(νπ); the evidence leaves out −p/2·log(2π): add back p/2·log 2
  // (done above) and compare.
  EXPECT_NEAR(r.LogEvidence(), expected, 1e-10);
}

TEST(Distributions, StudentTMatchesTables) {
  // Values from standard t tables.
  EXPECT_NEAR(StudentTCdf(2.015, 5), 0.95, 5e-4);
  EXPECT_NEAR(StudentTCdf(-2.015, 5), 0.05, 5e-4);
  EXPECT_NEAR(StudentTCdf(0, 3), 0.5, 1e-12);
  EXPECT_NEAR(StudentTCdf(1.96, 1e6), NormalCdf(1.96), 1e-5);
  EXPECT_NEAR(StudentTQuantile(0.975, 10), 2.228, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.05, 4), -2.132, 1e-3);
  for (double p : {0.01, 0.3, 0.5, 0.9, 0.999}) {
    EXPECT_NEAR(StudentTCdf(StudentTQuantile(p, 4.5), 4.5), p, 1e-9);
  }
}

// A memory draw is a draw from the Student-t predictive: over many draws a candidate fits with
// the probability 1 − POom says.
TEST(MemoryPosterior, DrawsFitWithTheProbabilityPOomGives) {
  MemoryPosterior m(MemoryPrior{});
  for (double nominal : {20.0, 30.0, 40.0, 60.0}) m.ObservePeak({nominal}, 1.04 * nominal + 0.3);
  Rng rng(3, 0, Purpose::kProposal);
  for (double nominal : {70.0, 75.0, 78.0}) {
    const int n = 40000;
    int fits = 0;
    for (int i = 0; i < n; ++i) fits += m.Draw(rng).Fits({nominal}, 80, rng.Normal());
    EXPECT_NEAR(static_cast<double>(fits) / n, 1 - m.POom({nominal}, 80), 0.01) << nominal;
  }
}

// The observation-space form is the same model as the primal one: on rows with a dense head and
// unit entries, both give the same posterior mean, b_n, evidence, predictive and marginals.
TEST(DualNigRegression, MatchesThePrimalForm) {
  const int d = 7;  // 3 dense coefficients, 4 indicators
  const std::vector<double> mean0 = {1.0, 0.5, 0.0, 0.0, 0.0, 0.1, 0.0};
  const std::vector<double> variance = {0.3, 2.0, 0.5, 0.05, 0.05, 0.2, 0.01};
  std::vector<double> precision(static_cast<std::size_t>(d) * d, 0.0);
  for (int k = 0; k < d; ++k) precision[k * d + k] = 1 / variance[k];
  DualNigRegression dual(mean0, variance, 2.0, 0.02);
  NigRegression primal(mean0, precision, 2.0, 0.02);
  Rng rng(11, 0, Purpose::kSynthetic);
  auto make_row = [&](Rng& r) {
    SparseRow row;
    row.dense = {1.0, 0.2 + r.Uniform(), r.Normal()};
    for (uint32_t k = 3; k < d; ++k) {
      if (r.Uniform() < 0.5) row.ones.push_back(k);
    }
    return row;
  };
  auto dense = [&](const SparseRow& row) {
    std::vector<double> u(d, 0.0);
    for (size_t k = 0; k < row.dense.size(); ++k) u[k] = row.dense[k];
    for (uint32_t k : row.ones) u[k] = 1;
    return u;
  };
  for (int n = 0; n < 12; ++n) {
    const SparseRow row = make_row(rng);
    const double z = 1.1 + 0.3 * row.dense[1] + 0.05 * rng.Normal();
    dual.Add(row, z);
    primal.Add(dense(row).data(), z);
  }
  EXPECT_NEAR(dual.b(), primal.b(), 1e-12);
  EXPECT_NEAR(dual.LogEvidence(), primal.LogEvidence(), 1e-9);
  for (int k = 0; k < d; ++k) {
    EXPECT_NEAR(dual.mean()[k], primal.mean()[k], 1e-10) << k;
    EXPECT_NEAR(dual.MarginalSd(k), primal.MarginalSd(k), 1e-10) << k;
  }
  for (int n = 0; n < 5; ++n) {
    const SparseRow row = make_row(rng);
    EXPECT_NEAR(dual.PredictMean(row), primal.PredictMean(dense(row).data()), 1e-10);
    for (bool noise : {true, false}) {
      EXPECT_NEAR(dual.PredictScale(row, noise), primal.PredictScale(dense(row).data(), noise),
                  1e-10);
    }
  }
  SparseRow bad;
  bad.dense = {1.0};
  bad.ones = {5, 4};
  EXPECT_THROW(dual.Add(bad, 1.0), std::invalid_argument);
  EXPECT_THROW(dual.Add(make_row(rng), std::numeric_limits<double>::infinity()),
               std::invalid_argument);
}

// Determined(k) is 1 − posterior/prior variance of coefficient k (per unit σ², the primal
// form's Λ_n⁻¹ against V): 0 for a coefficient no row has touched or whose prior variance is 0,
// rising towards 1 as rows pin it down.
TEST(DualNigRegression, DeterminedIsTheShareOfThePriorVarianceTheDataExplain) {
  const std::vector<double> mean0 = {1.0, 0.0, 0.0, 0.0};
  const std::vector<double> variance = {0.5, 0.2, 0.2, 0.0};
  DualNigRegression dual(mean0, variance, 2.0, 0.02);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(dual.Determined(k), 0.0) << k;
  SparseRow row;
  row.dense = {1.0};
  row.ones = {1, 3};
  double previous = 0;
  for (int n = 0; n < 6; ++n) {
    dual.Add(row, 1.2);
    const double d = dual.Determined(1);
    EXPECT_GT(d, previous);
    EXPECT_LT(d, 1.0);
    previous = d;
  }
  EXPECT_EQ(dual.Determined(2), 0.0);  // never touched
  EXPECT_EQ(dual.Determined(3), 0.0);  // prior variance 0
  // Against the primal posterior covariance: Λ_n = V⁻¹ + ΣuuᵀJ over the coefficients with
  // variance, here θ₀ and coefficient 1 (2×2), six identical rows.
  const double a = 1 / variance[0] + 6, b = 6, c = 1 / variance[1] + 6;
  const double posterior_1 = a / (a * c - b * b);
  EXPECT_NEAR(dual.Determined(1), 1 - posterior_1 / variance[1], 1e-10);
}

// Matheron's rule draws from the posterior: over many draws, the mean and spread of every
// coefficient are the posterior's (a coefficient with prior variance 0 never moves).
TEST(DualNigRegression, PathwiseDrawsHaveThePosteriorMoments) {
  DualNigRegression r({1.0, 0.0, 0.0, 0.0}, {0.5, 0.2, 0.2, 0.0}, 3.0, 0.01);
  Rng data(2, 0, Purpose::kSynthetic);
  for (int n = 0; n < 6; ++n) {
    SparseRow row{{1.0}, {static_cast<uint32_t>(1 + n % 2), 3}};
    r.Add(row, 1.0 + (n % 2 ? 0.1 : -0.05) + 0.02 * data.Normal());
  }
  Rng rng(4, 0, Purpose::kProposal);
  const int draws = 40000;
  double sum[4] = {}, sq[4] = {};
  std::vector<double> beta(4);
  for (int j = 0; j < draws; ++j) {
    r.Draw(rng, beta.data());
    for (int k = 0; k < 4; ++k) {
      sum[k] += beta[k];
      sq[k] += beta[k] * beta[k];
    }
  }
  for (int k = 0; k < 3; ++k) {
    const double mean = sum[k] / draws, sd = std::sqrt(sq[k] / draws - mean * mean);
    EXPECT_NEAR(mean, r.mean()[k], 0.03 * r.MarginalSd(k) + 1e-12) << k;
    EXPECT_NEAR(sd, r.MarginalSd(k), 0.03 * r.MarginalSd(k)) << k;
  }
  EXPECT_EQ(sum[3], 0.0);
}

TEST(TimePrior, CommunicationIsWiderAndProbeTightens) {
  TimePrior p = TimePrior::Default(10.0);
  EXPECT_EQ(p.mean[kGemm], 1.0);
  EXPECT_GT(p.sd[kTpComm], p.sd[kGemm]);
  EXPECT_EQ(p.mean[kIntercept], 0.0);
  const double before = p.sd[kTpComm];
  p.Tighten(kTpComm, {1.4, 1.5, 1.6});
  EXPECT_LT(p.sd[kTpComm], before);
  EXPECT_GT(p.mean[kTpComm], 1.3);  // pulled most of the way to the probe's 1.5
  EXPECT_LT(p.mean[kTpComm], 1.5);
  EXPECT_THROW(p.Tighten(kGemm, {}), std::invalid_argument);
  EXPECT_THROW(p.Tighten(kGemm, {std::numeric_limits<double>::quiet_NaN()}), std::invalid_argument);
  EXPECT_THROW(p.Tighten(kNumFeatures + 3, {1.0}), std::invalid_argument);
}

TEST(MemoryPosterior, LearnsScaleFromPeaksAndOomRaisesRisk) {
  MemoryPosterior m(MemoryPrior{});
  EXPECT_NEAR(m.PredictMean({40}), 40, 1e-9);
  for (double nominal : {20.0, 30.0, 40.0, 50.0, 60.0}) m.ObservePeak({nominal}, 1.2 * nominal);
  EXPECT_NEAR(m.scale(), 1.2, 0.03);
  EXPECT_GT(m.POom({70}, 80), 0.5);  // 84 GiB expected
  EXPECT_LT(m.POom({50}, 80), 0.01);

  MemoryPosterior fresh(MemoryPrior{});
  const double before = fresh.POom({70}, 80);
  EXPECT_TRUE(fresh.ObserveOom({72}, 80));  // plausible: imputed
  EXPECT_GT(fresh.POom({70}, 80), before);
  fresh.ObservePeak({30}, 30);
  EXPECT_FALSE(fresh.ObserveOom({10}, 80));  // a lone surprise: left to pruning
  EXPECT_THROW(fresh.ObservePeak({10}, std::numeric_limits<double>::infinity()),
               std::invalid_argument);
}

// A run of OOMs the model thought impossible says the model is wrong: the first is a surprise,
// the second and later are learnt, and the posterior widens (the predictive scale grows).
TEST(MemoryPosterior, ARunOfSurpriseOomsWidensThePosterior) {
  MemoryPosterior m(MemoryPrior{});
  for (double nominal : {20.0, 30.0, 40.0}) m.ObservePeak({nominal}, nominal);
  const double before = m.Margin({30}, 80);
  EXPECT_FALSE(m.ObserveOom({12}, 80));
  EXPECT_TRUE(m.ObserveOom({14}, 80));
  EXPECT_TRUE(m.ObserveOom({16}, 80));
  EXPECT_EQ(m.oom_run(), 3);
  EXPECT_LT(m.Margin({30}, 80), 0.5 * before);
  m.ObservePeak({25}, 25);  // a measured peak ends the run
  EXPECT_EQ(m.oom_run(), 0);
}

// Memory structure per knob value: a per-tp overhead the scale/offset model cannot express is
// learnt as a level effect, and predicts the tp=8 configurations it has not seen.
TEST(MemoryPosterior, LearnsAPerKnobValueOverhead) {
  // Two knobs with two values each: level coefficients kNumCoefficients + {0, 1} (tp=1, tp=8)
  // and + {2, 3} (mbs=1, mbs=2).
  const uint16_t k = kNumCoefficients;
  const uint16_t tp1mbs1[] = {k, static_cast<uint16_t>(k + 2)};
  const uint16_t tp8mbs1[] = {static_cast<uint16_t>(k + 1), static_cast<uint16_t>(k + 2)};
  const uint16_t tp8mbs2[] = {static_cast<uint16_t>(k + 1), static_cast<uint16_t>(k + 3)};
  MemoryPosterior m(MemoryPrior{}, 4, 2);
  for (double nominal : {20.0, 30.0, 40.0, 50.0}) {
    m.ObservePeak({nominal, tp1mbs1, 2}, nominal);
    m.ObservePeak({nominal, tp8mbs1, 2}, 1.08 * nominal);
  }
  const MemoryRow unseen{45.0, tp8mbs2, 2};
  EXPECT_GT(m.PredictMean(unseen), 1.04 * 45);
  MemoryPosterior plain(MemoryPrior{});
  for (double nominal : {20.0, 30.0, 40.0, 50.0}) {
    plain.ObservePeak({nominal}, nominal);
    plain.ObservePeak({nominal}, 1.08 * nominal);
  }
  EXPECT_LT(plain.PredictMean({45.0}), 1.05 * 45);
}

}  // namespace
}  // namespace autopar::search
