// `trial` and `probe` under mpirun: see include/autopar/cli/trial_cmd.h.
#if defined(AUTOPAR_WITH_TRIALS)

#include "autopar/cli/trial_cmd.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "autopar/cli/inputs.h"
#include "autopar/cli/json.h"
#include "autopar/cli/mpi_session.h"
#include "autopar/common/errors.h"
#include "autopar/perf/cost_model.h"
#include "autopar/spec/units.h"
#include "autopar/trial/device_factory.h"
#include "autopar/trial/probe.h"
#include "autopar/trial/trial.h"
#include "src/cli/rank_worker.h"

namespace autopar::cli {
namespace {

// Flags every MPI command takes besides the planning inputs.
struct WorkerFlags {
  std::string backend = "cpu";
  device::P2PSemantics p2p_semantics = device::P2PSemantics::kMpi;
  trial::TrialOptions options;
};

WorkerFlags ReadWorkerFlags(Args& args) {
  WorkerFlags f;
  f.backend = args.Value("--backend").value_or(f.backend);  // cpu or cuda, as the table allows
  f.p2p_semantics = ReadP2PSemantics(args, f.backend);
  f.options.timeout_s = args.Double("--trial-timeout", 600);
  if (f.options.timeout_s > 1e9) throw InputError("--trial-timeout", "at most 1e9 seconds");
  f.options.warmup_iterations = static_cast<int>(args.Int("--warmup", 1));
  f.options.timed_iterations = static_cast<int>(args.Int("--iters", 3));
  f.options.min_timed_s = args.Double("--min-timed-seconds", 0);
  if (!(f.options.min_timed_s >= 0) || !std::isfinite(f.options.min_timed_s)) {
    throw InputError("--min-timed-seconds", "must be a non-negative number of seconds");
  }
  f.options.max_microbatches = static_cast<int>(args.Int("--max-microbatches", 0));
  f.options.seed = static_cast<uint64_t>(args.Int("--seed", 1234));
  // Test hook of the fault tests: this world rank stalls.
  if (const char* stall = std::getenv("AUTOPAR_TEST_STALL_RANK")) f.options.stall_rank = std::atoi(stall);
  return f;
}

void PrintTrial(std::ostream& out, Format format, const ParallelConfig& c, const Inputs& in,
                const std::string& backend, const trial::TrialMeasurement& m,
                const Estimate& predicted) {
  const double peak = m.peak_memory_gib.empty()
                          ? 0
                          : *std::max_element(m.peak_memory_gib.begin(), m.peak_memory_gib.end());
  if (format == Format::kJson) {
    JsonWriter j(out);
    j.BeginObject();
    j.Field("config", ToSpec(c)).Field("backend", backend);
    j.Field("status", std::string(device::OutcomeName(m.outcome)));
    j.Field("message", m.message).Field("notes", m.notes);
    j.Field("step_time_s", m.step_time_s);
    j.Key("iteration_times_s").BeginArray();
    for (double t : m.iteration_times_s) j.Number(t);
    j.EndArray();
    j.Key("peak_memory_gib").BeginArray();
    for (double g : m.peak_memory_gib) j.Number(g);
    j.EndArray();
    j.Field("tokens_per_s", m.tokens_per_s).Field("loss", m.loss).Field("aux_loss", m.aux_loss);
    j.Field("grad_buckets_overlapped", m.grad_buckets_overlapped)
        .Field("param_buckets_overlapped", m.param_buckets_overlapped);
    j.Field("microbatches_run", int64_t{m.microbatches_run});
    j.Field("microbatches_total", int64_t{m.microbatches_total});
    j.Field("predicted_step_time_s", predicted.time.step_time_s);
    j.Field("predicted_peak_memory_gib", predicted.peak_memory_gib);
    j.EndObject();
    out << "\n";
    return;
  }
  char line[256];
  out << "trial " << ToSpec(c) << "\n  " << in.model.name << ", " << in.cluster.world_size()
      << " ranks, " << backend << " backend: " << device::OutcomeName(m.outcome) << "\n";
  if (m.outcome != device::Outcome::kOk) {
    out << "  " << m.message << "\n";
    return;
  }
  std::snprintf(line, sizeof line,
                "  step time      %.6f s  (median of %zu; %d of %d micro-batches run, "
                "extrapolated; model %.6f s)\n",
                m.step_time_s, m.iteration_times_s.size(), m.microbatches_run,
                m.microbatches_total, predicted.time.step_time_s);
  out << line << "  iterations    ";
  for (double t : m.iteration_times_s) {
    std::snprintf(line, sizeof line, " %.6f", t);
    out << line;
  }
  std::snprintf(line, sizeof line, "\n  tokens/s       %.0f\n  loss           %.6f%s\n",
                m.tokens_per_s, m.loss,
                m.aux_loss != 0 ? (" (+ MoE load-balancing " + std::to_string(m.aux_loss) + ")").c_str()
                                : "");
  out << line;
  std::snprintf(line, sizeof line, "  peak memory    %.3f MiB on the most loaded rank (model %.3f MiB):",
                peak * 1024, predicted.peak_memory_gib * 1024);
  out << line;
  for (size_t r = 0; r < m.peak_memory_gib.size(); ++r) {
    std::snprintf(line, sizeof line, " r%zu=%.3f", r, m.peak_memory_gib[r] * 1024);
    out << line;
  }
  out << " MiB\n";
  if (!m.notes.empty()) out << "  note           " << m.notes << "\n";
}

}  // namespace

device::Group StartMpiWorld(const ClusterSpec& cluster) {
  EnsureMpi();
  const int world_size = MpiWorldSize();
  if (world_size != cluster.world_size()) {
    throw InputError("--nnodes", "--nnodes × --nproc-per-node = " +
                                     std::to_string(cluster.world_size()) +
                                     " but mpirun started " + std::to_string(world_size) +
                                     " ranks");
  }
  auto world = device::Group::World();
  if (!world.ok()) throw std::runtime_error(world.status().ToString());
  return std::move(*world);
}

RankWorker StartRankWorker(const std::string& name, const ClusterSpec& cluster,
                           device::P2PSemantics p2p_semantics) {
  device::Group world = StartMpiWorld(cluster);
  auto device =
      trial::MakePlatform(name, static_cast<size_t>(cluster.gpu.memory_gib * kGiB),
                          world.rank() % static_cast<int>(cluster.gpus_per_node), p2p_semantics);
  if (!device.ok()) throw InputError("--backend", device.status().message());
  return {std::move(world), std::move(*device)};
}

int RunTrialCommand(const std::vector<std::string>& argv_in, std::ostream& out,
                    std::ostream& err) {
  Args args(WithCpuBackendDefaults(argv_in), "trial");
  const auto spec = args.Value("--config");
  WorkerFlags flags = ReadWorkerFlags(args);
  Inputs in = ReadInputs(args);
  ApplyBackend(flags.backend, in);
  if (!spec) throw InputError("--config", "required: a SPEC such as tp=2,pp=2,mbs=1");
  RankWorker worker = StartRankWorker(flags.backend, in.cluster, flags.p2p_semantics);
  const ParallelConfig c = Complete(ParseSpec(*spec), worker.world.size());
  const int rank = worker.world.rank();
  SetStackOptions(in.constants.stack, flags.options);
  const trial::TrialMeasurement m =
      trial::RunTrial(*worker.platform, worker.world, in.model, in.train, c, flags.options);
  // Every rank holds the agreed outcome; rank 0 reports it, in its output and its exit status.
  // The others exit 0: one that exited non-zero first would make mpirun kill rank 0 before it
  // has printed the result.
  if (rank != 0) return kExitOk;
  const CostModel model(in.model, in.train, in.cluster, in.constants);
  PrintTrial(out, in.format, c, in, flags.backend, m, model.Evaluate(c));
  return m.outcome == device::Outcome::kOk ? kExitOk : kExitFailure;
}

int RunProbeCommand(const std::vector<std::string>& argv_in, std::ostream& out,
                    std::ostream& err) {
  Args args(WithCpuBackendDefaults(argv_in), "probe");
  WorkerFlags flags = ReadWorkerFlags(args);
  const int64_t repetitions = args.Int("--repetitions", 5);
  Inputs in = ReadInputs(args);
  ApplyBackend(flags.backend, in);
  RankWorker worker = StartRankWorker(flags.backend, in.cluster, flags.p2p_semantics);
  const int rank = worker.world.rank();
  const CostModel cost(in.model, in.train, in.cluster, in.constants);
  trial::ProbeOptions options;
  options.repetitions = static_cast<int>(repetitions);
  options.tp_values = in.space.tp;
  trial::ProbeOverheads overheads;
  auto samples = trial::RunProbe(*worker.platform, worker.world, in.model, in.train, in.cluster,
                                 cost, options, &overheads);
  if (!samples.ok()) {
    err << "autopar-tune probe: " << samples.status().ToString() << "\n";
    return kExitFailure;
  }
  if (rank != 0) return kExitOk;
  const auto ratios = trial::ProbeRatios(*samples);
  if (in.format == Format::kJson) {
    JsonWriter j(out);
    j.BeginObject().Key("samples").BeginArray();
    for (const trial::ProbeSample& s : *samples) {
      j.BeginObject().Field("name", s.name).Field("feature", std::string(FeatureName(s.feature)));
      j.Field("measured_s", s.measured_s).Field("predicted_s", s.predicted_s).EndObject();
    }
    j.EndArray().Key("ratios").BeginObject();
    for (int k = 0; k < kNumFeatures; ++k) j.Field(FeatureName(k), ratios[k]);
    j.EndObject();
    // Measured values of what the analytic model takes as constants (runtime_overhead_gib).
    j.Key("overheads").BeginObject();
    j.Field("non_tensor_memory_gib", overheads.non_tensor_gib);
    j.Field("comm_setup_first_s", overheads.comm_setup_first_s);
    j.Field("comm_setup_cached_s", overheads.comm_setup_cached_s);
    j.EndObject().EndObject();
    out << "\n";
    return kExitOk;
  }
  char line[160];
  std::snprintf(line, sizeof line, "%-28s %-13s %12s %12s %8s\n", "probe", "feature",
                "measured_s", "model_s", "ratio");
  out << line;
  for (const trial::ProbeSample& s : *samples) {
    std::snprintf(line, sizeof line, "%-28s %-13s %12.6f %12.6f %8.3f\n", s.name.c_str(),
                  FeatureName(s.feature), s.measured_s, s.predicted_s, s.measured_s / s.predicted_s);
    out << line;
  }
  out << "measured / model per feature:";
  for (int k = 0; k < kNumFeatures; ++k) {
    if (ratios[k] != 1.0) {
      std::snprintf(line, sizeof line, " %s=%.3f", FeatureName(k), ratios[k]);
      out << line;
    }
  }
  out << "\n";
  std::snprintf(line, sizeof line,
                "device memory besides tensors: %.3f GiB (runtime_overhead_gib; the model "
                "assumes %.3f)\n",
                overheads.non_tensor_gib, in.constants.mem.runtime_overhead_gib);
  out << line;
  std::snprintf(line, sizeof line, "communicator set-up: %.6f s first, %.6f s again (cached)\n",
                overheads.comm_setup_first_s, overheads.comm_setup_cached_s);
  out << line;
  return kExitOk;
}

}  // namespace autopar::cli

#endif  // AUTOPAR_WITH_TRIALS
