#include "autopar/coord/tuner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "autopar/coord/convert.h"
#include "autopar/coord/files.h"

namespace autopar::coord {
namespace {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string HostName() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string("?");
}

int FeatureIndex(const std::string& name) {
  for (int k = 0; k < kNumFeatures; ++k) {
    if (name == FeatureName(k)) return k;
  }
  return -1;
}

// A result that claims ok without a usable step time (non-finite, not positive, or past the
// bounds of backend.h) is a nonfinite trial, never fed to the posterior; a peak that is not a
// finite number within the bounds is no peak (0, also not fed). The state rejects such values
// loudly, so they are mapped here, where the message can say which trial produced them.
void Sanitize(pb::TrialResult* r) {
  if (r->status() == pb::STATUS_UNSPECIFIED) {
    r->set_status(pb::INVALID);
    r->set_message("the backend returned no status; " + r->message());
  }
  const double t = r->step_time_s(), peak = r->peak_memory_gib();
  if (r->status() == pb::OK && !(t >= kMinStepTimeS && t <= kMaxStepTimeS)) {
    char what[160];
    if (std::isfinite(t)) {
      std::snprintf(what, sizeof what, "step time %g s is not a measurement (%g to %g s)", t,
                    kMinStepTimeS, kMaxStepTimeS);
    } else {
      std::snprintf(what, sizeof what, "step time is not a finite number");
    }
    r->set_message(what);
    r->set_status(pb::NONFINITE);
  }
  if (!(peak >= kMinPeakMemoryGib && peak <= kMaxPeakMemoryGib)) r->set_peak_memory_gib(0);
}

// The median wall time of the trials that ran (a retry given up on ran nothing); 0 when none.
double MedianTrialWallS(const std::vector<TrialRecord>& trials) {
  std::vector<double> walls;
  for (const TrialRecord& t : trials) {
    if (t.result.wall_s() > 0 && std::isfinite(t.result.wall_s()))
      walls.push_back(t.result.wall_s());
  }
  if (walls.empty()) return 0;
  std::sort(walls.begin(), walls.end());
  const size_t n = walls.size();
  return n % 2 ? walls[n / 2] : 0.5 * (walls[n / 2 - 1] + walls[n / 2]);
}

[[noreturn]] void Diverged(int64_t trial, const std::string& what) {
  throw StudyError("the journal does not replay at trial " + std::to_string(trial + 1) + ": " +
                   what + "; it belongs to another study or was written by another build");
}

}  // namespace

Tuner::Tuner(const search::CandidateSet& candidates, const search::Searcher& searcher,
             search::SearchSettings settings, TunerOptions options, JournalSink& journal,
             TrialBackend& backend, TunerObserver* observer)
    : candidates_(candidates),
      searcher_(searcher),
      settings_(std::move(settings)),
      options_(options),
      journal_(journal),
      backend_(backend),
      observer_(observer),
      now_s_(SteadySeconds) {}

void Tuner::BuildState(const pb::ProbeRecorded& probe) {
  for (const pb::ProbeRecorded::Feature& f : probe.features()) {
    const int k = FeatureIndex(f.feature());
    if (k < 0 || f.ratios().empty()) continue;  // a feature this build does not model
    settings_.time_prior.Tighten(k, {f.ratios().begin(), f.ratios().end()});
  }
  // The measured non-tensor memory replaces the model's assumed runtime overhead in the memory
  // prior's offset; the memory posterior then learns the rest from measured peaks.
  if (probe.non_tensor_gib() > 0) {
    settings_.memory_prior.offset_mean_gib =
        probe.non_tensor_gib() - settings_.modelled_non_tensor_gib;
  }
  // A searcher that does not follow the time posterior does not pay for it.
  settings_.learn_time = searcher_.uses_posterior();
  state_.emplace(candidates_, settings_);
}

void Tuner::Append(const pb::JournalRecord& record) { journal_.Append(record); }

