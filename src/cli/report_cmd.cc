// `autopar-tune report --study DIR` (its flags: the flag table, help.h; docs/cli.md §8): the
// summary and trial table of a finished, running or interrupted study, read from study.pb and the
// journal without taking the lock. Writes OUT (default DIR/report)/{trials.csv,summary.json,
// breakdown.csv}; --plot draws them with scripts/plot_study.py (matplotlib) into OUT/plots/,
// run without a shell.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "autopar/cli/commands.h"
#include "autopar/cli/inputs.h"
#include "autopar/cli/json.h"
#include "autopar/cli/plan_format.h"
#include "autopar/common/errors.h"
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

// Closes `fd`, saying so on `err` when it fails (the data read through it is complete by then).
void CloseFd(int fd, const char* what, std::ostream& err) {
  if (::close(fd) != 0) {
    err << "autopar-tune report: close " << what << ": " << std::strerror(errno) << "\n";
  }
}

// Copies the child's output to `out` a line at a time, each prefixed "plot: ", until it closes.
void RelayLines(int fd, std::ostream& out, std::ostream& err) {
  std::string pending;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      err << "autopar-tune report: reading the plot script's output: " << std::strerror(errno)
          << "\n";
      break;
    }
    if (n == 0) break;
    pending.append(buf, static_cast<size_t>(n));
    for (size_t eol; (eol = pending.find('\n')) != std::string::npos; pending.erase(0, eol + 1)) {
      out << "plot: " << pending.substr(0, eol + 1);
    }
  }
  if (!pending.empty()) out << "plot: " << pending << "\n";
}

// Runs `argv` (argv[0] looked up in PATH) without a shell, so no path or name in it is ever
// parsed as a command: posix_spawnp with an argument vector, its stdout relayed, waited for.
// Every call is checked; a failure says which. Returns the exit status (kExitFailure when it
// could not run, was killed, or exited non-zero).
int RunProgram(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  const std::string name = "'" + argv[0] + "'";
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    err << "autopar-tune report: pipe: " << std::strerror(errno) << "\n";
    return kExitFailure;
  }
  posix_spawn_file_actions_t actions;
  int rc = posix_spawn_file_actions_init(&actions);
  if (rc == 0) {
    // dup2 onto stdout clears close-on-exec there; the pipe's own ends close at exec.
    rc = posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    std::vector<char*> args;
    args.reserve(argv.size() + 1);
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = -1;
    if (rc == 0) rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
    const int destroyed = posix_spawn_file_actions_destroy(&actions);
    if (rc == 0 && destroyed != 0) {
      err << "autopar-tune report: posix_spawn_file_actions_destroy: " << std::strerror(destroyed)
          << "\n";
    }
    CloseFd(fds[1], "the plot pipe's write end", err);
    if (rc != 0) {
      CloseFd(fds[0], "the plot pipe", err);
      err << "autopar-tune report: cannot run " << name << ": " << std::strerror(rc) << "\n";
      return kExitFailure;
    }
    RelayLines(fds[0], out, err);
    CloseFd(fds[0], "the plot pipe", err);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0) {
      if (errno != EINTR) {
        err << "autopar-tune report: waitpid " << name << ": " << std::strerror(errno) << "\n";
        return kExitFailure;
      }
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      err << "autopar-tune report: " << name << " "
          << (WIFEXITED(status) ? "exited " + std::to_string(WEXITSTATUS(status))
                                : "was killed by signal " + std::to_string(WTERMSIG(status)))
          << " (is python3-matplotlib installed?)\n";
      return kExitFailure;
    }
    return kExitOk;
  }
  CloseFd(fds[0], "the plot pipe", err);
  CloseFd(fds[1], "the plot pipe's write end", err);
  err << "autopar-tune report: posix_spawn_file_actions_init: " << std::strerror(rc) << "\n";
  return kExitFailure;
}

// scripts/plot_study.py (or $AUTOPAR_PLOT_SCRIPT) STUDY REPORT_DIR PLOTS_DIR, with python3.
int RunPlotScript(const std::string& study, const std::string& report_dir,
                  const std::string& plots_dir, std::ostream& out, std::ostream& err) {
  std::string script = std::string(AUTOPAR_SOURCE_DIR) + "/scripts/plot_study.py";
  if (const char* s = std::getenv("AUTOPAR_PLOT_SCRIPT")) script = s;
  // Debian's matplotlib lives with Debian's interpreter.
  const std::string python =
      ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  return RunProgram({python, script, study, report_dir, plots_dir}, out, err);
}

struct ReportFlags {
  std::string study;
  std::optional<std::string> output;  // --output DIR; else STUDY/report
  int64_t top = 5;
  bool plot = false;
  Format format = Format::kTable;
};

