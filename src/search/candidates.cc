#include "autopar/search/candidates.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <unordered_map>

#include "autopar/search/rng.h"
#include "autopar/spec/units.h"

namespace autopar::search {
namespace {

// The knobs whose levels get an effect: a key that orders the values and the value's text.
struct Knob {
  const char* name;
  int64_t (*key)(const ParallelConfig&);
};
constexpr Knob kKnobs[] = {
    {"tp", [](const ParallelConfig& c) -> int64_t { return c.tp; }},
    {"pp", [](const ParallelConfig& c) -> int64_t { return c.pp; }},
    {"dp", [](const ParallelConfig& c) -> int64_t { return c.dp; }},
    {"cp", [](const ParallelConfig& c) -> int64_t { return c.cp; }},
    {"up", [](const ParallelConfig& c) -> int64_t { return c.up; }},
    {"cp_comm", [](const ParallelConfig& c) -> int64_t { return c.cp_allgather; }},
    {"ep", [](const ParallelConfig& c) -> int64_t { return c.ep; }},
    // The canonical etp (0 = as tp): one level, and no effect, where experts always follow tp.
    {"etp", [](const ParallelConfig& c) -> int64_t { return c.etp; }},
    {"vpp", [](const ParallelConfig& c) -> int64_t { return c.vpp; }},
    {"mbs", [](const ParallelConfig& c) -> int64_t { return c.mbs; }},
    {"sp", [](const ParallelConfig& c) -> int64_t { return c.sp; }},
    {"recompute",
     [](const ParallelConfig& c) -> int64_t {
       return static_cast<int64_t>(c.recompute) * (int64_t{1} << 32) + c.recompute_layers;
     }},
    {"dist_opt", [](const ParallelConfig& c) -> int64_t { return c.dist_opt; }},
    // Pinned by default (SpaceOptions): an effect only when a space holds both values.
    {"overlap_grad_reduce",
     [](const ParallelConfig& c) -> int64_t { return c.overlap_grad_reduce; }},
    {"overlap_param_gather",
     [](const ParallelConfig& c) -> int64_t { return c.overlap_param_gather; }},
    {"grad_reduce_dtype",
     [](const ParallelConfig& c) -> int64_t { return static_cast<int64_t>(c.grad_reduce_dtype); }},
    {"fp8_param_gather", [](const ParallelConfig& c) -> int64_t { return c.fp8_param_gather; }},
};

std::string LevelName(const char* knob, const ParallelConfig& c) {
  const std::string k = knob;
  std::string value;
  if (k == "sp" || k == "dist_opt" || k == "overlap_grad_reduce" || k == "overlap_param_gather" ||
      k == "fp8_param_gather") {
    for (const Knob& q : kKnobs) {
      if (k == q.name) value = q.key(c) != 0 ? "on" : "off";
    }
  } else if (k == "grad_reduce_dtype") {
    value = ToString(c.grad_reduce_dtype);
  } else if (k == "cp_comm") {
    value = c.cp_allgather ? "allgather" : "p2p";
  } else if (k == "etp") {
    value = c.etp == 0 ? "tp" : std::to_string(c.etp);
  } else if (k == "recompute") {
    value = ToString(c.recompute);
    if (c.recompute_layers != 0) value += "/" + std::to_string(c.recompute_layers);
  } else {
    for (const Knob& q : kKnobs) {
      if (k == q.name) value = std::to_string(q.key(c));
    }
  }
  return k + "=" + value;
}

// The cells of a partition of n candidates, numbered from 0 in order of first appearance:
// two partitions are the same exactly when their numberings are equal. `cell(i)` is any key of
// candidate i's cell.
template <typename Cell>
std::vector<uint32_t> FirstAppearance(size_t n, Cell cell) {
  std::unordered_map<uint64_t, uint32_t> number;
  std::vector<uint32_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = number.emplace(cell(i), static_cast<uint32_t>(number.size())).first->second;
  }
  return out;
}

}  // namespace