void Tuner::Replay(const std::vector<pb::JournalRecord>& records, size_t checked_records) {
  for (size_t i = 0; i < records.size(); ++i) {
    const pb::JournalRecord& record = records[i];
    const bool checked = i < checked_records;
    const int64_t next = state_ ? state_->trials() : 0;
    switch (record.kind_case()) {
      case pb::JournalRecord::kSession:
        ++sessions_;
        break;
      case pb::JournalRecord::kProbe:
        if (state_) Diverged(next, "a second probe record");
        BuildState(record.probe());
        break;
      case pb::JournalRecord::kTrialStarted: {
        if (!state_) BuildState({});
        const pb::TrialStarted& s = record.trial_started();
        if (s.trial_index() != next)
          Diverged(next, "trial index " + std::to_string(s.trial_index()));
        // The candidate set is this study's (study.pb compares its fingerprint, journal.md §2).
        if (s.candidate() < 0 || s.candidate() >= candidates_.size() ||
            ToSpec(candidates_.config(s.candidate())) != s.spec()) {
          Diverged(next, "'" + s.spec() + "' is not candidate " + std::to_string(s.candidate()));
        }
        if (in_flight_) {  // a retry of the trial in flight
          if (in_flight_->started.candidate() != s.candidate())
            Diverged(next, "a retry of another configuration");
          ++in_flight_->attempts;
          break;
        }
        const auto proposal =
            checked ? searcher_.Propose(*state_, options_.seed, next) : s.candidate();
        if (!proposal || *proposal != s.candidate()) {
          Diverged(next, "the searcher now proposes " +
                             (proposal ? ToSpec(candidates_.config(*proposal)) : "nothing") +
                             ", the journal has " + s.spec());
        }
        in_flight_ = InFlight{s, 1};
        break;
      }
      case pb::JournalRecord::kTrialFinished: {
        const pb::TrialFinished& f = record.trial_finished();
        if (!in_flight_ || f.result().trial_index() != next) {
          Diverged(next, "a result without its start");
        }
        Finish(f.result(), f.elapsed_s());
        if (checked && state_->Digest() != f.state_digest()) {
          Diverged(next, "the state digest differs");
        }
        elapsed_base_s_ = f.elapsed_s();
        break;
      }
      case pb::JournalRecord::kFinished:
        elapsed_base_s_ = std::max(elapsed_base_s_, record.finished().elapsed_s());
        break;
      default:
        break;
    }
  }
}

std::string Tuner::ReplayAcrossBuilds(const std::vector<pb::JournalRecord>& records,
                                      size_t checked_records) {
  const search::SearchSettings initial = settings_;  // before the probe record tightens it
  try {
    Replay(records, checked_records);
    return "";
  } catch (const StudyError& e) {
    if (checked_records == 0) throw;  // it failed without the checks: not a matter of builds
    settings_ = initial;
    state_.reset();
    in_flight_.reset();
    trials_.clear();
    elapsed_base_s_ = 0;
    sessions_ = 0;
    Replay(records, 0);
    return e.what();
  }
}

pb::TrialStarted Tuner::Propose(int64_t candidate) {
  pb::TrialStarted s;
  s.set_trial_index(state_->trials());
  s.set_attempt(1);
  s.set_candidate(candidate);
  s.set_spec(ToSpec(candidates_.config(candidate)));
  s.set_predicted_step_time_s(state_->time().PredictMean(candidates_, candidate));
  s.set_predicted_memory_gib(state_->memory().PredictMean(state_->memory_row(candidate)));
  s.set_p_oom(state_->POom(candidate));
  return s;
}

void Tuner::Finish(pb::TrialResult result, double elapsed_s) {
  Sanitize(&result);
  const pb::TrialStarted& s = in_flight_->started;
  search::Observation o;
  o.candidate = s.candidate();
  o.outcome = FromProto(result.status());
  if (result.status() == pb::OK) o.step_time_s = result.step_time_s();
  if (result.peak_memory_gib() > 0) o.peak_memory_gib = result.peak_memory_gib();
  state_->Observe(o);

  TrialRecord record;
  record.candidate = s.candidate();
  record.attempts = in_flight_->attempts;
  record.result = std::move(result);
  record.predicted_step_time_s = s.predicted_step_time_s();
  record.predicted_memory_gib = s.predicted_memory_gib();
  record.p_oom = s.p_oom();
  record.best_candidate = state_->best();
  record.best_step_time_s = state_->best_time_s();
  record.elapsed_s = elapsed_s;
  trials_.push_back(std::move(record));
  in_flight_.reset();
}

void Tuner::AppendSession() {
  pb::JournalRecord session;
  session.mutable_session()->set_session(++sessions_);
  session.mutable_session()->set_resumed(journal_.records() > 0);
  session.mutable_session()->set_host(HostName());
  session.mutable_session()->set_pid(::getpid());
  session.mutable_session()->set_unix_time_s(static_cast<int64_t>(std::time(nullptr)));
  session.mutable_session()->set_backend(backend_.name());
  Append(session);
}