ReportFlags ReadReportFlags(Args& args) {
  ReportFlags f;
  const auto study = args.Value("--study");
  if (!study || study->empty()) {
    throw InputError("--study", "required: the study directory to report on");
  }
  f.study = *study;
  f.output = args.Value("--output");
  if (f.output && f.output->empty()) throw InputError("--output", "needs a directory");
  f.top = args.Int("--top", 5);
  f.plot = args.Switch("--plot");
  if (const auto v = args.Value("--format")) f.format = ParseFormat(*v);
  args.Finish();
  return f;
}

// A configuration's ok measurements.
struct Measured {
  std::string spec;
  double sum = 0;
  int n = 0;
  double mean() const { return sum / n; }
};

// What report reads from a study: its description, its specs and its journal, and the trials
// sorted for the summary.
struct StudyView {
  pb::StudyDescription description;
  coord::StudySpecs specs;
  coord::JournalSummary journal;
  std::vector<const coord::JournaledTrial*> ok;  // by measured step time
  std::vector<Measured> measured;  // one per configuration, by mean measured step time (then spec)
  int64_t failed = 0, in_flight = 0;
  std::string state;
  // What the study recommends (docs/search.md §7a): the journal's last recorded recommendation;
  // for a journal written before trials recorded it, the configuration with the lowest mean
  // measured step time. Empty before the first ok trial.
  std::string best_spec;
  double best_step_time_s = 0;
  bool best_recorded() const { return !journal.best_spec.empty(); }

  explicit StudyView(const std::string& study)
      : description(coord::ReadStudyDescription(study)),
        specs(coord::SpecsOf(description)),
        journal(coord::ReadJournal(study, description)) {
    for (const coord::JournaledTrial& t : journal.trials) {
      if (Ok(t)) ok.push_back(&t);
      else if (t.finished) ++failed;
      else ++in_flight;
    }
    std::sort(ok.begin(), ok.end(), [](auto* a, auto* b) {
      return a->result.step_time_s() < b->result.step_time_s();
    });
    std::map<std::string, Measured> by_spec;
    for (const coord::JournaledTrial* t : ok) {
      Measured& m = by_spec[t->spec];
      m.spec = t->spec;
      m.sum += t->result.step_time_s();
      ++m.n;
    }
    for (auto& [spec, m] : by_spec) measured.push_back(std::move(m));
    std::stable_sort(measured.begin(), measured.end(),
                     [](const Measured& a, const Measured& b) { return a.mean() < b.mean(); });
    if (best_recorded()) {
      best_spec = journal.best_spec;
      best_step_time_s = journal.best_step_time_s;
    } else {
      best_step_time_s = INFINITY;
      if (!measured.empty()) {
        best_spec = measured.front().spec;
        best_step_time_s = measured.front().mean();
      }
    }
    state = !journal.stop_reason.empty() ? "finished: " + journal.stop_reason
            : in_flight > 0              ? "interrupted (a trial in flight)"
                                         : "running or interrupted";
  }
};

// The top configurations, one row each, by their mean measured step time (a configuration
// measured again is one row, not one per measurement), with how often each was measured and
// which the study recommends; then the analytic model's features of each.
std::string BreakdownCsv(const StudyView& v, int64_t top) {
  const std::vector<Measured>& configs = v.measured;
  const CostModel model(v.specs.model, v.specs.train, v.specs.cluster, v.specs.constants);
  std::ostringstream breakdown;
  breakdown.precision(9);
  breakdown << "rank,config,measured_step_time_s,measurements,recommended";
  for (int k = 0; k < kNumFeatures; ++k) breakdown << ',' << FeatureName(k);
  breakdown << '\n';
  for (size_t i = 0; i < configs.size() && static_cast<int64_t>(i) < top; ++i) {
    const Measured& m = configs[i];
    const TimeBreakdown t = model.Time(Complete(ParseSpec(m.spec), v.specs.cluster.world_size()));
    breakdown << i + 1 << ",\"" << m.spec << "\"," << m.mean() << ',' << m.n << ','
              << (m.spec == v.best_spec ? "true" : "false");
    for (double x : t.features) breakdown << ',' << x;
    breakdown << '\n';
  }
  return breakdown.str();
}

std::string SummaryJson(const std::string& study, const StudyView& v) {
  const coord::StudySpecs& specs = v.specs;
  std::ostringstream summary;
  JsonWriter js(summary);
  js.BeginObject();
  js.Field("study", study).Field("model", specs.model.name).Field("gpu", specs.cluster.gpu.name);
  js.Field("nnodes", specs.cluster.nnodes).Field("gpus_per_node", specs.cluster.gpus_per_node);
  js.Field("device_memory_gib", specs.cluster.gpu.memory_gib);
  js.Field("searcher", v.description.search().searcher())
      .Field("backend", v.description.search().backend());
  js.Field("sessions", int64_t{v.journal.sessions});
  js.Field("trials", static_cast<int64_t>(v.journal.trials.size()));
  js.Field("ok", static_cast<int64_t>(v.ok.size())).Field("failed", v.failed);
  js.Field("in_flight", v.in_flight).Field("state", v.state);
  js.Field("stop_reason", v.journal.stop_reason);
  js.Field("elapsed_s", v.journal.elapsed_s);
  if (!v.best_spec.empty()) {
    js.Key("best").BeginObject().Field("config", v.best_spec);
    js.Field("step_time_s", v.best_step_time_s);
    js.Field("recorded", v.best_recorded());
    js.Field("megatron_args", MegatronFlags(ParseSpec(v.best_spec), specs.model, specs.train));
    js.EndObject();
  }
  js.EndObject();
  summary << "\n";
  return summary.str();
}

