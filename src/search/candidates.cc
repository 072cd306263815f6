#include "autopar/search/candidates.h"

#include <algorithm>
#include <stdexcept>

#include "autopar/search/rng.h"

namespace autopar::search {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

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
  if (n > 0) {
    std::vector<double> sorted = nominal_time_s_;
    std::nth_element(sorted.begin(), sorted.begin() + n / 2, sorted.end());
    median_time_s_ = sorted[n / 2];
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

void CandidateSet::Predict(const double* theta, std::vector<double>* out) const {
  const size_t n = configs_.size();
  out->assign(n, theta[kIntercept]);
  double* t = out->data();
  for (int k = 0; k < kNumFeatures; ++k) {
    const double w = theta[k];
    const double* x = columns_[k].data();
    for (size_t i = 0; i < n; ++i) t[i] += w * x[i];
  }
}

double CandidateSet::PredictOne(int64_t i, const double* theta) const {
  double t = theta[kIntercept];
  for (int k = 0; k < kNumFeatures; ++k) t += theta[k] * columns_[k][i];
  return t;
}

}  // namespace autopar::search
