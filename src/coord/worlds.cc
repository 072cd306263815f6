// The synthetic truths of benchmark tables: the scaled truth (replay.h) and the worlds built on it
// (worlds.h).
#include "autopar/coord/worlds.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>

#include "autopar/search/posterior.h"
#include "autopar/search/rng.h"
#include "autopar/space/config.h"

namespace autopar::coord {
namespace {

using search::CandidateSet;
using search::Rng;

// The scaled truth's draws, from MakeSyntheticTable's stream in its order (every variate of every
// row, so a row's values do not depend on other rows' fates).
struct ScaledDraws {
  std::vector<double> theta;  // CandidateSet::num_coefficients(): features, then zeros
  double memory_scale = 1;
  std::vector<double> time_noise, memory_noise;
  std::vector<bool> surprise;
};

ScaledDraws DrawScaled(const CandidateSet& candidates, const SyntheticTruth& t) {
  Rng rng(t.seed, 0, search::Purpose::kSynthetic);
  ScaledDraws d;
  // The truth has no level effects: every component scaled by its own factor.
  d.theta.assign(static_cast<size_t>(candidates.num_coefficients()), 0.0);
  for (int k = 0; k < kNumFeatures; ++k) {
    d.theta[k] = search::IsCommunication(k)
                     ? t.comm_low * std::exp(rng.Uniform() * std::log(t.comm_high / t.comm_low))
                     : t.compute_low + rng.Uniform() * (t.compute_high - t.compute_low);
  }
  d.memory_scale = t.memory_scale_low + rng.Uniform() * (t.memory_scale_high - t.memory_scale_low);
  // A row's own draws are keyed by its configuration, not its position: the tables of two
  // candidate sets (a space that grew, another enumeration order) draw the same numbers for the
  // configurations they share, so a change of the space leaves the shared rows as they were.
  for (const ParallelConfig& c : candidates.configs()) {
    search::Hasher h;
    const std::string spec = ToSpec(c);
    h.Add(spec.data(), spec.size());
    Rng row(t.seed, static_cast<int64_t>(h.value()), search::Purpose::kSynthetic);
    d.time_noise.push_back(std::exp(t.noise * row.Normal()));
    d.memory_noise.push_back(std::exp(t.memory_noise * row.Normal()));
    d.surprise.push_back(row.Uniform() < t.surprise_oom);
  }
  return d;
}

// The streams of the worlds' components (index 0 is the scaled truth's).
enum Component : int64_t { kInteractions = 1, kKernel, kMemory, kNoisy, kNearMemory };

Rng ComponentRng(uint64_t seed, Component c) { return Rng(seed, c, search::Purpose::kSynthetic); }

// A generator keyed by a cell of knob values: the cell draws the same numbers in every table of
// the seed, whatever other cells the candidate set has.
Rng CellRng(uint64_t seed, Component c, std::initializer_list<int64_t> cell) {
  search::Hasher h;
  h.Add(static_cast<uint64_t>(c));
  for (const int64_t v : cell) h.Add(static_cast<uint64_t>(v));
  return Rng(seed, static_cast<int64_t>(h.value()), search::Purpose::kSynthetic);
}

double UniformIn(Rng& rng, double lo, double hi) { return lo + rng.Uniform() * (hi - lo); }
double LogUniformIn(Rng& rng, double lo, double hi) {
  return lo * std::exp(rng.Uniform() * std::log(hi / lo));
}

double Median(std::vector<double> v) {
  if (v.empty()) return 1;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

std::vector<int32_t> DistinctValues(const CandidateSet& candidates, int32_t ParallelConfig::*knob) {
  std::vector<int32_t> v;
  for (const ParallelConfig& c : candidates.configs()) v.push_back(c.*knob);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

std::string Format(const char* format, double a, double b = 0, double c = 0, double d = 0) {
  char buf[160];
  std::snprintf(buf, sizeof buf, format, a, b, c, d);
  return buf;
}

// ---- interactions: a lognormal factor per pair of values of four pairs of knobs ----
class Interactions {
 public:
  explicit Interactions(uint64_t seed) : seed_(seed) {
    Rng rng = ComponentRng(seed, kInteractions);
    for (double& sd : sd_) sd = UniformIn(rng, 0.05, 0.10);
  }
  double Factor(const ParallelConfig& c) const {
    const int64_t recompute = static_cast<int64_t>(c.recompute) * 1000 + c.recompute_layers;
    const int64_t pairs[kPairs][2] = {
        {c.tp, c.pp}, {c.mbs, recompute}, {c.tp, c.mbs}, {c.pp, c.vpp}};
    double log_factor = 0;
    for (int p = 0; p < kPairs; ++p) {
      log_factor += sd_[p] * Cell(p, pairs[p][0], pairs[p][1]);
    }
    return std::exp(log_factor);
  }
  std::string Summary() const {
    return Format("interactions sd tp*pp %.3f, mbs*recompute %.3f, tp*mbs %.3f, pp*vpp %.3f",
                  sd_[0], sd_[1], sd_[2], sd_[3]);
  }

 private:
  static constexpr int kPairs = 4;
  double Cell(int pair, int64_t a, int64_t b) const {
    const auto key = std::make_tuple(pair, a, b);
    const auto it = cells_.find(key);
    if (it != cells_.end()) return it->second;
    Rng rng = CellRng(seed_, kInteractions, {pair, a, b});
    return cells_[key] = rng.Normal();
  }
  uint64_t seed_;
  double sd_[kPairs] = {};
  mutable std::map<std::tuple<int, int64_t, int64_t>, double> cells_;
};

// ---- kernel: shape-dependent GEMM and attention efficiency, and one bad shape ----
class Kernel {
 public:
  Kernel(uint64_t seed, const CandidateSet& candidates, const WorldShape& shape) : shape_(shape) {
    if (shape.hidden_size <= 0 || shape.seq_length <= 0) {
      throw std::invalid_argument("the kernel world needs the hidden size and sequence length");
    }
    Rng rng = ComponentRng(seed, kKernel);
    m0_ = LogUniformIn(rng, 512, 4096);
    n0_ = LogUniformIn(rng, 256, 2048);
    p_ = UniformIn(rng, 0.5, 1.0);
    q_ = UniformIn(rng, 0.5, 1.0);
    s0_ = LogUniformIn(rng, 256, 2048);
    const double knob_draw = rng.Uniform(), value_draw = rng.Uniform();
    bad_factor_ = UniformIn(rng, 1.15, 1.30);
    // The bad shape is a value of tp or mbs, of a knob that varies over the set.
    const std::vector<int32_t> tp = DistinctValues(candidates, &ParallelConfig::tp);
    const std::vector<int32_t> mbs = DistinctValues(candidates, &ParallelConfig::mbs);
    bad_is_tp_ = mbs.size() < 2 || (tp.size() >= 2 && knob_draw < 0.5);
    const std::vector<int32_t>& values = bad_is_tp_ ? tp : mbs;
    bad_value_ = values.size() < 2 ? -1 : values[static_cast<size_t>(value_draw * values.size())];
    // Normalised so the typical configuration keeps its compute time.
    std::vector<double> gemm, attention;
    for (const ParallelConfig& c : candidates.configs()) {
      gemm.push_back(GemmRaw(c));
      attention.push_back(AttentionRaw(c));
    }
    gemm_norm_ = Median(gemm);
    attention_norm_ = Median(attention);
  }
  // Multipliers of the GEMM and attention features (time ÷ efficiency).
  double Gemm(const ParallelConfig& c) const { return GemmRaw(c) / gemm_norm_ * Bad(c); }
  double Attention(const ParallelConfig& c) const {
    return AttentionRaw(c) / attention_norm_ * Bad(c);
  }
  std::string Summary() const {
    std::string s =
        Format("kernel M0 %.0f N0 %.0f p %.2f q %.2f", m0_, n0_, p_, q_) + Format(" S0 %.0f", s0_);
    if (bad_value_ > 0) {
      s += std::string(", bad shape ") + (bad_is_tp_ ? "tp=" : "mbs=") +
           std::to_string(bad_value_) + Format(" x%.3f", bad_factor_);
    }
    return s;
  }

 private:
  // 1/e(M, N): tokens per GEMM M = mbs·seq/(cp·up), sharded width N = hidden/tp.
  double GemmRaw(const ParallelConfig& c) const {
    const double m = static_cast<double>(c.mbs) * shape_.seq_length / (c.cp * c.up);
    const double n = static_cast<double>(shape_.hidden_size) / c.tp;
    return (1 + std::pow(m0_ / m, p_)) * (1 + std::pow(n0_ / n, q_));
  }
  double AttentionRaw(const ParallelConfig& c) const {
    return 1 + std::pow(s0_ * c.cp / static_cast<double>(shape_.seq_length), p_);
  }
  double Bad(const ParallelConfig& c) const {
    return (bad_is_tp_ ? c.tp : c.mbs) == bad_value_ ? bad_factor_ : 1.0;
  }
  WorldShape shape_;
  double m0_ = 0, n0_ = 0, p_ = 0, q_ = 0, s0_ = 0;
  bool bad_is_tp_ = true;
  int32_t bad_value_ = -1;
  double bad_factor_ = 1;
  double gemm_norm_ = 1, attention_norm_ = 1;
};

// ---- memory: the model's peak scaled up, plus a per-tp term it lacks ----
class MemoryOverhead {
 public:
  explicit MemoryOverhead(uint64_t seed) : seed_(seed) {
    Rng rng = ComponentRng(seed, kMemory);
    scale_ = UniformIn(rng, 1.05, 1.15);
  }
  double scale() const { return scale_; }
  double PerTpGib(int32_t tp) const {
    Rng rng = CellRng(seed_, kMemory, {tp});
    return UniformIn(rng, 0.5, 1.5) * (1 + std::log2(static_cast<double>(tp)));
  }
  std::string Summary(const CandidateSet& candidates) const {
    std::string s = Format("memory x%.3f + per-tp GiB", scale_);
    for (const int32_t tp : DistinctValues(candidates, &ParallelConfig::tp)) {
      s += " tp" + std::to_string(tp) + Format(":%.2f", PerTpGib(tp));
    }
    return s;
  }

 private:
  uint64_t seed_;
  double scale_ = 1;
};

// ---- near_memory: memory-hungry configurations are faster; the best fit sits near the limit ----
struct NearMemory {
  explicit NearMemory(uint64_t seed) {
    Rng rng = ComponentRng(seed, kNearMemory);
    bonus = UniformIn(rng, 0.10, 0.25);
    fraction = UniformIn(rng, 0.90, 0.99);
  }
  double TimeFactor(double nominal_gib, double capacity_gib) const {
    return 1 - bonus * std::min(nominal_gib / capacity_gib, 1.25);
  }
  // The memory scale s that puts the fastest row that fits at `fraction` of the capacity: walking
  // the rows from the fastest, row j can be that one when every faster row still OOMs at
  // s_j = fraction·capacity/peak_j (their smallest peak exceeds peak_j/fraction). Of those rows the
  // fastest whose s_j is within [1, 1.3] wins (memory scaled up; the fastest at all when none is).
  double Scale(const std::vector<double>& time_s, const std::vector<double>& peak_gib,
               const std::vector<bool>& surprise, double capacity_gib) const {
    std::vector<size_t> order(time_s.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return time_s[a] < time_s[b]; });
    double smallest_faster = INFINITY;
    double fallback = NAN;
    for (const size_t j : order) {
      if (surprise[j]) continue;  // out of memory at any scale
      if (smallest_faster > peak_gib[j] / fraction) {
        const double s = fraction * capacity_gib / peak_gib[j];
        if (s >= 1.0 && s <= 1.3) return s;
        if (std::isnan(fallback)) fallback = s;
      }
      smallest_faster = std::min(smallest_faster, peak_gib[j]);
    }
    return std::isnan(fallback) ? 1.0 : fallback;
  }
  double bonus = 0, fraction = 0;
};

}  // namespace

ReplayTable MakeSyntheticTable(const search::CandidateSet& candidates, const SyntheticTruth& t) {
  const ScaledDraws d = DrawScaled(candidates, t);
  std::vector<ReplayRow> rows;
  rows.reserve(static_cast<size_t>(candidates.size()));
  for (int64_t i = 0; i < candidates.size(); ++i) {
    ReplayRow row;
    row.config = candidates.config(i);
    row.line = i + 2;
    row.peak_memory_gib = d.memory_scale * candidates.nominal_memory_gib(i) * d.memory_noise[i];
    if (row.peak_memory_gib > candidates.capacity_gib() || d.surprise[i]) {
      row.status = search::Outcome::kOom;
    } else {
      row.status = search::Outcome::kOk;
      row.step_time_s = candidates.PredictOne(i, d.theta.data()) * d.time_noise[i];
    }
    rows.push_back(row);
  }
  return ReplayTable(std::move(rows));
}

const char* ToString(WorldFamily family) {
  switch (family) {
    case WorldFamily::kScaled:
      return "scaled";
    case WorldFamily::kInteractions:
      return "interactions";
    case WorldFamily::kKernel:
      return "kernel";
    case WorldFamily::kMemory:
      return "memory";
    case WorldFamily::kNoisy:
      return "noisy";
    case WorldFamily::kNearMemory:
      return "near_memory";
    case WorldFamily::kMixed:
      return "mixed";
  }
  return "?";
}

std::optional<WorldFamily> ParseWorldFamily(const std::string& text) {
  for (const WorldFamily f :
       {WorldFamily::kScaled, WorldFamily::kInteractions, WorldFamily::kKernel,
        WorldFamily::kMemory, WorldFamily::kNoisy, WorldFamily::kNearMemory, WorldFamily::kMixed}) {
    if (text == ToString(f)) return f;
  }
  return std::nullopt;
}

const char* WorldFamilyNames() {
  return "scaled, interactions, kernel, memory, noisy, near_memory, mixed";
}

WorldShape WorldShape::Of(const ModelSpec& model, const TrainSpec& train) {
  return {model.hidden_size, train.seq_length};
}

ReplayTable MakeWorldTable(const search::CandidateSet& candidates, const WorldShape& shape,
                           WorldFamily family, const SyntheticTruth& truth, std::string* summary) {
  if (family == WorldFamily::kScaled) {
    if (summary) *summary = "scaled";
    return MakeSyntheticTable(candidates, truth);
  }
  const bool mixed = family == WorldFamily::kMixed;
  std::optional<Interactions> interactions;
  std::optional<Kernel> kernel;
  std::optional<MemoryOverhead> memory;
  std::optional<double> noise_sd;
  std::optional<NearMemory> near_memory;
  if (mixed || family == WorldFamily::kInteractions) interactions.emplace(truth.seed);
  if (mixed || family == WorldFamily::kKernel) kernel.emplace(truth.seed, candidates, shape);
  if (mixed || family == WorldFamily::kMemory) memory.emplace(truth.seed);
  if (mixed || family == WorldFamily::kNoisy) {
    Rng rng = ComponentRng(truth.seed, kNoisy);
    noise_sd = UniformIn(rng, 0.02, 0.05);
  }
  if (family == WorldFamily::kNearMemory) near_memory.emplace(truth.seed);

  const ScaledDraws d = DrawScaled(candidates, truth);
  const double capacity = candidates.capacity_gib();
  const size_t n = static_cast<size_t>(candidates.size());
  std::vector<double> time_s(n), peak_gib(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t c = static_cast<int64_t>(i);
    const ParallelConfig& config = candidates.config(c);
    double t = 0;
    for (int k = 0; k < kNumFeatures; ++k) {
      double efficiency = 1;
      if (kernel && k == kGemm) efficiency = kernel->Gemm(config);
      if (kernel && k == kAttention) efficiency = kernel->Attention(config);
      t += d.theta[k] * efficiency * candidates.feature(c, k);
    }
    if (interactions) t *= interactions->Factor(config);
    const double nominal_gib = candidates.nominal_memory_gib(c);
    if (near_memory) t *= near_memory->TimeFactor(nominal_gib, capacity);
    time_s[i] = t * d.time_noise[i];
    if (memory) {
      peak_gib[i] = memory->scale() * nominal_gib * d.memory_noise[i] + memory->PerTpGib(config.tp);
    } else if (near_memory) {
      peak_gib[i] = nominal_gib * d.memory_noise[i];  // scaled below
    } else {
      peak_gib[i] = d.memory_scale * nominal_gib * d.memory_noise[i];
    }
  }
  double near_scale = 1;
  if (near_memory) {
    near_scale = near_memory->Scale(time_s, peak_gib, d.surprise, capacity);
    for (double& p : peak_gib) p *= near_scale;
  }

  std::vector<ReplayRow> rows;
  rows.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    ReplayRow row;
    row.config = candidates.config(static_cast<int64_t>(i));
    row.line = static_cast<int64_t>(i) + 2;
    row.peak_memory_gib = peak_gib[i];
    if (peak_gib[i] > capacity || d.surprise[i]) {
      row.status = search::Outcome::kOom;
    } else {
      row.status = search::Outcome::kOk;
      row.step_time_s = time_s[i];
      row.noise_sd = noise_sd.value_or(0);
    }
    rows.push_back(row);
  }
  if (summary) {
    std::vector<std::string> parts;
    if (interactions) parts.push_back(interactions->Summary());
    if (kernel) parts.push_back(kernel->Summary());
    if (memory) parts.push_back(memory->Summary(candidates));
    if (noise_sd) parts.push_back(Format("measurement noise sd %.3f", *noise_sd));
    if (near_memory) {
      parts.push_back(Format("near_memory bonus %.3f, best at %.1f%% of capacity (memory x%.3f)",
                             near_memory->bonus, 100 * near_memory->fraction, near_scale));
    }
    *summary = std::string(ToString(family)) + ": ";
    for (size_t p = 0; p < parts.size(); ++p) *summary += (p ? "; " : "") + parts[p];
  }
  return ReplayTable(std::move(rows));
}

}  // namespace autopar::coord
