// RunTrial: set-up, the timed iterations and the agreement of all ranks on the outcome.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <thread>

#include "autopar/device/timer.h"
#include "autopar/spec/units.h"
#include "autopar/trial/schedule.h"
#include "autopar/trial/trial.h"
#include "src/trial/program.h"

namespace autopar::trial {
namespace {

using device::OkStatus;
using device::Outcome;

// After the deadline, ranks still get this long to agree on the outcome.
constexpr double kAgreementGraceS = 3.0;

// The buffers of all-reduces abandoned at their deadline. MPI cannot cancel a collective and may
// still complete one into its buffers later (ASan caught a write into a freed vector), so they
// live as long as the process: a few doubles per trial that timed out.
std::vector<std::unique_ptr<std::vector<double>>>& AbandonedBuffers() {
  static std::vector<std::unique_ptr<std::vector<double>>> buffers;
  return buffers;
}

// A host-side all-reduce of doubles on the world communicator, bounded by a deadline: the
// control data of a trial (times, losses, outcomes) never waits forever for a stalled peer.
Status HostAllReduce(std::vector<double>& values, MPI_Op op, MPI_Comm comm, Deadline deadline) {
  MPI_Request request;
  const size_t n = values.size();
  auto buffers = std::make_unique<std::vector<double>>(2 * n);  // send, then receive
  std::copy(values.begin(), values.end(), buffers->begin());
  double* const in = buffers->data();
  double* const out = in + n;
  int rc = MPI_Iallreduce(in, out, static_cast<int>(n), MPI_DOUBLE, op, comm, &request);
  if (rc != MPI_SUCCESS) return Status(Outcome::kCommError, "MPI_Iallreduce failed");
  for (;;) {
    int done = 0;
    rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return Status(Outcome::kCommError, "MPI_Test failed");
    if (done) {
      std::copy(out, out + n, values.begin());
      return OkStatus();
    }
    if (std::chrono::steady_clock::now() > deadline) {
      AbandonedBuffers().push_back(std::move(buffers));
      return Status(Outcome::kTimeout, "a peer did not join the trial's control all-reduce");
    }
    std::this_thread::yield();
  }
}

// Which outcome wins when ranks disagree: the root cause over its consequences (a rank that ran
// out of memory makes its peers time out waiting for it).
int Severity(Outcome o) {
  switch (o) {
    case Outcome::kOk: return 0;
    case Outcome::kTimeout: return 1;
    case Outcome::kCommError: return 2;
    case Outcome::kNonfinite: return 3;
    case Outcome::kDeviceError: return 4;
    case Outcome::kInvalid: return 5;
    case Outcome::kOom: return 6;
  }
  return 0;
}
Outcome FromSeverity(int s) {
  constexpr Outcome kBySeverity[] = {Outcome::kOk, Outcome::kTimeout, Outcome::kCommError,
                                     Outcome::kNonfinite, Outcome::kDeviceError,
                                     Outcome::kInvalid, Outcome::kOom};
  return kBySeverity[std::clamp(s, 0, 6)];
}

std::string Validate(const device::Group& world, const Device& dev, const ModelSpec& m,
                     const TrainSpec& t, const ParallelConfig& c) {
  if (world.size() != c.world_size()) {
    return "the configuration needs " + std::to_string(c.world_size()) + " ranks, the job has " +
           std::to_string(world.size());
  }
  if (const std::string split = StageSplitError(c, m.num_layers); !split.empty()) {
    return "--config: the pipeline stages: " + split;
  }
  if (t.global_batch_size % (int64_t{c.dp} * c.mbs) != 0) return "dp·mbs must divide the batch";
  if (std::string fp8 =
          Fp8Unsupported(t.precision == Precision::kFP8, dev.SupportsFp8(), dev.name());
      !fp8.empty()) {
    return fp8;
  }
  if (c.fp8_param_gather) {
    return "fp8_param_gather=on: the trial keeps 16-bit parameters (plan and predict model FP8 "
           "parameters; --backend megatron runs them)";
  }
  if (m.num_attention_heads % c.tp != 0 || m.ffn_hidden_size % c.tp != 0) {
    return "tp must divide the heads and the MLP width";
  }
  if (c.sp && c.tp == 1) return "sp=on needs tp > 1";
  const int64_t m_job = t.global_batch_size / (int64_t{c.dp} * c.mbs);
  if (c.vpp > 1 && m_job % c.pp != 0) return "the interleaved schedule needs m % pp == 0";
  return Unsupported(m, t, c);
}

Deadline After(Deadline from, double seconds) {
  return from + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(seconds));
}

// What one rank measured, before the ranks agree.
struct RankSamples {
  std::vector<double> pipeline_s, tail_s, loss_sums, aux_sums;  // per iteration
  std::pair<double, double> fingerprint{0, 0};
  std::pair<int, int> overlapped{0, 0};  // the data-parallel overlap's buckets, last iteration
};

// What a rank's iterations run on, once it is set up.
struct RankRun {
  Device& dev;
  const device::Group& world;
  ProcessGroups& groups;
  ModelShard& shard;
  StageProgram& program;
  const std::vector<PipelineOp>& ops;
  const std::vector<std::vector<PipelineTransfer>>& exchanges;
  const TrialOptions& options;
  int microbatches;
  Deadline deadline;
};

// Agree that every rank could allocate its footprint (`mine`: this rank's set-up) before anyone
// starts communicating.
Status AgreeOnSetUp(const Status& mine, const device::Group& world, Deadline deadline) {
  std::vector<double> setup = {
      static_cast<double>(Severity(mine.ok() ? Outcome::kOk : mine.outcome()))};
  AUTOPAR_RETURN_IF_ERROR(HostAllReduce(setup, MPI_MAX, world.comm(), deadline));
  if (!mine.ok()) return mine;
  if (setup[0] > 0) {
    return Status(FromSeverity(static_cast<int>(setup[0])), "another rank failed its set-up");
  }
  return OkStatus();
}

// One iteration, the `step`-th: the schedule's ops and the flush timed as the pipeline part,
// then the gradient reductions and Adam as the tail.
Status RunIteration(const RankRun& run, int step, RankSamples& samples) {
  if (run.options.stall_rank == run.world.rank()) {
    // Test hook: a worker that stops making progress (a hung kernel, a lost peer).
    while (std::chrono::steady_clock::now() < run.deadline) std::this_thread::yield();
    return Status(Outcome::kTimeout, "stalled by the test hook");
  }
  AUTOPAR_RETURN_IF_ERROR(run.shard.BeginStep(run.dev, run.microbatches));
  AUTOPAR_RETURN_IF_ERROR(run.dev.Synchronize());
  // Every rank starts the iteration together, so no rank's time includes waiting for a late
  // peer's previous iteration (the max over ranks is the step).
  std::vector<double> barrier = {0};
  AUTOPAR_RETURN_IF_ERROR(HostAllReduce(barrier, MPI_MAX, run.world.comm(), run.deadline));
  device::WallTimer timer;
  for (size_t k = 0; k < run.ops.size(); ++k) {
    const PipelineOp& op = run.ops[k];
    AUTOPAR_RETURN_IF_ERROR(run.program.Exchange(run.exchanges[k]));
    AUTOPAR_RETURN_IF_ERROR(op.kind == PipelineOp::kForward
                                ? run.program.Forward(op.microbatch, op.chunk)
                                : run.program.Backward(op.microbatch, op.chunk));
  }
  AUTOPAR_RETURN_IF_ERROR(run.program.Exchange(run.exchanges.back()));
  AUTOPAR_RETURN_IF_ERROR(run.dev.Synchronize());
  const double pipeline = timer.Seconds();
  AUTOPAR_RETURN_IF_ERROR(
      run.shard.Step(run.dev, run.groups, run.options.learning_rate, run.options.adam_eps, step));
  AUTOPAR_RETURN_IF_ERROR(run.dev.Synchronize());
  const double loss = run.program.TakeLossSum();
  if (!std::isfinite(loss)) return Status(Outcome::kNonfinite, "the loss is not finite");
  samples.pipeline_s.push_back(pipeline);
  samples.tail_s.push_back(timer.Seconds() - pipeline);
  samples.loss_sums.push_back(run.groups.at.tp == 0 ? loss : 0.0);
  samples.aux_sums.push_back(run.program.TakeAuxLoss());  // counted on one rank per sample already
  return OkStatus();
}

// How many more iterations make the timed ones last min_timed_s (the ranks agree on the max of
// their timed totals), within kMaxTimedIterations.
StatusOr<int> IterationsForMinTime(const RankRun& run, const RankSamples& samples) {
  const TrialOptions& options = run.options;
  std::vector<double> timed = {0};
  for (size_t i = options.warmup_iterations; i < samples.pipeline_s.size(); ++i) {
    timed[0] += samples.pipeline_s[i] + samples.tail_s[i];
  }
  AUTOPAR_RETURN_IF_ERROR(HostAllReduce(timed, MPI_MAX, run.world.comm(), run.deadline));
  return ExtraTimedIterations(timed[0], options);
}

// The warm-up and timed iterations, extended once if min_timed_s asks for more.
Status RunIterations(const RankRun& run, RankSamples& samples) {
  const TrialOptions& options = run.options;
  int iterations = options.warmup_iterations + options.timed_iterations;
  bool extended = false;
  for (int it = 0; it < iterations; ++it) {
    AUTOPAR_RETURN_IF_ERROR(RunIteration(run, it + 1, samples));
    if (it + 1 == iterations && !extended && options.min_timed_s > 0) {
      extended = true;
      AUTOPAR_ASSIGN_OR_RETURN(const int more, IterationsForMinTime(run, samples));
      iterations += more;
    }
  }
  return OkStatus();
}

// This rank's part of the trial: its groups, shard and program, then the iterations. Everything
// that allocates lives in here, so it is all freed before the agreement. `released`: how the
// device's ReleaseCachedMemory went, agreed on with the set-up (every rank takes part in the
// collectives before it, so none is left waiting in them).
Status RunOnRank(device::Platform& platform, const device::Group& world, const ModelSpec& model,
                 const TrainSpec& train, const ParallelConfig& c, const TrialOptions& options,
                 int run_microbatches, Deadline deadline, const Status& released,
                 RankSamples& samples) {
  Device& dev = platform.device();
  AUTOPAR_ASSIGN_OR_RETURN(
      ProcessGroups groups,
      ProcessGroups::Create(platform, world, c, deadline,
                            UsedGroups(c, model.is_moe(), !model.untie_embeddings)));
  const Shapes shapes = Shapes::Of(model, train, c, groups.at);
  const std::vector<PipelineOp> ops = PipelineSchedule(c.pp, c.vpp, groups.at.pp, run_microbatches);
  const std::vector<std::vector<PipelineTransfer>> exchanges =
      PipelineExchanges(c.pp, c.vpp, groups.at.pp, ops);
  AUTOPAR_ASSIGN_OR_RETURN(
      ModelShard shard,
      ModelShard::Create(dev, model, shapes, c, groups.at, options.seed, options.ddp_bucket_size));
  if (options.weight_perturbation != 0) {
    AUTOPAR_RETURN_IF_ERROR(shard.Perturb(dev, options.seed, options.weight_perturbation));
  }
  DataSpec data;
  data.seed = options.seed ^ 0xDA7Aull;
  data.samples_per_replica = train.global_batch_size / c.dp;
  data.tokens_per_step = static_cast<double>(run_microbatches) * c.mbs * train.seq_length * c.dp;
  data.hidden_dropout = options.hidden_dropout;
  data.moe_force_load_balancing = options.moe_force_load_balancing;
  auto program_or = StageProgram::Create(dev, shapes, c, groups, shard, data,
                                         SlotsBySize(ops, shapes.chunk_layers));
  AUTOPAR_RETURN_IF_ERROR(
      AgreeOnSetUp(released.ok() ? program_or.status() : released, world, deadline));
  const RankRun run{dev,       world,   groups,           shard,   **program_or, ops,
                    exchanges, options, run_microbatches, deadline};
  AUTOPAR_RETURN_IF_ERROR(RunIterations(run, samples));
  samples.overlapped = {shard.grad_buckets_overlapped(), shard.param_buckets_overlapped()};
  if (options.fingerprint) {
    AUTOPAR_ASSIGN_OR_RETURN(samples.fingerprint, shard.Fingerprint(dev, groups, options.seed));
  }
  return OkStatus();
}

// The device's waits end by the trial's deadline while the trial runs (Device::SetDeadline), so no
// rank outlives it inside the device (the agreement waits deadline + grace, no longer), and by
// their own bound again after it (probe, the next trial's set-up).
class DeviceDeadline {
 public:
  DeviceDeadline(Device& dev, Deadline deadline) : dev_(dev) { dev_.SetDeadline(deadline); }
  ~DeviceDeadline() { dev_.SetDeadline(Deadline::max()); }
  DeviceDeadline(const DeviceDeadline&) = delete;
  DeviceDeadline& operator=(const DeviceDeadline&) = delete;