// Writes the report files into `dir`: --output, or STUDY/report, which must be writable; a
// failure there names --output, the way to write them elsewhere (a read-only study).
void WriteReportFiles(const ReportFlags& f, const std::string& dir,
                      const std::vector<std::pair<std::string, std::string>>& files) {
  try {
    coord::MakeDirectory(dir);
    for (const auto& [name, text] : files) coord::WriteFileAtomic(dir + "/" + name, text);
  } catch (const coord::IoError& e) {
    throw InputError("--output",
                     f.output ? std::string("cannot write the report files: ") + e.what()
                              : "cannot write the report files into the study ('" + dir +
                                    "': " + e.what() + "); give --output DIR to write them there");
  }
}

void PrintTable(std::ostream& out, const std::string& study, const StudyView& v,
                const std::string& dir) {
  const coord::StudySpecs& specs = v.specs;
  const coord::JournalSummary& j = v.journal;
  out << "study " << study << ": " << specs.model.name << " on " << specs.cluster.nnodes << " x "
      << specs.cluster.gpus_per_node << " " << specs.cluster.gpu.name << " ("
      << ToString(specs.train.precision) << "), global batch " << specs.train.global_batch_size
      << " x " << specs.train.seq_length << "\n"
      << "  " << v.state << "; " << j.sessions << " session(s), " << j.trials.size() << " trials ("
      << v.ok.size() << " ok, " << v.failed << " failed, " << v.in_flight
      << " in flight), tuning time " << Clock(j.elapsed_s) << "\n";
  if (j.valid_bytes < j.file_bytes) {
    out << "  the journal ends in a torn record (" << j.file_bytes - j.valid_bytes
        << " bytes), which resuming will cut\n";
  }
  if (!v.best_spec.empty()) {
    out << "  best: " << v.best_spec << "  " << v.best_step_time_s << " s/step"
        << (v.best_recorded() ? " (the study's recommendation)\n"
                              : " (lowest mean measured: this journal records no recommendation)\n")
        << "  megatron: " << MegatronFlags(ParseSpec(v.best_spec), specs.model, specs.train)
        << "\n";
  }
  char line[300];
  std::snprintf(line, sizeof line, "\n%-5s %-84s %-10s %3s %11s %11s %9s %9s\n", "trial", "config",
                "status", "try", "measured_s", "predicted_s", "peak_GiB", "pred_GiB");
  out << line;
  for (const coord::JournaledTrial& t : j.trials) {
    // Unmeasured cells are blank, never "nan".
    char measured[16] = "", peak[16] = "";
    if (Ok(t)) std::snprintf(measured, sizeof measured, "%.6f", t.result.step_time_s());
    if (t.finished && t.result.peak_memory_gib() > 0) {
      std::snprintf(peak, sizeof peak, "%.4f", t.result.peak_memory_gib());
    }
    std::snprintf(line, sizeof line, "%-5lld %-84s %-10s %3d %11s %11.6f %9s %9.4f\n",
                  static_cast<long long>(t.index) + 1, t.spec.c_str(), StatusOf(t).c_str(),
                  t.attempts, measured, t.predicted_step_time_s, peak, t.predicted_memory_gib);
    out << line;
  }
  out << "\nreport files: " << dir << "/{trials.csv,summary.json,breakdown.csv}\n";
}

}  // namespace

int RunReport(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  Args args(argv, "report");
  const ReportFlags f = ReadReportFlags(args);
  try {
    if (!coord::FileExists(f.study + "/study.pb")) {
      throw InputError("--study", "'" + f.study + "' holds no study (no study.pb)");
    }
    const StudyView v(f.study);
    const std::string dir = f.output.value_or(f.study + "/report");
    const std::string summary = SummaryJson(f.study, v);
    WriteReportFiles(f, dir,
                     {{"trials.csv", TrialsCsv(v.journal)},
                      {"summary.json", summary},
                      {"breakdown.csv", BreakdownCsv(v, f.top)}});
    if (f.format == Format::kJson) {
      out << summary;
    } else if (f.format == Format::kCsv) {
      out << TrialsCsv(v.journal);
    } else {
      PrintTable(out, f.study, v, dir);
    }
    if (f.plot) {
      return RunPlotScript(f.study, dir, (f.output ? *f.output : f.study) + "/plots", out, err);
    }
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
