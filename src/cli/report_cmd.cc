// `autopar-tune report --study DIR [--top K] [--format table|json|csv] [--plot]`: the summary and
// trial table of a finished, running or interrupted study, read from study.pb and the journal
// without taking the lock. Writes DIR/report/{trials.csv,summary.json,breakdown.csv}; --plot
// draws them with scripts/plot_study.py (matplotlib) into DIR/plots/.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "autopar/cli/commands.h"
#include "autopar/cli/inputs.h"
#include "autopar/cli/json.h"
#include "autopar/cli/report.h"
#include "autopar/common/status.h"
#include "autopar/coord/convert.h"
#include "autopar/coord/files.h"
#include "autopar/coord/study_read.h"
#include "autopar/perf/cost_model.h"

namespace autopar::cli {
namespace {

std::string Clock(double s) {
  const int64_t t = static_cast<int64_t>(std::llround(s));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(t / 3600),
                static_cast<long long>(t / 60 % 60), static_cast<long long>(t % 60));
  return buf;
}

bool Ok(const coord::JournaledTrial& t) { return t.finished && t.result.status() == pb::OK; }

std::string StatusOf(const coord::JournaledTrial& t) {
  return t.finished ? coord::StatusName(t.result.status()) : "in_flight";
}

std::string TrialsCsv(const coord::JournalSummary& j) {
  std::ostringstream out;
  out.precision(9);
  out << "trial,config,status,attempts,step_time_s,predicted_step_time_s,peak_memory_gib,"
         "predicted_memory_gib,best_step_time_s,elapsed_s\n";
  double best = INFINITY;
  for (const coord::JournaledTrial& t : j.trials) {
    if (Ok(t)) best = std::min(best, t.result.step_time_s());
    out << t.index + 1 << ",\"" << t.spec << "\"," << StatusOf(t) << ',' << t.attempts << ',';
    if (Ok(t)) out << t.result.step_time_s();
    out << ',' << t.predicted_step_time_s << ',';
    if (t.finished && t.result.peak_memory_gib() > 0) out << t.result.peak_memory_gib();
    out << ',' << t.predicted_memory_gib << ',';
    if (std::isfinite(best)) out << best;
    out << ',' << t.elapsed_s << '\n';
  }
  return out.str();
}

int RunPlotScript(const std::string& study, std::ostream& out, std::ostream& err) {
  std::string script = std::string(AUTOPAR_SOURCE_DIR) + "/scripts/plot_study.py";
  if (const char* s = std::getenv("AUTOPAR_PLOT_SCRIPT")) script = s;
  // Debian's matplotlib lives with Debian's interpreter.
  const char* python = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  const std::string command = std::string(python) + " '" + script + "' '" + study + "'";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    err << "autopar-tune report: cannot run " << command << "\n";
    return kExitFailure;
  }
  char line[512];
  while (std::fgets(line, sizeof line, pipe) != nullptr) out << "plot: " << line;
  const int status = pclose(pipe);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    err << "autopar-tune report: " << command << " failed (is python3-matplotlib installed?)\n";
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

int RunReport(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  Args args(argv);
  const auto study = args.Value("--study");
  if (!study) throw InputError("--study", "required: the study directory to report on");
  const int64_t top = args.Int("--top", 5);
  const bool plot = args.Switch("--plot");
  Format format = Format::kTable;
  if (const auto f = args.Value("--format")) format = ParseFormat(*f);
  args.Finish();
  try {
    if (!coord::FileExists(*study + "/study.pb")) {
      throw InputError("--study", "'" + *study + "' holds no study (no study.pb)");
    }
    const pb::StudyDescription d = coord::ReadStudyDescription(*study);
    const coord::StudySpecs specs = coord::SpecsOf(d);
    const coord::JournalSummary j = coord::ReadJournal(*study, d);
    const CostModel model(specs.model, specs.train, specs.cluster, specs.constants);

    std::vector<const coord::JournaledTrial*> ok;
    int64_t failed = 0, in_flight = 0;
    for (const coord::JournaledTrial& t : j.trials) {
      if (Ok(t)) ok.push_back(&t);
      else if (t.finished) ++failed;
      else ++in_flight;
    }
    std::sort(ok.begin(), ok.end(), [](auto* a, auto* b) {
      return a->result.step_time_s() < b->result.step_time_s();
    });
    const std::string state = j.stop_reason.empty()
                                  ? (in_flight > 0 ? "interrupted (a trial in flight)" : "running or interrupted")
                                  : "finished: " + j.stop_reason;

    // The files the plots are drawn from.
    const std::string dir = *study + "/report";
    coord::MakeDirectory(dir);
    coord::WriteFileAtomic(dir + "/trials.csv", TrialsCsv(j));
    std::ostringstream breakdown;
    breakdown.precision(9);
    breakdown << "rank,config,measured_step_time_s";
    for (int k = 0; k < kNumFeatures; ++k) breakdown << ',' << FeatureName(k);
    breakdown << '\n';
    for (size_t i = 0; i < ok.size() && static_cast<int64_t>(i) < top; ++i) {
      const ParallelConfig c = Complete(ParseSpec(ok[i]->spec), specs.cluster.world_size());
      const TimeBreakdown t = model.Time(c);
      breakdown << i + 1 << ",\"" << ok[i]->spec << "\"," << ok[i]->result.step_time_s();
      for (double x : t.features) breakdown << ',' << x;
      breakdown << '\n';
    }
    coord::WriteFileAtomic(dir + "/breakdown.csv", breakdown.str());
    std::ostringstream summary;
    {
      JsonWriter js(summary);
      js.BeginObject();
      js.Field("study", *study).Field("model", specs.model.name).Field("gpu", specs.cluster.gpu.name);
      js.Field("nnodes", specs.cluster.nnodes).Field("gpus_per_node", specs.cluster.gpus_per_node);
      js.Field("device_memory_gib", specs.cluster.gpu.memory_gib);
      js.Field("searcher", d.search().searcher()).Field("backend", d.search().backend());
      js.Field("sessions", int64_t{j.sessions});
      js.Field("trials", static_cast<int64_t>(j.trials.size()));
      js.Field("ok", static_cast<int64_t>(ok.size())).Field("failed", failed);
      js.Field("in_flight", in_flight).Field("state", state).Field("stop_reason", j.stop_reason);
      js.Field("elapsed_s", j.elapsed_s);
      if (!ok.empty()) {
        js.Key("best").BeginObject().Field("config", ok[0]->spec);
        js.Field("step_time_s", ok[0]->result.step_time_s());
        js.Field("megatron_args",
                 MegatronFlags(ParseSpec(ok[0]->spec), specs.model, specs.train));
        js.EndObject();
      }
      js.EndObject();
      summary << "\n";
    }
    coord::WriteFileAtomic(dir + "/summary.json", summary.str());

    if (format == Format::kJson) {
      out << summary.str();
    } else if (format == Format::kCsv) {
      out << TrialsCsv(j);
    } else {
      out << "study " << *study << ": " << specs.model.name << " on " << specs.cluster.nnodes
          << " x " << specs.cluster.gpus_per_node << " " << specs.cluster.gpu.name << " ("
          << ToString(specs.train.precision) << "), global batch " << specs.train.global_batch_size
          << " x " << specs.train.seq_length << "\n"
          << "  " << state << "; " << j.sessions << " session(s), " << j.trials.size()
          << " trials (" << ok.size() << " ok, " << failed << " failed, " << in_flight
          << " in flight), tuning time " << Clock(j.elapsed_s) << "\n";
      if (j.valid_bytes < j.file_bytes) {
        out << "  the journal ends in a torn record (" << j.file_bytes - j.valid_bytes
            << " bytes), which resuming will cut\n";
      }
      if (!ok.empty()) {
        out << "  best: " << ok[0]->spec << "  " << ok[0]->result.step_time_s() << " s/step\n"
            << "  megatron: " << MegatronFlags(ParseSpec(ok[0]->spec), specs.model, specs.train)
            << "\n";
      }
      char line[300];
      std::snprintf(line, sizeof line, "\n%-5s %-84s %-10s %3s %11s %11s %9s %9s\n", "trial",
                    "config", "status", "try", "measured_s", "predicted_s", "peak_GiB", "pred_GiB");
      out << line;
      for (const coord::JournaledTrial& t : j.trials) {
        std::snprintf(line, sizeof line, "%-5lld %-84s %-10s %3d %11.6f %11.6f %9.4f %9.4f\n",
                      static_cast<long long>(t.index + 1), t.spec.c_str(), StatusOf(t).c_str(),
                      t.attempts, Ok(t) ? t.result.step_time_s() : NAN, t.predicted_step_time_s,
                      t.finished ? t.result.peak_memory_gib() : NAN, t.predicted_memory_gib);
        out << line;
      }
      out << "\nreport files: " << dir << "/{trials.csv,summary.json,breakdown.csv}\n";
    }
    if (plot) return RunPlotScript(*study, out, err);
    return kExitOk;
  } catch (const coord::IoError& e) {
    err << "autopar-tune report: " << e.what() << "\n";
    return kExitFailure;
  } catch (const coord::StudyError& e) {
    err << "autopar-tune report: " << e.what() << "\n";
    return kExitStudyMismatch;
  }
}

}  // namespace autopar::cli