CandidateSet::CandidateSet(std::vector<ParallelConfig> configs, const CostModel& model,
                           double memory_capacity_gib)
    : configs_(std::move(configs)), capacity_gib_(memory_capacity_gib) {
  const size_t n = configs_.size();
  for (auto& column : columns_) column.resize(n);
  nominal_time_s_.resize(n);
  nominal_memory_gib_.resize(n);
  index_.reserve(n);
  Hasher h;
  for (size_t i = 0; i < n; ++i) {
    const ParallelConfig& c = configs_[i];
    if (c.dp <= 0) throw std::invalid_argument("candidate " + ToSpec(c) + " has no dp");
    const std::string spec = ToSpec(c);
    if (!index_.emplace(spec, static_cast<int64_t>(i)).second) {
      throw std::invalid_argument("candidate " + spec + " appears twice");
    }
    const TimeBreakdown t = model.Time(c);
    for (int k = 0; k < kNumFeatures; ++k) columns_[k][i] = t.features[k];
    nominal_time_s_[i] = t.step_time_s;
    nominal_memory_gib_[i] = model.Memory(c).total() / kGiB;
    h.Add(spec.data(), spec.size());
    for (int k = 0; k < kNumFeatures; ++k) h.Add(t.features[k]);
    h.Add(nominal_memory_gib_[i]);
  }
  h.Add(capacity_gib_);
  fingerprint_ = h.value();

  // Level effects for the knobs that vary: their values in ascending order. A knob whose values
  // partition the candidates as an earlier knob's do (overlap_param_gather where it is on exactly
  // with dist_opt) is that knob's alias: its effect is the earlier knob's, and it gets none.
  std::vector<const Knob*> varying;
  std::vector<std::map<int64_t, int>> levels;  // per varying knob: value key → coefficient
  std::vector<std::vector<uint32_t>> partitions;        // per varying knob
  std::vector<std::pair<const Knob*, size_t>> aliases;  // a knob, and the varying one it aliases
  for (const Knob& q : kKnobs) {
    std::map<int64_t, int> values;
    for (const ParallelConfig& c : configs_) values.emplace(q.key(c), 0);
    if (values.size() < 2) continue;
    std::vector<uint32_t> partition =
        FirstAppearance(n, [&](size_t i) { return static_cast<uint64_t>(q.key(configs_[i])); });
    const auto same = std::find(partitions.begin(), partitions.end(), partition);
    if (same != partitions.end()) {
      aliases.emplace_back(&q, same - partitions.begin());
      continue;
    }
    partitions.push_back(std::move(partition));
    for (auto& [key, coefficient] : values) {
      coefficient = kNumCoefficients + static_cast<int>(level_names_.size());
      const int64_t wanted = key;  // clang before 16 cannot capture a structured binding
      const auto it = std::find_if(configs_.begin(), configs_.end(),
                                   [&](const ParallelConfig& c) { return q.key(c) == wanted; });
      level_names_.push_back(LevelName(q.name, *it));
    }
    varying.push_back(&q);
    levels.push_back(std::move(values));
  }
  if (kNumCoefficients + level_names_.size() > UINT16_MAX) {
    throw std::invalid_argument("candidate set with " + std::to_string(level_names_.size()) +
                                " knob values: too many for the level effects");
  }
  varying_knobs_ = static_cast<int>(levels.size());
  level_coefficient_.reserve(n * levels.size());
  for (size_t i = 0; i < n; ++i) {
    for (int q = 0; q < varying_knobs_; ++q) {
      level_coefficient_.push_back(
          static_cast<uint16_t>(levels[q].at(varying[q]->key(configs_[i]))));
    }
  }
  // An alias's values are named after the knob's: "dist_opt=on | overlap_param_gather=on".
  for (const auto& [alias, q] : aliases) {
    std::vector<bool> named(level_names_.size(), false);
    for (size_t i = 0; i < n; ++i) {
      const int l = levels_of(static_cast<int64_t>(i))[q] - kNumCoefficients;
      if (named[l]) continue;
      named[l] = true;
      level_names_[l] += " | " + LevelName(alias->name, configs_[i]);
    }
  }
  BuildInteractions();
  if (n > 0) {
    std::vector<double> sorted = nominal_time_s_;
    std::nth_element(sorted.begin(), sorted.begin() + n / 2, sorted.end());
    median_time_s_ = sorted[n / 2];
  }
}