 private:
  Device& dev_;
};

// Every rank agrees on the outcome: the most severe wins. False, with `out` filled, unless ok.
bool AgreeOnOutcome(const Status& status, const device::Group& world, Deadline grace,
                    TrialMeasurement& out) {
  std::vector<double> verdict = {static_cast<double>(Severity(status.outcome()))};
  if (Status s = HostAllReduce(verdict, MPI_MAX, world.comm(), grace); !s.ok()) {
    out.outcome = s.outcome();
    out.message = s.ToString();
    return false;
  }
  out.outcome = FromSeverity(static_cast<int>(verdict[0]));
  if (out.outcome != Outcome::kOk) {
    out.message = status.ok() ? std::string("another rank failed: ") + OutcomeName(out.outcome)
                              : status.ToString();
    return false;
  }
  return true;
}

// This rank's peak memory in GiB above `baseline`. Training sees the device's whole use: the
// trial's tensors plus what the runtime holds besides them (CUDA context, library workspaces,
// NCCL buffers; 0 on the CPU platform). Every rank goes on to the agreement whatever happens
// here, so a failed reading is noted in `notes` (after the attention engine's note) rather than
// returned.
double PeakMemoryGib(Device& dev, size_t baseline, std::string& notes) {
  StatusOr<size_t> non_tensor = dev.NonTensorBytes();
  const double peak =
      static_cast<double>(dev.peak_bytes() - baseline + (non_tensor.ok() ? *non_tensor : 0)) / kGiB;
  notes = dev.AttentionEngineNote();
  if (!non_tensor.ok()) {
    notes += (notes.empty() ? "" : "; ") + std::string("non-tensor memory unmeasured: ") +
             non_tensor.status().ToString();
  }
  return peak;
}

// The figures the ranks agree on: per-rank peaks (summed), per-iteration extrapolated step times
// (max), and the sums of [weight sum, weight projection, aux loss, per-iteration losses...,
// gradient buckets overlapped, parameter buckets overlapped].
struct Figures {
  std::vector<double> peaks, step, sums;
};

// This rank's figures, before the agreement.
Figures FiguresOf(Device& dev, size_t baseline, const device::Group& world, const ParallelConfig& c,
                  int run_microbatches, int job_microbatches, const RankSamples& samples,
                  std::string& notes) {
  Figures f;
  f.peaks.assign(world.size(), 0.0);
  f.peaks[world.rank()] = PeakMemoryGib(dev, baseline, notes);
  for (size_t i = 0; i < samples.pipeline_s.size(); ++i) {
    f.step.push_back(ExtrapolateStepTime(samples.pipeline_s[i], samples.tail_s[i], c.pp, c.vpp,
                                         run_microbatches, job_microbatches));
  }
  f.sums = {samples.fingerprint.first, samples.fingerprint.second,
            samples.aux_sums.empty() ? 0.0 : samples.aux_sums[0]};
  f.sums.insert(f.sums.end(), samples.loss_sums.begin(), samples.loss_sums.end());
  const bool reporter = world.rank() == 0;  // the first pipeline stage, where Megatron buckets
  f.sums.push_back(reporter ? samples.overlapped.first : 0);
  f.sums.push_back(reporter ? samples.overlapped.second : 0);
  return f;
}

Status AgreeOnFigures(Figures& f, const device::Group& world, Deadline grace) {
  Status agree = HostAllReduce(f.peaks, MPI_SUM, world.comm(), grace);
  if (agree.ok()) agree = HostAllReduce(f.step, MPI_MAX, world.comm(), grace);
  if (agree.ok()) agree = HostAllReduce(f.sums, MPI_SUM, world.comm(), grace);
  return agree;
}

// The agreed figures into `out`; `tokens_run` is the tokens of one iteration's micro-batches.
void Report(const Figures& f, int warmup_iterations, const TrainSpec& train, double tokens_run,
            TrialMeasurement& out) {
  out.peak_memory_gib = f.peaks;
  out.iteration_times_s.assign(f.step.begin() + warmup_iterations, f.step.end());
  std::vector<std::vector<double>> per_iteration;
  for (double s : out.iteration_times_s) per_iteration.push_back({s});
  out.step_time_s = MedianOfMax(per_iteration);
  out.tokens_per_s = out.step_time_s > 0 ? static_cast<double>(train.global_batch_size) *
                                               train.seq_length / out.step_time_s
                                         : 0;
  out.weight_sum = f.sums[0];
  out.grad_buckets_overlapped = static_cast<int>(f.sums[f.sums.size() - 2]);
  out.param_buckets_overlapped = static_cast<int>(f.sums.back());
  out.weight_projection = f.sums[1];
  if (!f.step.empty()) {
    out.loss = f.sums[3] / tokens_run;
    out.aux_loss = f.sums[2];
  }
}

}  // namespace

