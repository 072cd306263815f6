#include "autopar/search/state.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>

#include "autopar/search/stop.h"

namespace autopar::search {
namespace {

constexpr const char* kOutcomeNames[] = {"ok",           "oom",       "timeout",     "comm_error",
                                         "device_error", "nonfinite", "worker_lost", "invalid"};

// Layers per stage that keep only their input under full recompute (0 means every layer).
int64_t RecomputedLayers(const ParallelConfig& c) {
  return c.recompute_layers == 0 ? INT64_MAX : c.recompute_layers;
}

// Whether recompute setting `a` stores at least the activations `b` stores, everything else
// equal: none ≥ selective ≥ full over every layer, and full over fewer layers ≥ full over more.
// Selective against partial full recompute depends on the layer shapes: not comparable.
bool RecomputeKeepsAtLeast(const ParallelConfig& a, const ParallelConfig& b) {
  switch (a.recompute) {
    case Recompute::kNone:
      return true;
    case Recompute::kSelective:
      // Selective keeps what it does not recompute: at least b's when it recomputes no module
      // b keeps.
      return (b.recompute == Recompute::kSelective &&
              (a.selective_modules() & ~b.selective_modules()) == 0) ||
             (b.recompute == Recompute::kFull && b.recompute_layers == 0);
    case Recompute::kFull:
      return b.recompute == Recompute::kFull && RecomputedLayers(a) <= RecomputedLayers(b);
  }
  return false;
}

}  // namespace

const char* ToString(Outcome o) { return kOutcomeNames[static_cast<int>(o)]; }

std::optional<Outcome> ParseOutcome(const std::string& text) {
  for (int i = 0; i < static_cast<int>(std::size(kOutcomeNames)); ++i) {
    if (text == kOutcomeNames[i]) return static_cast<Outcome>(i);
  }
  return std::nullopt;
}

SearchSettings SearchSettings::Default(const CandidateSet& candidates) {
  SearchSettings s;
  s.time_prior = TimePrior::Default(candidates.median_nominal_time_s());
  // The unknown runtime overhead is a few percent of the device, not a fixed 2 GiB: a 4 GiB
  // CPU-backend budget would otherwise look too uncertain to ever fit.
  s.memory_prior.offset_sd_gib =
      std::min(s.memory_prior.offset_sd_gib, 0.025 * candidates.capacity_gib());
  return s;
}

bool SearchState::IsCheckTrial(int64_t trial) const {
  if (next_check_ < 0 || trial < settings_.check_from) return false;
  if (trial < trials()) return std::binary_search(past_checks_.begin(), past_checks_.end(), trial);
  if (trial < next_check_) return false;
  return (trial - next_check_) % CheckGap() == 0;
}

bool SearchState::ChecksAgree() const {
  // The stop rule's calibration scale of the last checks is 1 (their mean square at most 1; any
  // pseudo-errors give the same test).
  const auto window = static_cast<int>(settings_.check_agree_window);
  return std::min(check_errors_.size(), static_cast<size_t>(window)) >= 2 &&
         CalibrationScale(check_errors_, window, 1.0) <= 1;
}

int64_t SearchState::CheckGap() const {
  return settings_.check_every_agreeing > 0 && ChecksAgree() ? settings_.check_every_agreeing
                                                             : settings_.check_every;
}

bool NeedsAtLeastAsMuchMemory(const ParallelConfig& a, const ParallelConfig& b) {
  // The layout decides how weights and activations are split: only compare within one layout.
  if (a.tp != b.tp || a.pp != b.pp || a.dp != b.dp || a.cp != b.cp || a.up != b.up ||
      a.ep != b.ep || a.etp != b.etp || a.vpp != b.vpp || a.flex_dispatcher != b.flex_dispatcher ||
      a.cp_allgather != b.cp_allgather) {
    return false;
  }
  // So does the stage split: an uneven one moves layers (and the embedding or loss) between the
  // stages, the peak with them.
  if (a.pp_first != b.pp_first || a.pp_last != b.pp_last ||
      a.split_embedding != b.split_embedding || a.split_loss != b.split_loss) {
    return false;
  }
  if (a.mbs < b.mbs) return false;
  if (a.sp && !b.sp) return false;              // SP shards activations: on needs less
  if (a.dist_opt && !b.dist_opt) return false;  // so does the distributed optimizer's state
  // 16-bit gradient buffers and FP8 parameters (no 16-bit copy) need less.
  if (a.grad_reduce_dtype == GradReduceDtype::kBF16 &&
      b.grad_reduce_dtype == GradReduceDtype::kFP32) {
    return false;
  }
  if (a.fp8_param_gather && !b.fp8_param_gather) return false;
  return RecomputeKeepsAtLeast(a, b);
}

SearchState::SearchState(const CandidateSet& candidates, SearchSettings settings)
    : candidates_(candidates),
      settings_(std::move(settings)),
      time_(settings_.time_prior, candidates),
      memory_(settings_.memory_prior, candidates.num_levels(), candidates.varying_knobs()) {
  if (!(settings_.max_p_oom > 0 && settings_.max_p_oom < 1)) {
    throw std::invalid_argument("max_p_oom must be in (0, 1)");
  }
  if (settings_.max_failures < 1) throw std::invalid_argument("max_failures must be >= 1");
  if (settings_.max_measurements < 1 || settings_.max_measurements > 255) {
    throw std::invalid_argument("max_measurements must be in [1, 255]");
  }
  if (!(settings_.noise_prior_sd > 0 && settings_.noise_prior_dof > 0 &&
        settings_.contender_margin >= 0 && settings_.resolution >= 0)) {
    throw std::invalid_argument(
        "noise prior sd and dof must be > 0, contender margin and resolution >= 0");
  }
  if (settings_.check_every < 0 || settings_.check_from < 0 || !(settings_.check_temper >= 1) ||
      settings_.check_every_agreeing < 0 || settings_.check_agree_window < 1) {
    throw std::invalid_argument(
        "check_every, check_every_agreeing and check_from must be >= 0, check_agree_window >= 1, "
        "check_temper >= 1");
  }
  if (!(settings_.top_two_beta >= 0 && settings_.top_two_beta <= 1) ||
      settings_.top_two_redraws < 0) {
    throw std::invalid_argument("top_two_beta must be in [0, 1], top_two_redraws >= 0");
  }
  if (settings_.check_every > 0) next_check_ = settings_.check_from + settings_.check_every - 1;
  const size_t n = static_cast<size_t>(candidates_.size());
  flags_.assign(n, 0);
  eligible_.assign(n, 0);
  failures_.assign(n, 0);
  measured_time_s_.assign(n, std::numeric_limits<double>::quiet_NaN());
  measurements_.assign(n, 0);
  log_sum_.assign(n, 0.0);
  RefreshMemoryFit();
}

double SearchState::best_time_s() const {
  return best_ < 0 ? std::numeric_limits<double>::infinity() : Estimated(best_).mean_s;
}

bool SearchState::repeatable(int64_t i) const {
  return measured(i) && !retired(i) && measurements_[i] < settings_.max_measurements;
}

bool SearchState::worth_repeating(int64_t i) const {
  // Before any repeat the noise is the prior's guess: the searcher's first repeats tell it.
  return repeatable(i) && repeats_ > 0 &&
         measurement_noise_sd() / std::sqrt(static_cast<double>(measurements_[i])) >
             settings_.resolution;
}

double SearchState::measurement_noise_sd() const {
  const double s0 = settings_.noise_prior_sd, nu0 = settings_.noise_prior_dof;
  return std::sqrt((nu0 * s0 * s0 + noise_ss_) / (nu0 + static_cast<double>(repeats_)));
}

SearchState::Estimate SearchState::Estimated(int64_t i) const {
  const double y = measured_time_s_[i];
  if (!measured(i)) return {std::numeric_limits<double>::quiet_NaN(), 0};
  if (!settings_.learn_time) return {y, 0};
  // In the posterior's relative units z = y/ŷ: the measured mean, variance σ_m²·z²/k...
  const double nominal = candidates_.nominal_time_s(i);
  const double z = y / nominal;
  const double noise = measurement_noise_sd() * z;
  const double measured_var = noise * noise / measurements_[i];
  // ...and the model's prediction, its variance widened by the residual variance σ_m leaves
  // unexplained (a deviation of this configuration that the model cannot see).
  const TimePosterior::Relative model = time_.Predict(candidates_, i, /*with_noise=*/false);
  const double residual = time_.noise_sd() * time_.noise_sd();
  const double model_var = model.variance + std::max(residual - noise * noise, 0.0);
  if (!(model_var > 0)) return {time_.PredictMean(candidates_, i), 0};
  const double var = 1 / (1 / measured_var + 1 / model_var);
  const double mean = var * (z / measured_var + model.mean / model_var);
  return {mean * nominal, std::sqrt(var) * nominal};
}

void SearchState::RefreshBest() {
  const int64_t before = best_;
  contenders_.clear();
  best_ = -1;
  double lowest = std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < candidates_.size(); ++i) {
    if (measured(i)) lowest = std::min(lowest, measured_time_s_[i]);
  }
  if (!std::isfinite(lowest)) return;
  const double bound = lowest * (1 + settings_.contender_margin + 4 * measurement_noise_sd());
  std::vector<std::pair<double, int64_t>> ranked;
  for (int64_t i = 0; i < candidates_.size(); ++i) {
    if (measured(i) && measured_time_s_[i] <= bound) ranked.push_back({Estimated(i).mean_s, i});
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [estimate, i] : ranked) contenders_.push_back(i);
  best_ = contenders_.front();
  if (best_ != before) best_since_ = measured_count_;
}