void CandidateSet::BuildInteractions() {
  const size_t n = configs_.size();
  // Each pair's cells, numbered from 0 in order of first appearance: two pairs whose cells
  // partition the candidates alike (tp·pp fixing dp on a fixed cluster makes (tp, pp), (tp, dp)
  // and (pp, dp) one partition) number them alike, so an alias is an equal vector.
  std::vector<std::vector<uint32_t>> kept;  // per kept pair, candidate i's cell
  std::vector<std::vector<std::string>> kept_names;
  for (int q = 0; q < varying_knobs_; ++q) {
    for (int r = q + 1; r < varying_knobs_; ++r) {
      std::vector<uint32_t> cells = FirstAppearance(n, [&](size_t i) {
        const uint16_t* l = levels_of(static_cast<int64_t>(i));
        return static_cast<uint64_t>(l[q]) << 32 | l[r];
      });
      std::vector<std::string> names;
      for (size_t i = 0; i < n; ++i) {
        if (cells[i] < names.size()) continue;  // numbered in order of first appearance
        const uint16_t* l = levels_of(static_cast<int64_t>(i));
        names.push_back(level_names_[l[q] - kNumCoefficients] + "*" +
                        level_names_[l[r] - kNumCoefficients]);
      }
      // An alias adds no coefficients: the same effect in two groups would split between them,
      // each half as relevant as the one effect is (TimePosterior::Reprofile). Its cells are
      // named after the first pair's, with this pair's name added.
      const auto same = std::find(kept.begin(), kept.end(), cells);
      if (same != kept.end()) {
        std::vector<std::string>& first_names = kept_names[same - kept.begin()];
        for (size_t m = 0; m < first_names.size(); ++m) first_names[m] += " | " + names[m];
        continue;
      }
      kept.push_back(std::move(cells));
      kept_names.push_back(std::move(names));
    }
  }
  num_pairs_ = static_cast<int>(kept.size());
  interaction_coefficient_.assign(n * num_pairs_, 0);
  uint32_t next = static_cast<uint32_t>(kNumCoefficients + num_levels());
  for (int p = 0; p < num_pairs_; ++p) {
    for (size_t i = 0; i < n; ++i) interaction_coefficient_[i * num_pairs_ + p] = next + kept[p][i];
    next += static_cast<uint32_t>(kept_names[p].size());
    for (std::string& name : kept_names[p]) interaction_names_.push_back(std::move(name));
  }
}

CandidateSet CandidateSet::FromSpace(const SearchSpace& space, const CostModel& model) {
  std::vector<ParallelConfig> configs;
  space.ForEach([&](const ParallelConfig& c) { configs.push_back(c); });
  return CandidateSet(std::move(configs), model, space.cluster().gpu.memory_gib);
}

std::optional<int64_t> CandidateSet::Find(const ParallelConfig& c) const {
  const auto it = index_.find(ToSpec(c));
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

void CandidateSet::Row(int64_t i, double* row) const {
  std::fill(row, row + num_coefficients(), 0.0);
  for (int k = 0; k < kNumFeatures; ++k) row[k] = columns_[k][i];
  row[kIntercept] = 1;
  for (int q = 0; q < varying_knobs_; ++q) row[level_coefficient(i, q)] = nominal_time_s_[i];
  for (int p = 0; p < num_pairs_; ++p) row[interaction_coefficient(i, p)] = nominal_time_s_[i];
}

SparseRow CandidateSet::RelativeRow(int64_t i) const {
  SparseRow row = KnobRow(i, kNumCoefficients);
  const double nominal = nominal_time_s_[i];
  row.dense.resize(kNumCoefficients);
  for (int k = 0; k < kNumFeatures; ++k) row.dense[k] = columns_[k][i] / nominal;
  row.dense[kIntercept] = 1 / nominal;
  return row;
}

SparseRow CandidateSet::KnobRow(int64_t i, uint32_t first) const {
  SparseRow row;
  row.ones.reserve(static_cast<size_t>(varying_knobs_) + static_cast<size_t>(num_pairs_));
  const uint32_t shift = static_cast<uint32_t>(kNumCoefficients) - first;
  for (int q = 0; q < varying_knobs_; ++q) row.ones.push_back(level_coefficient(i, q) - shift);
  for (int p = 0; p < num_pairs_; ++p) row.ones.push_back(interaction_coefficient(i, p) - shift);
  return row;
}

void CandidateSet::Predict(const double* theta, std::vector<double>* out) const {
  const size_t n = configs_.size();
  out->assign(n, 0.0);
  double* t = out->data();
  // The level effects first, as one relative factor per candidate...
  const uint16_t* level = level_coefficient_.data();
  const uint32_t* cell = interaction_coefficient_.data();
  for (size_t i = 0; i < n; ++i, level += varying_knobs_, cell += num_pairs_) {
    double relative = 0;
    for (int q = 0; q < varying_knobs_; ++q) relative += theta[level[q]];
    for (int p = 0; p < num_pairs_; ++p) relative += theta[cell[p]];
    t[i] = theta[kIntercept] + relative * nominal_time_s_[i];
  }
  // ...then the feature columns.
  for (int k = 0; k < kNumFeatures; ++k) {
    const double w = theta[k];
    const double* x = columns_[k].data();
    for (size_t i = 0; i < n; ++i) t[i] += w * x[i];
  }
}

double CandidateSet::PredictOne(int64_t i, const double* theta) const {
  double t = theta[kIntercept];
  for (int k = 0; k < kNumFeatures; ++k) t += theta[k] * columns_[k][i];
  double relative = 0;
  for (int q = 0; q < varying_knobs_; ++q) relative += theta[level_coefficient(i, q)];
  for (int p = 0; p < num_pairs_; ++p) relative += theta[interaction_coefficient(i, p)];
  return t + relative * nominal_time_s_[i];
}

}  // namespace autopar::search
