// The real trial backends of `tune` (--backend cpu|cuda): the coordinator/worker protocol of
// include/autopar/coord/protocol.h over MPI, with every rank's share of a trial run by the
// trial runner (src/trial).
#if defined(AUTOPAR_WITH_TRIALS)

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>

#include "autopar/cli/tune.h"
#include "autopar/common/errors.h"
#include "autopar/coord/convert.h"
#include "autopar/coord/protocol.h"
#include "autopar/coord/study.h"
#include "autopar/spec/units.h"
#include "autopar/trial/probe.h"
#include "autopar/trial/trial.h"
#include "src/cli/mpi_channel.h"
#include "src/cli/rank_worker.h"

namespace autopar::cli {
namespace {

pb::TrialStatus ToStatus(device::Outcome o) {
  switch (o) {
    case device::Outcome::kOk:
      return pb::OK;
    case device::Outcome::kOom:
      return pb::OOM;
    case device::Outcome::kTimeout:
      return pb::TIMEOUT;
    case device::Outcome::kCommError:
      return pb::COMM_ERROR;
    case device::Outcome::kDeviceError:
      return pb::DEVICE_ERROR;
    case device::Outcome::kNonfinite:
      return pb::NONFINITE;
    case device::Outcome::kInvalid:
      return pb::INVALID;
  }
  return pb::INVALID;
}

// One rank's work: the trial runner on this rank's platform, over the world group.
class TrialRankRunner : public coord::RankRunner {
 public:
  TrialRankRunner(const TuneContext& context, device::Group world,
                  std::unique_ptr<device::Platform> platform)
      : in_(context.inputs), world_(std::move(world)), platform_(std::move(platform)) {}

  pb::HostFacts Facts() override {
    pb::HostFacts f;
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown");
    f.set_rank(world_.rank());
    f.set_hostname(host);
    f.set_pid(getpid());
    f.set_local_rank(world_.rank() % static_cast<int>(in_.cluster.gpus_per_node));
    f.set_device(std::string(platform_->name()));
    f.set_device_memory_gib(static_cast<double>(platform_->device().budget_bytes()) / kGiB);
    return f;
  }

  pb::ProbeResult Probe(const pb::ProbeRequest& request) override {
    pb::ProbeResult r;
    r.set_rank(world_.rank());
    const CostModel cost(in_.model, in_.train, in_.cluster, in_.constants);
    trial::ProbeOptions options;
    options.repetitions = std::max(1, request.timed_iterations());
    options.tp_values = in_.space.tp;
    trial::ProbeOverheads overheads;
    auto samples = trial::RunProbe(*platform_, world_, in_.model, in_.train, in_.cluster, cost,
                                   options, &overheads);
    if (!samples.ok()) {
      r.set_status(ToStatus(samples.status().outcome()));
      r.set_message(samples.status().ToString());
      return r;
    }
    r.set_status(pb::OK);
    r.set_non_tensor_gib(overheads.non_tensor_gib);
    for (const trial::ProbeSample& s : *samples) {
      pb::ProbeMeasurement* m = r.add_measurements();
      m->set_name(s.name);
      m->set_feature(FeatureName(s.feature));
      m->set_measured_s(s.measured_s);
      m->set_predicted_s(s.predicted_s);
    }
    return r;
  }

  pb::RankTrialResult RunTrial(const pb::TrialRequest& request) override {
    MaybeDie(request);
    trial::TrialOptions options;
    options.timeout_s = request.deadline_s() > 0 ? request.deadline_s() : 600;
    options.warmup_iterations = request.warmup_iterations();
    options.timed_iterations = std::max(1, request.timed_iterations());
    options.min_timed_s = std::max(0.0, request.min_timed_s());
    SetStackOptions(in_.constants.stack, options);
    if (const char* stall = std::getenv("AUTOPAR_TEST_STALL_RANK")) {
      options.stall_rank = std::atoi(stall);
    }
    const ParallelConfig c = coord::FromProto(request.config());
    const auto start = std::chrono::steady_clock::now();
    const trial::TrialMeasurement m =
        trial::RunTrial(*platform_, world_, in_.model, in_.train, c, options);
    pb::RankTrialResult r;
    r.set_rank(world_.rank());
    r.set_status(ToStatus(m.outcome));
    r.set_message(m.message);
    for (double t : m.iteration_times_s) r.add_iteration_times_s(t);
    if (static_cast<size_t>(world_.rank()) < m.peak_memory_gib.size()) {
      r.set_peak_memory_gib(m.peak_memory_gib[world_.rank()]);
    }
    r.set_wall_s(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return r;
  }

 private:
  // Fault-test hook: AUTOPAR_TEST_KILL_RANK=r and AUTOPAR_TEST_KILL_AFTER_TRIALS=n make rank r
  // die (SIGKILL, as a crashed node would) when it starts trial n's first attempt.
  void MaybeDie(const pb::TrialRequest& request) const {
    const char* rank = std::getenv("AUTOPAR_TEST_KILL_RANK");
    const char* after = std::getenv("AUTOPAR_TEST_KILL_AFTER_TRIALS");
    if (rank && after && std::atoi(rank) == world_.rank() && request.attempt() <= 1 &&
        request.trial_index() == std::atoll(after)) {
      std::fprintf(stderr, "autopar-tune: test hook: rank %d dies in trial %lld\n", world_.rank(),
                   static_cast<long long>(request.trial_index()));
      std::fflush(stderr);
      raise(SIGKILL);
    }
  }

  const Inputs& in_;
  device::Group world_;
  std::unique_ptr<device::Platform> platform_;
};

std::unique_ptr<coord::TrialBackend> MakeMpiTrialBackend(const TuneContext& context) {
  const Inputs& in = context.inputs;
  RankWorker worker = StartRankWorker(context.backend, in.cluster, context.p2p_semantics);
  auto make_runner = [&](device::Group trials) {
    return std::make_unique<TrialRankRunner>(context, std::move(trials),
                                             std::move(worker.platform));
  };
  return CoordinateOrServe(std::move(worker.world), in.cluster, coord::Fingerprint(context.study),
                           make_runner, "mpi");
}

}  // namespace

void RegisterMpiTrialBackends() {
  RegisterTrialBackend("cpu", MakeMpiTrialBackend);
  RegisterTrialBackend("cuda", MakeMpiTrialBackend);
  RegisterTrialBackend("megatron", MakeMegatronBackend);
}

}  // namespace autopar::cli

#else

namespace autopar::cli {
void RegisterMpiTrialBackends() {}
}  // namespace autopar::cli

#endif  // AUTOPAR_WITH_TRIALS
