#include "autopar/search/rng.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace autopar::search {

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

void Hasher::Add(double v) {
  if (std::isnan(v)) v = std::numeric_limits<double>::quiet_NaN();
  if (v == 0) v = 0;  // folds -0.0
  Add(std::bit_cast<uint64_t>(v));
}

void Hasher::Add(const char* bytes, size_t n) {
  Add(static_cast<uint64_t>(n));
  for (size_t i = 0; i < n; i += 8) {
    uint64_t word = 0;
    std::memcpy(&word, bytes + i, std::min<size_t>(8, n - i));
    Add(word);
  }
}

Rng::Rng(uint64_t seed, int64_t index, Purpose purpose) {
  Hasher h;
  h.Add(seed);
  h.Add(static_cast<uint64_t>(index));
  h.Add(static_cast<uint64_t>(purpose));
  engine_.seed(h.value());
}

double Rng::Uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

uint64_t Rng::Below(uint64_t n) {
  // Rejection of the top partial range (Lemire's threshold form without the multiply trick).
  const uint64_t limit =
      std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % n;
  uint64_t x;
  do {
    x = engine_();
  } while (x >= limit);
  return x % n;
}

double Rng::Normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u, v, s;
  do {
    u = 2 * Uniform() - 1;
    v = 2 * Uniform() - 1;
    s = u * u + v * v;
  } while (s >= 1 || s == 0);
  const double f = std::sqrt(-2 * std::log(s) / s);
  spare_ = v * f;
  has_spare_ = true;
  return u * f;
}

double Rng::Gamma(double shape) {
  if (shape < 1) {
    // Gamma(a) = Gamma(a + 1) · U^(1/a).
    const double u = Uniform();
    return Gamma(shape + 1) * std::pow(u > 0 ? u : 0x1.0p-53, 1 / shape);
  }
  const double d = shape - 1.0 / 3;
  const double c = 1 / std::sqrt(9 * d);
  for (;;) {
    double x, v;
    do {
      x = Normal();
      v = 1 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = Uniform();
    if (u < 1 - 0.0331 * x * x * x * x) return d * v;
    if (u > 0 && std::log(u) < 0.5 * x * x + d * (1 - v + std::log(v))) return d * v;
  }
}

}  // namespace autopar::search