MemoryRow SearchState::memory_row(int64_t i) const {
  return {candidates_.nominal_memory_gib(i), candidates_.levels_of(i), candidates_.varying_knobs()};
}

double SearchState::POom(int64_t i) const {
  return memory_.POom(memory_row(i), candidates_.capacity_gib());
}

void SearchState::RefreshEligible(int64_t i) {
  const bool now = flags_[i] == 0;
  if (now != (eligible_[i] != 0)) eligible_count_ += now ? 1 : -1;
  eligible_[i] = now ? 1 : 0;
}

void SearchState::RefreshMemoryFit() {
  const double q = memory_.FitQuantile(settings_.max_p_oom);
  const double capacity = candidates_.capacity_gib();
  for (int64_t i = 0; i < candidates_.size(); ++i) {
    // The headroom's sign decides alone when it agrees with the quantile's (always at
    // max_p_oom = 0.5, where q = 0): the predictive scale costs a triangular solve.
    const MemoryRow row = memory_row(i);
    const double headroom = memory_.Headroom(row, capacity);
    const bool fits = (q >= 0 && headroom <= 0)  ? false
                      : (q <= 0 && headroom > 0) ? true
                                                 : memory_.Margin(row, capacity) > q;
    flags_[i] = static_cast<uint8_t>(fits ? flags_[i] & ~kUnlikelyFit : flags_[i] | kUnlikelyFit);
    RefreshEligible(i);
  }
}

