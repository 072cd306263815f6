// `tune` and `make-replay-table`: the online search's command line (docs/cli.md §6, docs/journal.md §1). The search is
// coord::Tuner; this file turns flags into a study, a backend and a journal, and the finished
// search into the user's outputs (tune_report.cc).
#include "autopar/cli/tune.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "autopar/cli/plan_format.h"
#include "autopar/common/errors.h"
#include "autopar/coord/protocol.h"
#include "autopar/coord/replay.h"
#include "autopar/coord/study.h"
#include "autopar/coord/tuner.h"
#include "autopar/coord/worlds.h"
#include "autopar/spec/parse.h"
#include "autopar/version.h"
#include "tune_report.h"

namespace autopar::cli {
namespace {

std::map<std::string, TrialBackendFactory>& Registry() {
  static std::map<std::string, TrialBackendFactory> factories;
  return factories;
}

double Fraction(Args& args, const std::string& flag, double fallback, bool closed_above) {
  const double p = args.Double(flag, fallback);
  if (!(p > 0 && (closed_above ? p <= 1 : p < 1))) {
    throw InputError(flag, std::string("expected a number in (0, 1") + (closed_above ? "]" : ")"));
  }
  return p;
}

// --train-command and --real-data: only, and --train-command always, with --backend megatron.
void ReadMegatronFlags(Args& args, TuneFlags& f) {
  const auto command = args.Value("--train-command");
  f.real_data = args.Switch("--real-data");
  const bool megatron = f.backend == "megatron";
  if (!megatron && command) {
    throw InputError("--train-command", "only with --backend megatron; got --backend " + f.backend);
  }
  if (!megatron && f.real_data) {
    throw InputError("--real-data", "only with --backend megatron; got --backend " + f.backend);
  }
  if (!megatron) return;
  if (!command || command->empty()) {
    throw InputError("--train-command",
                     "required with --backend megatron: the training program and script, e.g. "
                     "\"python /opt/Megatron-LM/pretrain_gpt.py\"");
  }
  f.train_command = SplitCommandLine(*command);
  if (f.train_command.empty()) {
    throw InputError("--train-command", "holds no words: '" + *command + "'");
  }
  if (args.Value("--p2p-semantics")) {
    throw InputError("--p2p-semantics",
                     "not with --backend megatron: the training stack runs "
                     "its own collectives");
  }
}

TuneFlags ReadTuneFlags(Args& args) {
  TuneFlags f;
  const auto study = args.Value("--study");
  if (!study || study->empty()) {
    throw InputError("--study", "required: the study directory (created if needed)");
  }
  f.study = *study;
  f.resume = args.Switch("--resume");
  f.salvage = args.Switch("--salvage");
  if (f.salvage && !f.resume) {
    throw InputError("--salvage",
                     "only with --resume: it continues a study whose journal is "
                     "corrupt from every valid record (docs/journal.md §9)");
  }
  f.seed = args.Unsigned("--seed");
  f.replay_table = args.Value("--replay-table");
  // cpu, cuda, replay or megatron, as the flag table allows.
  f.backend = args.Value("--backend").value_or(f.replay_table ? "replay" : "cpu");
  ReadMegatronFlags(args, f);
  f.tuner.reserve_trial_time = f.backend == "megatron";
  f.p2p_semantics = ReadP2PSemantics(args, f.backend);
  f.status_addr = args.Value("--status-addr").value_or(f.status_addr);
  // -1: no endpoint, 0: any free port.
  f.status_port = static_cast<int>(args.Int("--status-port", f.backend == "replay" ? -1 : 8642));
  if (f.backend == "replay" && !f.replay_table) {
    throw InputError("--replay-table", "required with --backend replay (a CSV of measured trials)");
  }
  if (f.backend != "replay" && f.replay_table) {
    throw InputError("--replay-table", "only with --backend replay");
  }
  f.searcher = args.Value("--searcher").value_or("thompson");
  f.max_p_oom = Fraction(args, "--max-p-oom", search::kDefaultMaxPOom, false);
  f.top = args.Int("--top", 10);
  f.quiet = args.Switch("--quiet");
  coord::TunerOptions& t = f.tuner;
  t.trial_timeout_s = args.Duration("--trial-timeout", "600");
  t.warmup_iterations = static_cast<int>(args.Int("--warmup-iterations", 2));
  t.timed_iterations = static_cast<int>(args.Int("--timed-iterations", 5));
  t.min_timed_s = args.Double("--min-timed-seconds", t.min_timed_s);
  if (!(t.min_timed_s >= 0) || !std::isfinite(t.min_timed_s)) {
    throw InputError("--min-timed-seconds", "must be a non-negative number of seconds");
  }
  t.stop.budget_s = args.Duration("--budget", "8h");
  t.stop.max_trials = args.Int("--max-trials", 0);
  // The stop rules' defaults are StopSettings' (docs/search.md §8).
  const search::StopSettings defaults;
  // Each stop check draws this many posterior samples over every candidate: bounded work.
  t.stop.draws = static_cast<int>(args.Int("--stop-draws", defaults.draws));
  t.stop.converged_fraction = Fraction(args, "--stop-fraction", defaults.converged_fraction, true);
  t.stop.epsilon = args.Double("--stop-epsilon", defaults.epsilon);
  if (t.stop.epsilon >= 1) throw InputError("--stop-epsilon", "expected a number in [0, 1)");
  t.stop.delta = Fraction(args, "--stop-delta", defaults.delta, true);
  t.stop.min_measured = args.Int("--min-measured", defaults.min_measured);
  return f;
}

// With a replay table the table is the space: a restriction flag would silently do nothing.
void RejectRestrictions(const SpaceOptions& s) {
  const SpaceOptions d;
  const std::pair<const char*, bool> set[] = {
      {"--tp", !s.tp.empty()},
      {"--pp", !s.pp.empty()},
      {"--dp", !s.dp.empty()},
      {"--cp", !s.cp.empty()},
      {"--up", !s.up.empty()},
      {"--ep", !s.ep.empty()},
      {"--etp", !s.etp.empty()},
      {"--vpp", !s.vpp.empty()},
      {"--mbs", !s.mbs.empty()},
      {"--recompute", !s.recompute.empty()},
      {"--fix", !s.sp.empty() || !s.dist_opt.empty() || !s.overlap_grad_reduce.empty() ||
                    !s.overlap_param_gather.empty() || !s.grad_reduce_dtype.empty()},
      // --fix fp8_param_gather, or the flag (a pasted script's too)
      {"--fp8-param-gather", !s.fp8_param_gather.empty()},
      {"--recompute-layers", !s.recompute_layers.empty()},
      {"--max-mbs", s.max_mbs != d.max_mbs},
      {"--sweep-recompute-layers", s.sweep_recompute_layers}};
  for (const auto& [flag, on] : set) {
    if (on) throw InputError(flag, "not with --backend replay: the table's rows are the space");
  }
}

SpaceOptions OpenSpace(const SpaceOptions& base) {
  SpaceOptions open = base;
  open.tp_across_nodes = true;
  return open;
}

// A resumed study whose model, train, cluster or constants differ is refused before the replay
// table is read against the new flags (which could fail first, with the wrong exit code). Reading
// study.pb needs no lock; a worker rank on a node without the directory skips the check.
void CheckResumedInputs(const TuneFlags& flags, const Inputs& in) {
  const std::string path = flags.study + "/study.pb";
  if (!flags.resume || !coord::FileExists(path)) return;
  pb::StudyDescription stored;
  if (!stored.ParseFromString(coord::ReadFile(path))) {
    throw coord::StudyError("'" + path + "' is not a study description (does not parse)");
  }
  pb::StudyDescription given = stored;
  *given.mutable_model() = coord::Describe(in.model);
  *given.mutable_train() = coord::Describe(in.train);
  *given.mutable_cluster() = coord::Describe(in.cluster);
  *given.mutable_perf() = coord::Describe(in.constants);
  coord::CheckSameStudy(stored, given);
}

// The candidate set: a replay table's rows (the table and its CRC-32C kept), or the space.
struct Candidates {
  std::optional<coord::ReplayTable> table;
  uint32_t table_crc = 0;
  std::unique_ptr<search::CandidateSet> set;
};

Candidates FindCandidates(const TuneFlags& flags, const Inputs& in, const CostModel& model) {
  Candidates c;
  if (flags.replay_table) {
    RejectRestrictions(in.space);
    const std::string text =
        ReadTextFile("--replay-table", *flags.replay_table, bounds::kMaxReplayTableBytes);
    c.table_crc = coord::Crc32c(text.data(), text.size());
    c.table = coord::ReplayTable::Parse(text, *flags.replay_table);
    c.table->Validate(SearchSpace(in.model, in.train, in.cluster, OpenSpace({})),
                      *flags.replay_table);
    c.set = std::make_unique<search::CandidateSet>(c.table->configs(), model,
                                                   in.cluster.gpu.memory_gib);
  } else {
    // A Megatron trial keeps a script's --fp8-param-gather (launcher/megatron_flags.txt: read),
    // so candidates pinned without FP8 parameters would run them all the same.
    const std::vector<std::string>& script = in.megatron_words;
    if (flags.backend == "megatron" && in.space.fp8_param_gather == std::vector<bool>{false} &&
        std::find(script.begin(), script.end(), "--fp8-param-gather") != script.end()) {
      throw InputError("--fix",
                       "fp8_param_gather=off, but the script passes --fp8-param-gather, which "
                       "every Megatron trial keeps: take it out of the script");
    }
    // The trials of our own backends keep 16-bit parameters (trial.cc's Validate).
    const std::vector<bool>& fp8_params = in.space.fp8_param_gather;
    if (flags.backend != "megatron" &&
        std::find(fp8_params.begin(), fp8_params.end(), true) != fp8_params.end()) {
      throw InputError("--fp8-param-gather",
                       "not with --backend " + flags.backend +
                           ": its trials keep 16-bit parameters; plan and predict model FP8 "
                           "parameters, and --backend megatron runs them");
    }
    const StageBalancer balancer(model);  // uneven stages, as plan ranks them
    const SearchSpace space(in.model, in.train, in.cluster, in.space, &balancer);
    c.set = std::make_unique<search::CandidateSet>(search::CandidateSet::FromSpace(space, model));
  }
  return c;
}

// The read-only status endpoint: it only reads the board the observer keeps, so a failure to
// bind (a port in use) costs the endpoint, never the search. Null when off or not bound.
std::unique_ptr<coord::StatusServer> StartStatusServer(const TuneFlags& flags,
                                                       const coord::StatusBoard& board,
                                                       std::ostream& err) {
  if (flags.status_port < 0) return nullptr;
  try {
    auto server = std::make_unique<coord::StatusServer>(
        flags.status_addr, static_cast<uint16_t>(flags.status_port), board);
    err << "autopar-tune tune: status at http://" << flags.status_addr << ":" << server->port()
        << "/status and /metrics\n";
    return server;
  } catch (const std::runtime_error& e) {
    err << "autopar-tune tune: no status endpoint: " << e.what() << "\n";
    return nullptr;
  }
}

// The trial backend: the replay table's (`*replay` set to it), or the registered one for
// --backend, which on ranks other than 0 runs the worker loop and returns null.
std::unique_ptr<coord::TrialBackend> MakeBackend(const TuneFlags& flags, const Inputs& in,
                                                 const pb::StudyDescription& given,
                                                 const search::CandidateSet& candidates,
                                                 const std::optional<coord::ReplayTable>& table,
                                                 coord::ReplayBackend** replay) {
  if (flags.backend == "replay") {
    auto owned = std::make_unique<coord::ReplayBackend>(*table);
    *replay = owned.get();
    return owned;
  }
  const auto factory = Registry().find(flags.backend);
  if (factory == Registry().end()) {
    throw InputError("--backend", flags.backend +
                                      " runs trials on every rank and needs the MPI launcher "
                                      "(mpirun -np N autopar-tune ...), which this build does "
                                      "not wire in yet; use --backend replay --replay-table "
                                      "FILE.csv");
  }
  const TuneContext context{in,
                            given,
                            candidates,
                            flags.backend,
                            flags.p2p_semantics,
                            flags.tuner.trial_timeout_s,
                            flags.tuner.warmup_iterations,
                            flags.tuner.timed_iterations,
                            flags.study,
                            flags.train_command,
                            in.megatron_words,
                            flags.real_data};
  return factory->second(context);
}

// The study as the flags describe it (docs/journal.md §2).
pb::StudyDescription DescribeStudy(const TuneFlags& flags, const Inputs& in,
                                   const search::CandidateSet& candidates,
                                   const std::string& searcher, uint32_t table_crc) {
  pb::StudyDescription given;
  given.set_format_version(coord::kStudyFormatVersion);
  *given.mutable_model() = coord::Describe(in.model);
  *given.mutable_train() = coord::Describe(in.train);
  *given.mutable_cluster() = coord::Describe(in.cluster);
  *given.mutable_space() = coord::Describe(in.space, candidates);
  if (flags.replay_table) {
    given.mutable_space()->set_replay_table(*flags.replay_table);
    given.mutable_space()->set_replay_table_crc32c(table_crc);
  }
  *given.mutable_perf() = coord::Describe(in.constants);
  pb::SearchDesc& sd = *given.mutable_search();
  sd.set_searcher(searcher);
  sd.set_seed(flags.seed.value_or(0));
  sd.set_max_p_oom(flags.max_p_oom);
  sd.set_max_failures(2);
  sd.set_stop_draws(flags.tuner.stop.draws);
  sd.set_stop_fraction(flags.tuner.stop.converged_fraction);
  sd.set_stop_epsilon(flags.tuner.stop.epsilon);
  sd.set_stop_delta(flags.tuner.stop.delta);
  sd.set_min_measured(static_cast<int32_t>(flags.tuner.stop.min_measured));
  sd.set_backend(flags.backend);
  given.set_created_by("autopar-tune " AUTOPAR_VERSION_STRING);
  return given;
}

// The study directory, locked, with its description and journal (docs/journal.md §1–§5): a new
// study is described by `given`; an existing one must be resumed and match it, and its seed is
// the default. The journal must belong to the study (its fingerprint, §3).
struct OpenedStudy {
  std::unique_ptr<coord::StudyDir> dir;
  coord::FileJournal::Opened journal;
};

OpenedStudy OpenStudy(const TuneFlags& flags, pb::StudyDescription& given, std::ostream& err) {
  OpenedStudy s;
  s.dir = std::make_unique<coord::StudyDir>(flags.study);
  const coord::StudyDir& dir = *s.dir;
  uint64_t fingerprint = 0;  // the study the journal must belong to (study.pb's)
  if (dir.HasDescription()) {
    if (!flags.resume) {
      const std::string hint = "pass --resume to continue it or choose another --study";
      throw coord::StudyError("study '" + flags.study + "' exists; " + hint);
    }
    const pb::StudyDescription stored = dir.ReadDescription();
    if (!flags.seed) given.mutable_search()->set_seed(stored.search().seed());  // the study's
    coord::CheckSameStudy(stored, given);
    fingerprint = coord::JournalFingerprint(stored);
  } else {
    if (coord::FileExists(dir.Path("journal"))) {
      const std::string hint = "move it away or choose another --study";
      throw coord::StudyError("'" + dir.Path("journal") + "' exists without study.pb; " + hint);
    }
    if (flags.resume && !flags.quiet) {
      err << "autopar-tune tune: nothing to resume in '" << flags.study << "', starting it\n";
    }
    dir.WriteDescription(given);
    fingerprint = coord::JournalFingerprint(given);
  }
  s.journal = coord::FileJournal::Open(
      dir.Path("journal"),
      flags.salvage ? coord::JournalRecovery::kSalvage : coord::JournalRecovery::kRefuseCorrupt,
      fingerprint);
  if (!s.journal.salvaged_copy.empty()) {
    err << "autopar-tune tune: salvaged '" << dir.Path("journal")
        << "': " << s.journal.salvage_report << "\n";
  } else if (flags.salvage && !flags.quiet) {
    err << "autopar-tune tune: --salvage: the journal is not corrupt, nothing to salvage\n";
  }
  if (s.journal.cut_bytes > 0) {
    err << "autopar-tune tune: cut a torn record (" << s.journal.cut_bytes << " bytes) from '"
        << dir.Path("journal") << "'\n";
  }
  return s;
}

// result.json, trials.csv and best.args, each atomic (docs/journal.md §1).
void WriteOutputs(const coord::StudyDir& dir, const TuneReport& report) {
  coord::WriteFileAtomic(dir.Path("result.json"), ResultJson(report));
  coord::WriteFileAtomic(dir.Path("trials.csv"), TrialsCsv(report));
  const int64_t best = report.tuner.state().best();
  if (best >= 0) {
    coord::WriteFileAtomic(
        dir.Path("best.args"),
        MegatronFlags(report.candidates.config(best), report.in.model, report.in.train) + "\n");
  }
}

int TuneStudy(TuneFlags& flags, const Inputs& in, std::ostream& out, std::ostream& err) {
  CheckResumedInputs(flags, in);
  const CostModel model(in.model, in.train, in.cluster, in.constants);

  // ---- the candidate set: the table's rows, or the space ----
  Candidates found = FindCandidates(flags, in, model);
  std::optional<coord::ReplayTable>& table = found.table;
  const uint32_t table_crc = found.table_crc;
  const std::unique_ptr<search::CandidateSet>& candidates = found.set;
  if (candidates->size() == 0) {
    err << "autopar-tune tune: no configuration satisfies the constraints of "
           "docs/architecture.md §3 with these restrictions\n";
    return kExitInfeasible;
  }
  const auto searcher = search::MakeSearcher(flags.searcher, *candidates);
  pb::StudyDescription given = DescribeStudy(flags, in, *candidates, searcher->name(), table_crc);
  pb::SearchDesc& sd = *given.mutable_search();

  // ---- the backend (on ranks other than 0, a real backend runs the worker loop and returns) ----
  coord::ReplayBackend* replay = nullptr;  // its noise seed is the study's, known below
  const std::unique_ptr<coord::TrialBackend> backend =
      MakeBackend(flags, in, given, *candidates, table, &replay);
  if (!backend) return kExitOk;  // a worker rank, done
  WriteNotes(err, "tune", in);
  // Whatever ends this function, the workers must leave their loop, or an error on rank 0 (a
  // locked study, say) would leave them waiting in the next broadcast.
  struct ReleaseWorkers {
    coord::TrialBackend& backend;
    ~ReleaseWorkers() {
      try {
        backend.Shutdown("the coordinator stopped");
      } catch (const std::exception&) {
        // the channel is already gone: nobody is left waiting
      }
    }
  } release{*backend};

  // ---- the study directory: lock, description, journal ----
  OpenedStudy study = OpenStudy(flags, given, err);
  coord::FileJournal::Opened& journal = study.journal;

  search::SearchSettings settings = search::SearchSettings::Default(*candidates);
  settings.max_p_oom = flags.max_p_oom;
  settings.modelled_non_tensor_gib = in.constants.mem.runtime_overhead_gib;
  flags.tuner.seed = sd.seed();
  if (replay != nullptr) replay->set_noise_seed(sd.seed());
  ProgressPrinter progress(err, *candidates, flags.tuner, flags.quiet,
                           &err == &std::cerr && isatty(STDERR_FILENO));
  coord::StatusBoard board;
  std::unique_ptr<coord::StatusServer> server = StartStatusServer(flags, board, err);
  // Only a running endpoint needs the board kept current (a pass over the candidates per trial).
  std::optional<StatusObserver> status;
  if (server) {
    coord::StatusSnapshot base;
    base.study = flags.study;
    base.model = in.model.name;
    base.searcher = searcher->name();
    status.emplace(progress, board, *candidates, flags.tuner, base);
  }
  coord::TunerObserver* observer = status ? static_cast<coord::TunerObserver*>(&*status) : &progress;
  coord::Tuner tuner(*candidates, *searcher, settings, flags.tuner, *journal.journal, *backend,
                     observer);
  if (const std::string diverged =
          tuner.ReplayAcrossBuilds(journal.records, journal.checked_records);
      !diverged.empty()) {
    err << "autopar-tune tune: note: " << diverged << ".\n  The study's flags match (study.pb), so "
        << "its measurements are replayed as observations without the proposal and digest "
        << "checks; the search goes on as this build runs it (docs/journal.md §7)\n";
  }
  if (!journal.records.empty() && !flags.quiet) {
    err << "autopar-tune tune: resumed '" << flags.study << "' after " << tuner.trials().size()
        << " trials\n";
  }
  const coord::TuneSummary summary = tuner.Run();
  // The endpoint stops before the outputs are written: whatever a flood of connections did to
  // it, its descriptors are free for the result files (docs/protocol.md §8).
  server.reset();

  // ---- outputs ----
  const TuneReport report{in,      model, *candidates, tuner,
                          summary, given, flags,       table ? &*table : nullptr};
  WriteOutputs(*study.dir, report);
  WriteFinal(out, report);
  if (tuner.state().best() < 0) {
    err << "autopar-tune tune: no configuration could be measured (" << tuner.trials().size()
        << " trials, stop: " << search::ToString(summary.stop.reason) << ")";
    if (tuner.trials().empty()) {
      err << ": none of the " << candidates->size() << " candidates fits in "
          << in.cluster.gpu.memory_gib << " GiB with P(OOM) < " << flags.max_p_oom;
    }
    err << "\n";
    return kExitInfeasible;
  }
  return kExitOk;
}

}  // namespace

void RegisterTrialBackend(const std::string& name, TrialBackendFactory factory) {
  Registry()[name] = std::move(factory);
}

int RunTune(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  Args args(WithCpuBackendDefaults(argv), "tune");
  TuneFlags flags = ReadTuneFlags(args);
  Inputs in = ReadInputs(args);
  ApplyBackend(flags.backend, in);
  try {
    return TuneStudy(flags, in, out, err);
  } catch (const coord::StudyError& e) {
    err << "autopar-tune tune: " << e.what() << "\n";
    return kExitStudyMismatch;
  } catch (const coord::IoError& e) {
    err << "autopar-tune tune: " << e.what() << "\n";
    return kExitFailure;
  } catch (const coord::ChannelError& e) {
    err << "autopar-tune tune: lost the workers: " << e.what() << "; relaunch with --resume\n";
    return kExitFailure;
  }
}

// A synthetic table holds what `tune` reads back: every time and peak a measurement
// (coord/backend.h), else the knobs drew something no run measures.
void RequireMeasurements(const coord::ReplayTable& table) {
  for (const coord::ReplayRow& r : table.rows()) {
    const bool time_ok = std::isnan(r.step_time_s) || (r.step_time_s >= coord::kMinStepTimeS &&
                                                       r.step_time_s <= coord::kMaxStepTimeS);
    const bool peak_ok =
        std::isnan(r.peak_memory_gib) || (r.peak_memory_gib >= coord::kMinPeakMemoryGib &&
                                          r.peak_memory_gib <= coord::kMaxPeakMemoryGib);
    if (!time_ok || !peak_ok) {
      const double v = time_ok ? r.peak_memory_gib : r.step_time_s;
      char what[64] = "a number that is not finite";
      if (std::isfinite(v)) std::snprintf(what, sizeof what, "%g %s", v, time_ok ? "GiB" : "s");
      throw InputError("--model", ToSpec(r.config) + " would measure " + what +
                                      " with this model, batch, cluster and --*-range scales, "
                                      "outside what a replay table holds (1e-9 to 1e6)");
    }
  }
}

int RunMakeReplayTable(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  Args args(argv, "make-replay-table");
  const auto output = args.Value("--output");
  const std::string world_name = args.Value("--world").value_or("scaled");
  const std::optional<coord::WorldFamily> world = coord::ParseWorldFamily(world_name);
  if (!world) {
    throw InputError("--world", std::string("allowed: ") + coord::WorldFamilyNames() + "; got '" +
                                    world_name + "'");
  }
  coord::SyntheticTruth truth;
  truth.seed = static_cast<uint64_t>(args.Int("--truth-seed", 1));
  auto range = [&](const std::string& flag, double* lo, double* hi) {
    const auto v = args.Value(flag);
    if (!v) return;
    const std::vector<std::string> parts = [&] {
      std::vector<std::string> p;
      std::string item;
      std::istringstream s(*v);
      while (std::getline(s, item, ',')) p.push_back(item);
      return p;
    }();
    char* e1 = nullptr;
    char* e2 = nullptr;
    if (parts.size() != 2) throw InputError(flag, "expected LO,HI; got '" + *v + "'");
    *lo = std::strtod(parts[0].c_str(), &e1);
    *hi = std::strtod(parts[1].c_str(), &e2);
    // Scales of the analytic model's terms: bounded so the table's times stay measurements.
    if (*e1 || *e2 || !(*lo >= 1e-3) || !(*hi >= *lo) || !(*hi <= 1e3)) {
      throw InputError(flag, "expected LO,HI with 0.001 <= LO <= HI <= 1000; got '" + *v + "'");
    }
  };
  range("--compute-range", &truth.compute_low, &truth.compute_high);
  range("--comm-range", &truth.comm_low, &truth.comm_high);
  range("--memory-scale-range", &truth.memory_scale_low, &truth.memory_scale_high);
  // Log-normal standard deviations, as a table's noise_sd column (docs/cli.md §12).
  truth.noise = args.Double("--noise", truth.noise);
  truth.memory_noise = args.Double("--memory-noise", truth.memory_noise);
  for (const auto& [flag, sd] :
       {std::pair{"--noise", truth.noise}, {"--memory-noise", truth.memory_noise}}) {
    if (sd > 1) throw InputError(flag, "expected a log-normal sd from 0 to 1");
  }
  truth.surprise_oom = args.Double("--surprise-oom", truth.surprise_oom);
  if (truth.surprise_oom > 1)
    throw InputError("--surprise-oom", "expected a probability in [0, 1]");
  Inputs in = ReadInputs(args);
  WriteNotes(err, "make-replay-table", in);
  const CostModel model(in.model, in.train, in.cluster, in.constants);
  const StageBalancer balancer(model);
  const SearchSpace space(in.model, in.train, in.cluster, in.space, &balancer);
  const search::CandidateSet candidates = search::CandidateSet::FromSpace(space, model);
  if (candidates.size() == 0) {
    err << "autopar-tune make-replay-table: the space is empty\n";
    return kExitInfeasible;
  }
  std::string summary;
  const coord::ReplayTable table = coord::MakeWorldTable(
      candidates, coord::WorldShape::Of(in.model, in.train), *world, truth, &summary);
  RequireMeasurements(table);
  const std::string csv = table.ToCsv();
  int64_t ok = 0;
  for (const coord::ReplayRow& r : table.rows()) ok += r.status == search::Outcome::kOk;
  try {
    if (output) {
      coord::WriteFileAtomic(*output, csv);
    } else {
      out << csv;
    }
  } catch (const coord::IoError& e) {
    err << "autopar-tune make-replay-table: " << e.what() << "\n";
    return kExitFailure;
  }
  err << "make-replay-table: " << table.rows().size() << " rows, " << ok << " ok, "
      << table.rows().size() - ok << " oom";
  if (const coord::ReplayRow* best = table.Best()) {
    err << "; best " << ToSpec(best->config) << " " << best->step_time_s << " s";
  }
  err << "\n";
  if (*world != coord::WorldFamily::kScaled) err << "make-replay-table: " << summary << "\n";
  return kExitOk;
}

}  // namespace autopar::cli
