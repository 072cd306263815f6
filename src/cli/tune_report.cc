#include "tune_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "autopar/cli/json.h"
#include "autopar/cli/plan_format.h"
#include "autopar/coord/convert.h"

namespace autopar::cli {
namespace {

std::string Clock(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  const int64_t s = std::llround(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return buf;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One trial per measured configuration (its last), the search's recommendation first, then the
// other contenders in the order of their estimates, then the rest by their mean time.
std::vector<const coord::TrialRecord*> MeasuredByTime(const coord::Tuner& tuner) {
  const search::SearchState& s = tuner.state();
  std::vector<const coord::TrialRecord*> last(static_cast<size_t>(s.candidates().size()), nullptr);
  for (const coord::TrialRecord& t : tuner.trials()) {
    if (t.result.status() == pb::OK) last[static_cast<size_t>(t.candidate)] = &t;
  }
  std::vector<const coord::TrialRecord*> ok;
  for (int64_t c : s.contenders()) {
    ok.push_back(last[static_cast<size_t>(c)]);
    last[static_cast<size_t>(c)] = nullptr;
  }
  const size_t ranked = ok.size();
  for (const coord::TrialRecord* t : last) {
    if (t != nullptr) ok.push_back(t);
  }
  std::stable_sort(ok.begin() + static_cast<ptrdiff_t>(ranked), ok.end(),
                   [&](const auto* a, const auto* b) {
                     return s.measured_time_s(a->candidate) < s.measured_time_s(b->candidate);
                   });
  return ok;
}

// The mean of a configuration's measurements.
double MeanTime(const TuneReport& r, const coord::TrialRecord& t) {
  return r.tuner.state().measured_time_s(t.candidate);
}

struct Throughput {
  double tokens_per_s, tflops_per_gpu, mfu;
};
Throughput Rate(const TuneReport& r, double step_time_s) {
  const double tokens = static_cast<double>(r.in.train.global_batch_size) * r.in.train.seq_length;
  const double per_gpu =
      r.model.model_flops_per_step() / step_time_s / static_cast<double>(r.in.cluster.world_size());
  return {tokens / step_time_s, per_gpu / 1e12,
          per_gpu / r.in.cluster.gpu.PeakFlops(r.in.train.precision)};
}

void ConfigJson(JsonWriter& j, const TuneReport& r, const coord::TrialRecord& t) {
  const double y = MeanTime(r, t);
  const Throughput rate = Rate(r, y);
  const ParallelConfig& c = r.candidates.config(t.candidate);
  j.BeginObject();
  j.Field("trial", t.result.trial_index() + 1).Field("config", ToSpec(c));
  j.Field("step_time_s", y).Field("measurements", r.tuner.state().measurements(t.candidate));
  j.Field("estimated_step_time_s", r.tuner.state().Estimated(t.candidate).mean_s);
  j.Field("predicted_step_time_s", r.tuner.state().time().PredictMean(r.candidates, t.candidate));
  j.Field("analytic_step_time_s", r.candidates.nominal_time_s(t.candidate));
  j.Field("tokens_per_s", rate.tokens_per_s).Field("model_tflops_per_gpu", rate.tflops_per_gpu);
  j.Field("mfu", rate.mfu).Field("peak_memory_gib", t.result.peak_memory_gib());
  j.Field("megatron_args", MegatronFlags(c, r.in.model, r.in.train));
  j.EndObject();
}

// Where the stop rules' doubt lies: the unmeasured configurations likeliest to be better, with
// what the posterior predicts of them (docs/search.md §8).
void UnmeasuredJson(JsonWriter& j, const TuneReport& r) {
  const search::SearchState& s = r.tuner.state();
  j.Key("stop_unmeasured").BeginArray();
  for (const search::OpenCandidate& o : r.summary.stop.likeliest_unmeasured) {
    j.BeginObject();
    j.Field("config", ToSpec(r.candidates.config(o.candidate))).Field("p_better", o.p_better);
    j.Field("p_oom", s.POom(o.candidate));
    j.Field("predicted_step_time_s", s.time().PredictMean(r.candidates, o.candidate));
    j.Field("predicted_peak_memory_gib", s.memory().PredictMean(s.memory_row(o.candidate)));
    j.EndObject();
  }
  j.EndArray();
}

}  // namespace

std::string ResultJson(const TuneReport& r) {
  const search::SearchState& s = r.tuner.state();
  std::ostringstream out;
  JsonWriter j(out);
  j.BeginObject();
  j.Field("model", r.in.model.name).Field("gpu", r.in.cluster.gpu.name);
  j.Field("nnodes", r.in.cluster.nnodes).Field("gpus_per_node", r.in.cluster.gpus_per_node);
  j.Field("global_batch_size", r.in.train.global_batch_size);
  j.Field("seq_length", r.in.train.seq_length);
  j.Field("study", r.flags.study).Field("backend", r.flags.backend);
  j.Field("searcher", r.study.search().searcher()).Field("seed", r.study.search().seed());
  j.Field("candidates", r.candidates.size()).Field("trials", s.trials());
  j.Field("measured", s.measured_count()).Field("eligible_left", s.eligible_count());
  j.Key("outcomes").BeginObject();
  for (int o = 0; o <= static_cast<int>(search::Outcome::kInvalid); ++o) {
    int64_t n = 0;
    for (const search::Observation& ob : s.history()) n += static_cast<int>(ob.outcome) == o;
    j.Field(search::ToString(static_cast<search::Outcome>(o)), n);
  }
  j.EndObject();
  j.Field("stop_reason", search::ToString(r.summary.stop.reason));
  j.Field("stop_on_measured", r.summary.stop.on_measured);
  j.Field("stop_p_improvement", r.summary.stop.p_improvement);
  j.Field("stop_recent_error", r.summary.stop.recent_error);
  UnmeasuredJson(j, r);
  const auto ranked = MeasuredByTime(r.tuner);
  j.Key("best");
  if (ranked.empty()) {
    j.String("none");
  } else {
    ConfigJson(j, r, *ranked.front());
  }
  j.Key("top").BeginArray();
  for (size_t i = 0; i < ranked.size() && static_cast<int64_t>(i) < r.flags.top; ++i) {
    ConfigJson(j, r, *ranked[i]);
  }
  j.EndArray();
  if (r.table != nullptr) {
    const coord::ReplayRow* best = r.table->Best();
    j.Key("replay").BeginObject();
    j.Field("table", r.flags.replay_table.value_or(""));
    j.Field("rows", static_cast<int64_t>(r.table->rows().size()));
    if (best != nullptr) {
      j.Field("best_config", ToSpec(best->config)).Field("best_step_time_s", best->step_time_s);
      // The table's (noise-free) time of the configuration the search recommends.
      const coord::ReplayRow* chosen =
          ranked.empty() ? nullptr
                         : r.table->Find(ToSpec(r.candidates.config(ranked.front()->candidate)));
      j.Field("regret", chosen ? chosen->step_time_s / best->step_time_s - 1 : NAN);
    }
    j.EndObject();
  }
  j.Key("posterior").BeginObject();
  j.Key("theta").BeginObject();
  auto coefficient = [&](const std::string& name, int k) {
    j.Key(name).BeginObject();
    j.Field("mean", s.time().mean()[k]).Field("sd", s.time().MarginalSd(k)).EndObject();
  };
  for (int k = 0; k < search::kNumCoefficients; ++k) {
    coefficient(k == search::kIntercept ? "intercept_s" : FeatureName(k), k);
  }
  j.EndObject();
  // Relative corrections per knob value (CandidateSet): "pp=2": -0.04 is 4% faster than modelled.
  j.Key("level_effects").BeginObject();
  const search::CandidateSet& cs = s.candidates();
  for (int l = 0; l < cs.num_levels(); ++l) {
    coefficient(cs.level_name(l), search::kNumCoefficients + l);
  }
  j.EndObject();
  // How much structure the data ask for: the posterior weight of each (level scale,
  // interaction scale) hypothesis, keyed "levels=0.05,interactions=0".
  j.Key("scale_weights").BeginObject();
  for (size_t m = 0; m < s.time().hypotheses().size(); ++m) {
    std::ostringstream key;
    key << "levels=" << s.time().hypotheses()[m].level_scale
        << ",interactions=" << s.time().hypotheses()[m].interaction_scale;
    j.Field(key.str(), s.time().weights()[m]);
  }
  j.EndObject();
  j.Field("relative_noise_sd", s.time().noise_sd());
  j.Field("memory_scale", s.memory().scale()).Field("memory_offset_gib", s.memory().offset_gib());
  j.EndObject();
  // Wall-clock figures: they differ between runs that are otherwise identical.
  j.Key("timing").BeginObject();
  j.Field("elapsed_s", r.summary.elapsed_s).Field("sessions", r.summary.sessions);
  j.Field("proposal_ms_median", Median(r.summary.proposal_ms));
  j.Field("proposal_ms_max",
          r.summary.proposal_ms.empty()
              ? 0.0
              : *std::max_element(r.summary.proposal_ms.begin(), r.summary.proposal_ms.end()));
  j.Field("stop_check_ms_median", Median(r.summary.stop_check_ms));
  j.EndObject();
  j.EndObject();
  out << "\n";
  return out.str();
}

std::string TrialsCsv(const TuneReport& r) {
  std::ostringstream out;
  out << "trial,tp,pp,pp_first,pp_last,split_embedding,split_loss,dp,cp,up,ep,etp,vpp,mbs,sp,"
         "recompute,recompute_layers,dist_opt,status,"
         "step_time_s,predicted_step_time_s,peak_memory_gib,predicted_memory_gib,p_oom,attempts,"
         "best_step_time_s,message,elapsed_s,best_config,wall_s,startup_s\n";
  out.precision(9);
  for (const coord::TrialRecord& t : r.tuner.trials()) {
    const ParallelConfig& c = r.candidates.config(t.candidate);
    const pb::TrialResult& res = t.result;
    std::string message = res.message();
    std::replace(message.begin(), message.end(), '"', '\'');
    std::replace(message.begin(), message.end(), '\n', ' ');
    out << res.trial_index() + 1 << ',' << c.tp << ',' << c.pp << ',' << c.pp_first << ','
        << c.pp_last << ',' << (c.split_embedding ? "on" : "off") << ','
        << (c.split_loss ? "on" : "off") << ',' << c.dp << ',' << c.cp << ',' << c.up << ',' << c.ep
        << ',' << c.expert_tp() << ',' << c.vpp << ',' << c.mbs << ',' << (c.sp ? "on" : "off")
        << ',' << ToString(c.recompute) << ',' << c.recompute_layers << ','
        << (c.dist_opt ? "on" : "off") << ',' << coord::StatusName(res.status()) << ',';
    if (res.status() == pb::OK) out << res.step_time_s();
    out << ',' << t.predicted_step_time_s << ',';
    if (res.peak_memory_gib() > 0) out << res.peak_memory_gib();
    out << ',' << t.predicted_memory_gib << ',' << t.p_oom << ',' << t.attempts << ',';
    if (t.best_candidate >= 0) out << t.best_step_time_s;
    out << ",\"" << message << "\"," << t.elapsed_s << ",\"";
    if (t.best_candidate >= 0) out << ToSpec(r.candidates.config(t.best_candidate));
    out << "\"," << res.wall_s() << ',';
    if (res.startup_s() > 0) out << res.startup_s();
    out << "\n";
  }
  return out.str();
}

void WriteFinal(std::ostream& out, const TuneReport& r) {
  const auto ranked = MeasuredByTime(r.tuner);
  switch (r.in.format) {
    case Format::kJson:
      out << ResultJson(r);
      return;
    case Format::kCsv:
      out << TrialsCsv(r);
      return;
    case Format::kMegatron:
      if (!ranked.empty()) {
        out << MegatronFlags(r.candidates.config(ranked.front()->candidate), r.in.model, r.in.train)
            << "\n";
      }
      return;
    case Format::kYaml:
    case Format::kBridge: {
      // The best measured configuration, as --format megatron gives it (best.args).
      if (ranked.empty()) return;
      const coord::TrialRecord& best = *ranked.front();
      const auto overrides =
          BridgeOverrides(r.candidates.config(best.candidate), r.in.model, r.in.train);
      if (r.in.format == Format::kBridge) {
        out << BridgeOverrideLine(overrides) << "\n";
        return;
      }
      out << "# " << ToSpec(r.candidates.config(best.candidate)) << "\n# " << r.in.model.name
          << ": measured " << MeanTime(r, best) << " s per step, "
          << best.result.peak_memory_gib() << " GiB (trial " << best.result.trial_index() + 1
          << " of " << r.tuner.trials().size() << ")\n";
      WriteBridgeYaml(out, overrides);
      return;
    }
    case Format::kTable:
      break;
  }
  const search::SearchState& s = r.tuner.state();
  out << r.in.model.name << " on " << r.in.cluster.nnodes << " x " << r.in.cluster.gpus_per_node
      << " " << r.in.cluster.gpu.name << ": " << s.trials() << " trials over "
      << r.candidates.size() << " candidates (" << s.measured_count()
      << " measured), stopped: " << search::ToString(r.summary.stop.reason) << ", "
      << Clock(r.summary.elapsed_s) << "\n\n";
  char line[320];
  std::snprintf(line, sizeof line, "%-4s %-86s %10s %9s %11s %8s %6s %8s\n", "rank", "config",
                "measured_s", "model_s", "tokens/s", "TFLOP/s", "MFU", "mem_GiB");
  out << line;
  for (size_t i = 0; i < ranked.size() && static_cast<int64_t>(i) < r.flags.top; ++i) {
    const coord::TrialRecord& t = *ranked[i];
    const Throughput rate = Rate(r, MeanTime(r, t));
    std::snprintf(line, sizeof line, "%-4zu %-86s %10.4f %9.4f %11.0f %8.1f %5.1f%% %8.1f\n", i + 1,
                  ToSpec(r.candidates.config(t.candidate)).c_str(), MeanTime(r, t),
                  s.time().PredictMean(r.candidates, t.candidate), rate.tokens_per_s,
                  rate.tflops_per_gpu, 100 * rate.mfu, t.result.peak_memory_gib());
    out << line;
  }
  if (!ranked.empty()) {
    out << "\nmegatron: "
        << MegatronFlags(r.candidates.config(ranked.front()->candidate), r.in.model, r.in.train)
        << "\n";
  }
  out << "study: " << r.flags.study << " (result.json, trials.csv, best.args)\n";
}

void ProgressPrinter::OnTrialStarted(const pb::TrialStarted& started,
                                     const search::SearchState& state) {
  if (quiet_ || !tty_) return;
  std::ostringstream line;
  line << "[" << started.trial_index() + 1 << "] running " << started.spec();
  if (state.best() >= 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "  best %.4f s", state.best_time_s());
    line << buf;
  }
  if (!last_line_.empty()) line << "  |  last: " << last_line_;
  // \r and erase-line: the line is rewritten in place.
  err_ << "\r\x1b[2K" << line.str().substr(0, 200) << std::flush;
}

void ProgressPrinter::OnTrialFinished(const coord::TrialRecord& t,
                                      const search::SearchState& state) {
  if (session_start_s_ < 0) session_start_s_ = t.elapsed_s - t.result.wall_s();
  ++session_trials_;
  if (quiet_) return;
  const pb::TrialResult& res = t.result;
  std::ostringstream line;
  char buf[160];
  line << "[" << res.trial_index() + 1 << "] " << ToSpec(candidates_.config(t.candidate)) << "  ";
  if (res.status() == pb::OK) {
    std::snprintf(buf, sizeof buf, "%.4f s (predicted %.4f, %+.1f%%)", res.step_time_s(),
                  t.predicted_step_time_s, 100 * (res.step_time_s() / t.predicted_step_time_s - 1));
    line << buf;
  } else {
    line << coord::StatusName(res.status());
    if (res.status() == pb::OOM) {
      std::snprintf(buf, sizeof buf, " (predicted %.1f GiB of %.1f, P(OOM) %.2f)",
                    t.predicted_memory_gib, candidates_.capacity_gib(), t.p_oom);
      line << buf;
    }
    if (!res.message().empty()) line << ": " << res.message();
  }
  if (res.startup_s() > 0) {  // --backend megatron: the trial's cost besides its iterations
    std::snprintf(buf, sizeof buf, "  start-up %.1f s of %.1f s", res.startup_s(), res.wall_s());
    line << buf;
  }
  if (state.best() >= 0) {
    std::snprintf(buf, sizeof buf, "  best %.4f s", state.best_time_s());
    line << buf;
  }
  // ETA: the budget left, or fewer when --max-trials ends the study first at this trial rate.
  const double per_trial = (t.elapsed_s - session_start_s_) / static_cast<double>(session_trials_);
  double eta = options_.stop.budget_s > 0 ? options_.stop.budget_s - t.elapsed_s : INFINITY;
  if (options_.stop.max_trials > 0) {
    eta = std::min(eta, per_trial * static_cast<double>(options_.stop.max_trials - state.trials()));
  }
  line << "  elapsed " << Clock(t.elapsed_s) << "  ETA <= " << Clock(std::max(eta, 0.0));
  if (tty_) {
    last_line_ = line.str();
    err_ << "\r\x1b[2K" << last_line_.substr(0, 200) << std::flush;
  } else {
    err_ << line.str() << "\n";
  }
}

void ProgressPrinter::OnStopped(const search::StopCheck& check, const search::SearchState& state) {
  if (quiet_) return;
  if (tty_) err_ << "\n";
  err_ << "stopped: " << search::ToString(check.reason);
  if (!std::isnan(check.on_measured)) {
    err_ << " (P(none faster than the recommendation) " << check.on_measured << ", P(one >"
         << 100 * options_.stop.epsilon << "% faster) " << check.p_improvement << ")";
  }
  err_ << " after " << state.trials() << " trials\n";
  // Where the doubt that is left lies: the unmeasured configurations likeliest to be better.
  std::ostringstream label;
  label << "  unmeasured, likeliest >" << 100 * options_.stop.epsilon << "% faster: ";
  const size_t shown = std::min<size_t>(check.likeliest_unmeasured.size(), 3);
  for (size_t k = 0; k < shown; ++k) {
    const search::OpenCandidate& o = check.likeliest_unmeasured[k];
    err_ << (k == 0 ? label.str() : std::string(label.str().size(), ' '))
         << ToSpec(state.candidates().config(o.candidate)) << "  P " << o.p_better << ", P(OOM) "
         << state.POom(o.candidate) << "\n";
  }
}

void StatusObserver::Publish(const search::SearchState& state) {
  snapshot_.trials_done = state.trials();
  snapshot_.candidates = candidates_.size();
  if (state.best() >= 0) {
    snapshot_.best_config = ToSpec(candidates_.config(state.best()));
    snapshot_.best_step_time_s = state.best_time_s();
  }
  // The posterior mean's best among the candidates still eligible or measured.
  int64_t arg = -1;
  double lowest = INFINITY;
  for (int64_t i = 0; i < candidates_.size(); ++i) {
    if (!state.eligible_mask()[i] && i != state.best()) continue;
    const double t = state.time().PredictMean(candidates_, i);
    if (t < lowest) {
      lowest = t;
      arg = i;
    }
  }
  if (arg >= 0) {
    snapshot_.predicted_best_config = ToSpec(candidates_.config(arg));
    snapshot_.predicted_best_step_time_s = lowest;
  }
  snapshot_.budget_s = options_.stop.budget_s;
  board_.Update(snapshot_);
}

void StatusObserver::OnTrialStarted(const pb::TrialStarted& started,
                                    const search::SearchState& state) {
  snapshot_.trial_in_flight = true;
  snapshot_.in_flight_config = started.spec();
  Publish(state);
  next_.OnTrialStarted(started, state);
}

void StatusObserver::OnStopCheck(const search::StopCheck& check, const search::SearchState& state) {
  // Progress of the convergence rule: the share of draws already landing on measured
  // configurations against the share that stops the search.
  if (!std::isnan(check.on_measured)) {
    snapshot_.stop_progress = std::min(1.0, check.on_measured / options_.stop.converged_fraction);
  }
  board_.Update(snapshot_);
  next_.OnStopCheck(check, state);
}

void StatusObserver::OnTrialFinished(const coord::TrialRecord& record,
                                     const search::SearchState& state) {
  snapshot_.trial_in_flight = false;
  snapshot_.in_flight_config.clear();
  if (record.result.status() != pb::OK) ++snapshot_.trials_failed;
  snapshot_.elapsed_s = record.elapsed_s;
  Publish(state);
  next_.OnTrialFinished(record, state);
}

void StatusObserver::OnStopped(const search::StopCheck& check, const search::SearchState& state) {
  snapshot_.finished = true;
  snapshot_.stop_rule = search::ToString(check.reason);
  snapshot_.stop_progress = 1;
  Publish(state);
  next_.OnStopped(check, state);
}

}  // namespace autopar::cli