int ExtraTimedIterations(double timed_s, const TrialOptions& options) {
  if (!(timed_s > 0) || timed_s >= options.min_timed_s || options.timed_iterations <= 0) return 0;
  const double per_iteration = timed_s / options.timed_iterations;
  const double more = std::ceil((options.min_timed_s - timed_s) / per_iteration);
  const int room = kMaxTimedIterations - options.timed_iterations;
  return std::max(0, more >= room ? room : static_cast<int>(more));
}

TrialMeasurement RunTrial(device::Platform& platform, const device::Group& world,
                          const ModelSpec& model, const TrainSpec& train,
                          const ParallelConfig& config, const TrialOptions& options) {
  TrialMeasurement out;
  const ParallelConfig& c = config;
  if (const std::string reason = Validate(world, platform.device(), model, train, c);
      !reason.empty()) {
    out.outcome = Outcome::kInvalid;
    out.message = reason;
    return out;
  }
  const Deadline deadline = After(std::chrono::steady_clock::now(), options.timeout_s);
  Device& dev = platform.device();
  const DeviceDeadline device_deadline(dev, deadline);
  // Workspaces an earlier trial grew (cuDNN's arena, the FP8 GEMM's) and the allocator's cache
  // go first: left in place they would sit in the baseline, counted in no trial's peak, and
  // hold memory this trial's tensors and communicators may need. A failure here (the device
  // timed out waiting, its communicators aborted) shows in the set-up agreement.
  const Status released = dev.ReleaseCachedMemory();
  const size_t baseline = dev.bytes_in_use();
  dev.ResetPeak();

  const int64_t job_microbatches = train.global_batch_size / (int64_t{c.dp} * c.mbs);
  const int run_microbatches =
      options.max_microbatches < 0
          ? static_cast<int>(job_microbatches)
          : TrialMicrobatches(c.pp, c.vpp, static_cast<int>(job_microbatches),
                              options.max_microbatches);
  out.microbatches_run = run_microbatches;
  out.microbatches_total = static_cast<int>(job_microbatches);

  RankSamples samples;
  const Status status = RunOnRank(platform, world, model, train, c, options, run_microbatches,
                                  deadline, released, samples);

  // ---- every rank agrees on the outcome and the figures ----
  const Deadline grace =
      After(std::max(deadline, std::chrono::steady_clock::now()), kAgreementGraceS);
  if (!AgreeOnOutcome(status, world, grace, out)) return out;
  Figures figures = FiguresOf(dev, baseline, world, c, run_microbatches,
                              static_cast<int>(job_microbatches), samples, out.notes);
  if (Status agree = AgreeOnFigures(figures, world, grace); !agree.ok()) {
    out.outcome = agree.outcome();
    out.message = agree.ToString();
    return out;
  }
  const double tokens_run = static_cast<double>(run_microbatches) * c.mbs * train.seq_length * c.dp;
  Report(figures, options.warmup_iterations, train, tokens_run, out);
  return out;
}

}  // namespace autopar::trial
