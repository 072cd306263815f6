// RunTrial: set-up, the timed iterations and the agreement of all ranks on the outcome.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <thread>

#include "autopar/backend/timer.h"
#include "autopar/trial/schedule.h"
#include "autopar/trial/trial.h"
#include "src/trial/program.h"

namespace autopar::trial {
namespace {

using backend::OkStatus;
using backend::Outcome;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
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

std::string Validate(const backend::Group& world, const Device& dev, const ModelSpec& m,
                     const TrainSpec& t, const ParallelConfig& c) {
  if (world.size() != c.world_size()) {
    return "the configuration needs " + std::to_string(c.world_size()) + " ranks, the job has " +
           std::to_string(world.size());
  }
  if (const std::string split = StageSplitError(c, m.num_layers); !split.empty()) {
    return "--config: the pipeline stages: " + split;
  }
  if (t.global_batch_size % (int64_t{c.dp} * c.mbs) != 0) return "dp·mbs must divide the batch";
  if (const std::string fp8 = Fp8Unsupported(t.precision == Precision::kFP8, dev.SupportsFp8(),
                                              dev.name());
      !fp8.empty()) {
    return fp8;
  }
  if (m.num_attention_heads % c.tp != 0 || m.ffn_hidden_size % c.tp != 0) {
    return "tp must divide the heads and the MLP width";
  }
  if (c.sp && c.tp == 1) return "sp=on needs tp > 1";
  const int64_t m_job = t.global_batch_size / (int64_t{c.dp} * c.mbs);
  if (c.vpp > 1 && m_job % c.pp != 0) return "the interleaved schedule needs m % pp == 0";
  return Unsupported(m, t, c);
}

}  // namespace

TrialMeasurement RunTrial(backend::Backend& backend, const backend::Group& world,
                          const ModelSpec& model, const TrainSpec& train,
                          const ParallelConfig& config, const TrialOptions& options) {
  TrialMeasurement out;
  const ParallelConfig& c = config;
  if (const std::string reason = Validate(world, backend.device(), model, train, c);
      !reason.empty()) {
    out.outcome = Outcome::kInvalid;
    out.message = reason;
    return out;
  }
  const auto start = std::chrono::steady_clock::now();
  const Deadline deadline =
      start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                  std::chrono::duration<double>(options.timeout_s));
  Device& dev = backend.device();
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