pb::TrialResult Tuner::RunInFlight(bool give_up) {
  pb::TrialResult result;
  if (give_up) {
    // Started 1 + max_retries times, and the coordinator died each time.
    result.set_trial_index(in_flight_->started.trial_index());
    result.set_attempt(in_flight_->attempts);
    result.set_spec(in_flight_->started.spec());
    result.set_status(pb::WORKER_LOST);
    result.set_failed_rank(-1);
    result.set_message("the coordinator was lost " + std::to_string(in_flight_->attempts) +
                       " times during this trial");
    return result;
  }
  pb::TrialRequest request;
  request.set_trial_index(in_flight_->started.trial_index());
  request.set_attempt(in_flight_->attempts);
  *request.mutable_config() = ToProto(candidates_.config(in_flight_->started.candidate()));
  request.set_spec(in_flight_->started.spec());
  request.set_deadline_s(options_.trial_timeout_s);
  request.set_warmup_iterations(options_.warmup_iterations);
  request.set_timed_iterations(options_.timed_iterations);
  request.set_min_timed_s(options_.min_timed_s);
  if (observer_) observer_->OnTrialStarted(in_flight_->started, *state_);
  result = backend_.Run(request);
  result.set_trial_index(request.trial_index());
  result.set_attempt(request.attempt());
  result.set_spec(request.spec());
  return result;
}

void Tuner::RecordFinished(const pb::TrialResult& result, double elapsed_s) {
  Finish(result, elapsed_s);
  pb::JournalRecord finished;
  *finished.mutable_trial_finished()->mutable_result() = trials_.back().result;
  finished.mutable_trial_finished()->set_candidate(trials_.back().candidate);
  finished.mutable_trial_finished()->set_elapsed_s(elapsed_s);
  finished.mutable_trial_finished()->set_state_digest(state_->Digest());
  if (trials_.back().best_candidate >= 0) {
    finished.mutable_trial_finished()->set_best_spec(
        ToSpec(candidates_.config(trials_.back().best_candidate)));
    finished.mutable_trial_finished()->set_best_step_time_s(trials_.back().best_step_time_s);
  }
  Append(finished);
  if (observer_) observer_->OnTrialFinished(trials_.back(), *state_);
}

TuneSummary Tuner::Run() {
  TuneSummary summary;
  const double start = now_s_();
  auto elapsed = [&] { return elapsed_base_s_ + (now_s_() - start); };
  AppendSession();
  summary.sessions = sessions_;
  if (!state_) {
    pb::JournalRecord probe;
    *probe.mutable_probe() = backend_.Probe();
    Append(probe);
    BuildState(probe.probe());
  }
  // A trial's result is timed when it comes back, after the trial ran.
  auto run_in_flight = [&](bool give_up) {
    const pb::TrialResult result = RunInFlight(give_up);
    RecordFinished(result, elapsed());
  };

  if (in_flight_) {
    // Retry the trial the last session died in, or give up on it after 1 + max_retries starts.
    const bool give_up = in_flight_->attempts > options_.max_retries;
    if (!give_up) {
      pb::TrialStarted again = in_flight_->started;
      again.set_attempt(in_flight_->attempts + 1);
      pb::JournalRecord record;
      *record.mutable_trial_started() = again;
      Append(record);
      ++in_flight_->attempts;
    }
    run_in_flight(give_up);
  }

  for (;;) {
    const int64_t trial = state_->trials();
    double t0 = now_s_();
    search::StopSettings stop = options_.stop;
    if (options_.reserve_trial_time) stop.next_trial_s = MedianTrialWallS(trials_);
    summary.stop = search::CheckStop(*state_, stop, searcher_.uses_posterior(), options_.seed,
                                     trial, elapsed());
    summary.stop_check_ms.push_back(1e3 * (now_s_() - t0));
    if (summary.stop.reason == search::StopReason::kNone && observer_) {
      observer_->OnStopCheck(summary.stop, *state_);
    }
    if (summary.stop.reason == search::StopReason::kNone) {
      t0 = now_s_();
      const auto candidate = searcher_.Propose(*state_, options_.seed, trial);
      summary.proposal_ms.push_back(1e3 * (now_s_() - t0));
      if (!candidate) summary.stop.reason = search::StopReason::kExhausted;
      if (candidate) {
        pb::JournalRecord record;
        *record.mutable_trial_started() = Propose(*candidate);
        Append(record);
        in_flight_ = InFlight{record.trial_started(), 1};
        run_in_flight(/*give_up=*/false);
        continue;
      }
    }
    summary.elapsed_s = elapsed();
    pb::JournalRecord record;
    record.mutable_finished()->set_stop_reason(search::ToString(summary.stop.reason));
    record.mutable_finished()->set_trials(state_->trials());
    record.mutable_finished()->set_elapsed_s(summary.elapsed_s);
    Append(record);
    backend_.Shutdown(search::ToString(summary.stop.reason));
    if (observer_) observer_->OnStopped(summary.stop, *state_);
    return summary;
  }
}

}  // namespace autopar::coord