void SearchState::Observe(const Observation& o) {
  if (o.candidate < 0 || o.candidate >= candidates_.size()) {
    throw std::invalid_argument("observation of candidate " + std::to_string(o.candidate) +
                                " outside the candidate set of " +
                                std::to_string(candidates_.size()));
  }
  const int64_t i = o.candidate;
  const bool has_peak = !std::isnan(o.peak_memory_gib);
  if (has_peak && !(std::isfinite(o.peak_memory_gib) && o.peak_memory_gib > 0)) {
    throw std::invalid_argument("non-finite or non-positive peak memory " +
                                std::to_string(o.peak_memory_gib) + " for " +
                                ToSpec(candidates_.config(i)));
  }
  bool memory_changed = false;
  switch (o.outcome) {
    case Outcome::kOk:
      if (!(std::isfinite(o.step_time_s) && o.step_time_s > 0)) {
        throw std::invalid_argument("ok observation of " + ToSpec(candidates_.config(i)) +
                                    " with step time " + std::to_string(o.step_time_s) +
                                    " (report it as nonfinite)");
      }
      if (measured(i) && !repeatable(i)) {
        throw std::invalid_argument(ToSpec(candidates_.config(i)) + " was already measured " +
                                    std::to_string(measurements_[i]) + " times");
      }
      // The time posterior learns a configuration once, from its first measurement: its rows
      // are configurations, and a repeat fed as another row would count the same deviation from
      // the model twice and shrink the residual it has to explain (the repeats tell the noise
      // instead, below, and Estimated() combines the two).
      if (settings_.learn_time && measurements_[i] == 0) {
        time_errors_.push_back(time_.Observe(candidates_, i, o.step_time_s));
        if (IsCheckTrial(trials())) check_errors_.push_back(time_errors_.back());
      }
      {
        const double x = std::log(o.step_time_s);
        const double k = measurements_[i];
        if (k > 0) {  // Welford: the within-configuration sum of squares grows by this much
          const double d = x - log_sum_[i] / k;
          noise_ss_ += d * d * k / (k + 1);
          ++repeats_;
          measured_time_s_[i] = (measured_time_s_[i] * k + o.step_time_s) / (k + 1);
        } else {
          measured_time_s_[i] = o.step_time_s;
          ++measured_count_;
        }
        log_sum_[i] += x;
        ++measurements_[i];
      }
      flags_[i] |= kMeasured;
      break;
    case Outcome::kOom:
      memory_changed = memory_.ObserveOom(memory_row(i), candidates_.capacity_gib());
      flags_[i] |= kRetired;
      for (int64_t j = 0; j < candidates_.size(); ++j) {
        // Only where the model also puts j's tensors clearly above i's: where it cannot tell
        // them apart (selective recompute against none under flash attention store the same
        // tensors), which peak is higher is the allocator's doing, not the layout's.
        if (j != i &&
            candidates_.nominal_memory_gib(j) >=
                candidates_.nominal_memory_gib(i) * (1 + settings_.memory_prior.noise_sd) &&
            NeedsAtLeastAsMuchMemory(candidates_.config(j), candidates_.config(i))) {
          flags_[j] |= kPruned;
          RefreshEligible(j);
        }
      }
      break;
    default:
      if (failures_[i] < 255) ++failures_[i];
      if (failures_[i] >= settings_.max_failures) flags_[i] |= kRetired;
      break;
  }
  // A peak is a measurement of the memory model whatever the time outcome (not for an OOM,
  // whose reported figure is what it tried to allocate, not what it held).
  if (has_peak && o.outcome != Outcome::kOom) {
    memory_.ObservePeak(memory_row(i), o.peak_memory_gib);
    memory_changed = true;
  }
  RefreshEligible(i);
  if (memory_changed) RefreshMemoryFit();
  if (o.outcome == Outcome::kOk) RefreshBest();
  if (trials() == next_check_) {
    past_checks_.push_back(next_check_);
    next_check_ += CheckGap();
  }
  history_.push_back(o);
}

uint64_t SearchState::Digest() const {
  Hasher h;
  time_.AddToDigest(&h);
  memory_.regression().AddToDigest(&h);
  h.Add(static_cast<uint64_t>(history_.size()));
  h.Add(static_cast<uint64_t>(eligible_count_));
  h.Add(static_cast<uint64_t>(best_));
  h.Add(reinterpret_cast<const char*>(flags_.data()), flags_.size());
  h.Add(reinterpret_cast<const char*>(failures_.data()), failures_.size());
  h.Add(reinterpret_cast<const char*>(measurements_.data()), measurements_.size());
  return h.value();
}

}  // namespace autopar::search