  std::vector<double> pipeline_s, tail_s, loss_sums, aux_sums;
  std::pair<double, double> fingerprint{0, 0};
  std::pair<int, int> overlapped{0, 0};  // the data-parallel overlap's buckets, last iteration
  // Everything that allocates lives in this scope, so it is all freed before the agreement.
  Status status = [&]() -> Status {
    AUTOPAR_ASSIGN_OR_RETURN(ProcessGroups groups,
                             ProcessGroups::Create(backend, world, c, deadline,
                                                   UsedGroups(c, model.is_moe(),
                                                              !model.untie_embeddings)));
    const Shapes shapes = Shapes::Of(model, train, c, groups.at);
    const std::vector<PipelineOp> ops =
        PipelineSchedule(c.pp, c.vpp, groups.at.pp, run_microbatches);
    const std::vector<std::vector<PipelineTransfer>> exchanges =
        PipelineExchanges(c.pp, c.vpp, groups.at.pp, ops);
    AUTOPAR_ASSIGN_OR_RETURN(ModelShard shard, ModelShard::Create(dev, model, shapes, c, groups.at,
                                                                  options.seed,
                                                                  options.ddp_bucket_size));
    DataSpec data;
    data.seed = options.seed ^ 0xDA7Aull;
    data.samples_per_replica = train.global_batch_size / c.dp;
    data.tokens_per_step =
        static_cast<double>(run_microbatches) * c.mbs * train.seq_length * c.dp;
    auto program_or = StageProgram::Create(dev, shapes, c, groups, shard, data, MaxInFlight(ops));
    // Agree that every rank could allocate its footprint before anyone starts communicating.
    std::vector<double> setup = {
        static_cast<double>(Severity(program_or.ok() ? Outcome::kOk
                                                     : program_or.status().outcome()))};
    AUTOPAR_RETURN_IF_ERROR(HostAllReduce(setup, MPI_MAX, world.comm(), deadline));
    if (!program_or.ok()) return program_or.status();
    if (setup[0] > 0) {
      return Status(FromSeverity(static_cast<int>(setup[0])), "another rank failed its set-up");
    }
    StageProgram& program = **program_or;

    int iterations = options.warmup_iterations + options.timed_iterations;
    bool extended = false;
    for (int it = 0; it < iterations; ++it) {
      if (options.stall_rank == world.rank()) {
        // Test hook: a worker that stops making progress (a hung kernel, a lost peer).
        while (std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
        return Status(Outcome::kTimeout, "stalled by the test hook");
      }
      AUTOPAR_RETURN_IF_ERROR(shard.BeginStep(dev, run_microbatches));
      AUTOPAR_RETURN_IF_ERROR(dev.Synchronize());
      // Every rank starts the iteration together, so no rank's time includes waiting for a late
      // peer's previous iteration (the max over ranks is the step).
      std::vector<double> barrier = {0};
      AUTOPAR_RETURN_IF_ERROR(HostAllReduce(barrier, MPI_MAX, world.comm(), deadline));
      backend::WallTimer timer;
      for (size_t k = 0; k < ops.size(); ++k) {
        const PipelineOp& op = ops[k];
        AUTOPAR_RETURN_IF_ERROR(program.Exchange(exchanges[k]));
        AUTOPAR_RETURN_IF_ERROR(op.kind == PipelineOp::kForward
                                    ? program.Forward(op.microbatch, op.chunk)
                                    : program.Backward(op.microbatch, op.chunk));
      }
      AUTOPAR_RETURN_IF_ERROR(program.Exchange(exchanges.back()));
      AUTOPAR_RETURN_IF_ERROR(dev.Synchronize());
      const double pipeline = timer.Seconds();
      AUTOPAR_RETURN_IF_ERROR(shard.Step(dev, groups, options.learning_rate, options.adam_eps, it + 1));
      AUTOPAR_RETURN_IF_ERROR(dev.Synchronize());
      const double loss = program.TakeLossSum();
      if (!std::isfinite(loss)) return Status(Outcome::kNonfinite, "the loss is not finite");
      pipeline_s.push_back(pipeline);
      tail_s.push_back(timer.Seconds() - pipeline);
      loss_sums.push_back(groups.at.tp == 0 ? loss : 0.0);
      aux_sums.push_back(program.TakeAuxLoss());  // counted on one rank per sample already
      if (it + 1 == iterations && !extended && options.min_timed_s > 0) {
        extended = true;
        std::vector<double> timed = {0};
        for (size_t i = options.warmup_iterations; i < pipeline_s.size(); ++i) {
          timed[0] += pipeline_s[i] + tail_s[i];
        }
        AUTOPAR_RETURN_IF_ERROR(HostAllReduce(timed, MPI_MAX, world.comm(), deadline));
        if (timed[0] < options.min_timed_s && timed[0] > 0) {
          const double per_iteration = timed[0] / options.timed_iterations;
          const int more = static_cast<int>(
              std::ceil((options.min_timed_s - timed[0]) / per_iteration));
          iterations += std::max(0, std::min(more, kMaxTimedIterations - options.timed_iterations));
        }
      }
    }
    overlapped = {shard.grad_buckets_overlapped(), shard.param_buckets_overlapped()};
    if (options.fingerprint) {
      AUTOPAR_ASSIGN_OR_RETURN(fingerprint, shard.Fingerprint(dev, groups, options.seed));
    }
    return OkStatus();
  }();

  // ---- every rank agrees on the outcome and the figures ----
  const Deadline grace = std::max(deadline, std::chrono::steady_clock::now()) +
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(kAgreementGraceS));
  std::vector<double> verdict = {static_cast<double>(Severity(status.outcome()))};
  if (Status s = HostAllReduce(verdict, MPI_MAX, world.comm(), grace); !s.ok()) {
    out.outcome = s.outcome();
    out.message = s.ToString();
    return out;
  }
  out.outcome = FromSeverity(static_cast<int>(verdict[0]));
  if (out.outcome != Outcome::kOk) {
    out.message = status.ok() ? std::string("another rank failed: ") + OutcomeName(out.outcome)
                              : status.ToString();
    return out;
  }
  // Per-rank peaks, then per-iteration maxima of the extrapolated step time.
  const int ranks = world.size();
  std::vector<double> peaks(ranks, 0.0);
  // Training sees the device's whole use: the trial's tensors plus what the runtime holds besides
  // them (CUDA context, library workspaces, NCCL buffers; 0 on the CPU backend).
  // Every rank goes on to the agreement below whatever happens here, so a failed reading is
  // noted rather than returned.
  StatusOr<size_t> non_tensor = dev.NonTensorBytes();
  peaks[world.rank()] =
      static_cast<double>(dev.peak_bytes() - baseline + (non_tensor.ok() ? *non_tensor : 0)) /
      kGiB;
  out.notes = dev.AttentionEngineNote();
  if (!non_tensor.ok()) {
    out.notes += (out.notes.empty() ? "" : "; ") + std::string("non-tensor memory unmeasured: ") +
                 non_tensor.status().ToString();
  }
  const int iterations = static_cast<int>(pipeline_s.size());
  std::vector<double> step(iterations), losses = loss_sums;
  for (int i = 0; i < iterations; ++i) {
    step[i] = ExtrapolateStepTime(pipeline_s[i], tail_s[i], c.pp, c.vpp, run_microbatches,
                                  static_cast<int>(job_microbatches));
  }
  std::vector<double> sums = {fingerprint.first, fingerprint.second,
                              aux_sums.empty() ? 0.0 : aux_sums[0]};
  sums.insert(sums.end(), losses.begin(), losses.end());
  const bool reporter = world.rank() == 0;  // the first pipeline stage, where Megatron buckets
  sums.push_back(reporter ? overlapped.first : 0);
  sums.push_back(reporter ? overlapped.second : 0);
  Status agree = HostAllReduce(peaks, MPI_SUM, world.comm(), grace);
  if (agree.ok()) agree = HostAllReduce(step, MPI_MAX, world.comm(), grace);
  if (agree.ok()) agree = HostAllReduce(sums, MPI_SUM, world.comm(), grace);
  if (!agree.ok()) {
    out.outcome = agree.outcome();
    out.message = agree.ToString();
    return out;
  }
  out.peak_memory_gib = peaks;
  out.iteration_times_s.assign(step.begin() + options.warmup_iterations, step.end());
  std::vector<std::vector<double>> per_iteration;
  for (double s : out.iteration_times_s) per_iteration.push_back({s});
  out.step_time_s = MedianOfMax(per_iteration);
  out.tokens_per_s = out.step_time_s > 0 ? static_cast<double>(train.global_batch_size) *
                                               train.seq_length / out.step_time_s
                                         : 0;
  out.weight_sum = sums[0];
  out.grad_buckets_overlapped = static_cast<int>(sums[sums.size() - 2]);
  out.param_buckets_overlapped = static_cast<int>(sums.back());
  out.weight_projection = sums[1];
  if (iterations > 0) {
    const double tokens = static_cast<double>(run_microbatches) * c.mbs * train.seq_length * c.dp;
    out.loss = sums[3] / tokens;
    out.aux_loss = sums[2];
  }
  return out;
}

}  // namespace autopar::trial
