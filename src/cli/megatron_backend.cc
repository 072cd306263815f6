// `tune --backend megatron` (docs/trial.md §17): every rank runs the user's Megatron-LM training
// command as a child process for each trial, with the candidate's parallel flags, and reads the
// child's log. The coordinator/worker protocol is the same as the cpu/cuda backends'
// (include/autopar/coord/protocol.h); only the rank's share of a trial differs
// (MegatronRankRunner). The tuner's own processes open no GPU: the children own the devices.
#if defined(AUTOPAR_WITH_TRIALS)

#include <mpi.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "autopar/cli/megatron_command.h"
#include "autopar/cli/megatron_log.h"
#include "autopar/cli/plan_format.h"
#include "autopar/cli/tune.h"
#include "autopar/common/errors.h"
#include "autopar/coord/convert.h"
#include "autopar/coord/files.h"
#include "autopar/coord/protocol.h"
#include "autopar/coord/study.h"
#include "src/cli/child_process.h"
#include "src/cli/mpi_channel.h"
#include "src/cli/rank_worker.h"

extern char** environ;

namespace autopar::cli {
namespace {

constexpr double kPollS = 0.1;             // how often a rank looks at its child and agrees
constexpr double kKillGraceS = 5;          // SIGTERM → SIGKILL
constexpr double kStableTolerance = 0.01;  // MedianIsStable: 1%
constexpr int kMaxTimedFactor = 4;         // at most this many × --timed-iterations are run

void CheckMpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw coord::ChannelError(std::string(what) + " failed");
}

void SleepS(double s) {
  timespec t{0, static_cast<long>(s * 1e9)};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string HostName() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "localhost";
  return host;
}

// A port nobody listens on now: bind port 0, read what the kernel gave, close.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string what = std::strerror(errno);
    close(fd);
    throw std::runtime_error("bind/getsockname: " + what);
  }
  if (close(fd) != 0) throw std::runtime_error(std::string("close: ") + std::strerror(errno));
  return ntohs(addr.sin_port);
}

std::string ReadLog(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// What the ranks agree on each round (max over ranks).
enum Flag { kRunning, kFailed, kEnough, kTimedOut, kMemoryPending, kFlags };

// Whether Megatron-LM prints this rank's memory report: report_memory prints on data-parallel
// rank 0, and Megatron's rank order (tp, cp, ep, dp, pp from fastest) puts the data-parallel
// index at rank / (tp·cp) mod dp, its context size cp being our cp·up.
bool PrintsMemory(const ParallelConfig& c, int rank) {
  const int64_t inner = static_cast<int64_t>(c.tp) * c.cp * c.up;
  return c.dp <= 0 || (rank / inner) % c.dp == 0;
}

// Why the trial's children ended.
enum class Ending { kAllExited, kFailed, kEnough, kTimedOut };

class MegatronRankRunner : public coord::RankRunner {
 public:
  MegatronRankRunner(const TuneContext& context, device::Group trials)
      : context_(context), in_(context.inputs), trials_(std::move(trials)) {
    // MASTER_ADDR: rank 0's host, as every rank must name the same one.
    std::string host = trials_.rank() == 0 ? HostName() : std::string();
    uint64_t length = host.size();
    CheckMpi(MPI_Bcast(&length, 1, MPI_UINT64_T, 0, trials_.comm()), "MPI_Bcast(host)");
    host.resize(length);
    CheckMpi(MPI_Bcast(host.data(), static_cast<int>(length), MPI_CHAR, 0, trials_.comm()),
             "MPI_Bcast(host)");
    master_addr_ = host;
    InstallChildGroupSignalHandlers();
  }

  pb::HostFacts Facts() override {
    pb::HostFacts f;
    f.set_rank(trials_.rank());
    f.set_hostname(HostName());
    f.set_pid(getpid());
    f.set_local_rank(LocalRank());
    f.set_device("megatron");
    f.set_device_memory_gib(in_.cluster.gpu.memory_gib);
    return f;
  }

  // No micro-benchmarks: the prior stays the analytic model's.
  pb::ProbeResult Probe(const pb::ProbeRequest&) override {
    pb::ProbeResult r;
    r.set_rank(trials_.rank());
    r.set_status(pb::OK);
    return r;
  }

  pb::RankTrialResult RunTrial(const pb::TrialRequest& request) override;

 private:
  pb::RankTrialResult RunTrialOrThrow(const pb::TrialRequest& request);

 private:
  int LocalRank() const { return trials_.rank() % static_cast<int>(in_.cluster.gpus_per_node); }
  std::string TrialDir(const pb::TrialRequest& request) const {
    return context_.study_dir + "/trials/" + std::to_string(request.trial_index() + 1);
  }
  std::vector<std::string> Environment(const ParallelConfig& c, int port) const;
  std::string PrepareLog(const pb::TrialRequest& request) const;
  Ending Watch(ChildProcess& child, const std::string& log_path, const pb::TrialRequest& request,
               double start, double* startup_s);
  void ShareTimes(const MegatronLog& log, int warmup, double startup_s, pb::RankTrialResult* r);

  const TuneContext context_;  // a copy: rank 0's factory returns before the trials run
  const Inputs& in_;
  device::Group trials_;
  std::string master_addr_;
};

std::vector<std::string> MegatronRankRunner::Environment(const ParallelConfig& c, int port) const {
  const std::map<std::string, std::string> set = {
      {"RANK", std::to_string(trials_.rank())},
      {"WORLD_SIZE", std::to_string(trials_.size())},
      {"LOCAL_RANK", std::to_string(LocalRank())},
      {"LOCAL_WORLD_SIZE", std::to_string(in_.cluster.gpus_per_node)},
      {"MASTER_ADDR", master_addr_},
      {"MASTER_PORT", std::to_string(port)},
  };
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (set.count(name) == 0 && name != "CUDA_DEVICE_MAX_CONNECTIONS") env.push_back(entry);
    // The user's own CUDA_DEVICE_MAX_CONNECTIONS stays where Megatron does not need 1.
    if (name == "CUDA_DEVICE_MAX_CONNECTIONS" &&
        !NeedsOneDeviceConnection(c, context_.megatron_args)) {
      env.push_back(entry);
    }
  }
  for (const auto& [name, value] : set) env.push_back(name + "=" + value);
  if (NeedsOneDeviceConnection(c, context_.megatron_args)) {
    env.push_back("CUDA_DEVICE_MAX_CONNECTIONS=1");
  }
  return env;
}

// STUDY/trials/N/rank-R.log, a retry's earlier log kept as rank-R.attempt-K.log.
std::string MegatronRankRunner::PrepareLog(const pb::TrialRequest& request) const {
  const std::string dir = TrialDir(request);
  coord::MakeDirectory(dir);
  std::string path = dir + "/rank-" + std::to_string(trials_.rank()) + ".log";
  if (coord::FileExists(path)) {
    const std::string kept = dir + "/rank-" + std::to_string(trials_.rank()) + ".attempt-" +
                             std::to_string(std::max(1, request.attempt() - 1)) + ".log";
    if (std::rename(path.c_str(), kept.c_str()) != 0) {
      throw coord::IoError("rename", path, errno);
    }
  }
  return path;
}

// Until every child has exited, or one failed, or the median is stable, or the deadline: each
// rank looks at its own child and log, then all agree (MPI_Allreduce, max) on what happens.
// `*startup_s`: from the child's start until its log first showed an iteration (process start,
// imports, distributed initialisation, model build and the first iteration), to the poll's
// resolution; 0 while none.
Ending MegatronRankRunner::Watch(ChildProcess& child, const std::string& log_path,
                                 const pb::TrialRequest& request, double start, double* startup_s) {
  const int warmup = request.warmup_iterations();
  const int timed = std::max(1, request.timed_iterations());
  for (;;) {
    SleepS(kPollS);
    const std::optional<ChildExit> exit = child.Poll();
    const MegatronLog log = ParseMegatronLog(ReadLog(log_path));
    const std::vector<double> times = TimedIterationSeconds(log, warmup);
    if (*startup_s == 0 && !log.iteration_ms.empty()) *startup_s = Now() - start;
    std::array<int, kFlags> mine{};
    mine[kRunning] = exit ? 0 : 1;
    mine[kFailed] = (exit && !exit->ok()) || log.out_of_memory || log.nonfinite_loss;
    mine[kEnough] =
        MedianIsStable(times, timed, kStableTolerance) ||
        times.size() >= static_cast<size_t>(kMaxTimedFactor) * static_cast<size_t>(timed);
    mine[kTimedOut] = Now() - start > request.deadline_s();
    // A stable median stops the children only once every memory report is in.
    mine[kMemoryPending] = !exit && log.max_reserved_mb == 0 &&
                           PrintsMemory(coord::FromProto(request.config()), trials_.rank());
    std::array<int, kFlags> all{};
    CheckMpi(MPI_Allreduce(mine.data(), all.data(), kFlags, MPI_INT, MPI_MAX, trials_.comm()),
             "MPI_Allreduce(trial state)");
    if (all[kFailed]) return Ending::kFailed;
    if (all[kTimedOut]) return Ending::kTimedOut;
    if (!all[kRunning]) return Ending::kAllExited;
    if (all[kEnough] && !all[kMemoryPending]) return Ending::kEnough;
  }
}

// Only the last rank prints iteration lines: the rank with the most timed iterations sends its
// times, start-up and throughput to all, so every rank reports the same.
void MegatronRankRunner::ShareTimes(const MegatronLog& log, int warmup, double startup_s,
                                    pb::RankTrialResult* r) {
  const std::vector<double> times = TimedIterationSeconds(log, warmup);
  struct {
    int count;
    int rank;
  } mine{static_cast<int>(log.iteration_ms.size()), trials_.rank()}, best{};
  CheckMpi(MPI_Allreduce(&mine, &best, 1, MPI_2INT, MPI_MAXLOC, trials_.comm()),
           "MPI_Allreduce(iterations)");
  std::vector<double> packet;
  if (trials_.rank() == best.rank) {
    std::vector<double> tflops(
        log.tflops_per_gpu.begin() + std::min<long>(warmup, log.tflops_per_gpu.size()),
        log.tflops_per_gpu.end());
    packet = {startup_s, tflops.empty() ? 0.0 : MedianOf(tflops)};
    packet.insert(packet.end(), times.begin(), times.end());
  }
  int size = static_cast<int>(packet.size());
  CheckMpi(MPI_Bcast(&size, 1, MPI_INT, best.rank, trials_.comm()), "MPI_Bcast(times)");
  packet.resize(size);
  CheckMpi(MPI_Bcast(packet.data(), size, MPI_DOUBLE, best.rank, trials_.comm()),
           "MPI_Bcast(times)");
  if (best.count == 0 || size < 2) return;
  r->set_startup_s(packet[0]);
  r->set_tflops_per_gpu(packet[1]);
  for (size_t i = 2; i < packet.size(); ++i) r->add_iteration_times_s(packet[i]);
}

// The rank's outcome: what its log says first (root causes), then how its child ended: by
// itself, or `killed` by this rank at the agreed `ending`.
void SetOutcome(const MegatronLog& log, const ChildExit& exit, bool killed, Ending ending,
                pb::RankTrialResult* r) {
  auto set = [&](pb::TrialStatus s, const std::string& m) {
    r->set_status(s);
    r->set_message(m);
  };
  if (log.out_of_memory) return set(pb::OOM, "out of memory: " + log.error_tail);
  if (log.nonfinite_loss) return set(pb::NONFINITE, "non-finite loss " + log.error_tail);
  if (log.python_error) return set(pb::INVALID, "python error:\n" + log.error_tail);
  if (!killed) {
    if (exit.ok()) return set(pb::OK, "");
    return set(pb::DEVICE_ERROR, "the training process ended with " + exit.Describe());
  }
  switch (ending) {
    case Ending::kTimedOut:
      return set(pb::TIMEOUT, "the trial passed its deadline; every child's group was killed");
    case Ending::kEnough:
      return set(pb::OK, "");
    case Ending::kFailed:
    case Ending::kAllExited:
      break;
  }
  return set(pb::COMM_ERROR, "killed: another rank's training process failed");
}

pb::RankTrialResult MegatronRankRunner::RunTrial(const pb::TrialRequest& request) {
  // The other ranks wait in this trial's agreement: a rank that cannot go on (a log it cannot
  // write, a failed fork or MPI call) ends the whole job, whose supervisor resumes it
  // (docs/trial.md §17), rather than leave them waiting. Its child's group goes first.
  try {
    return RunTrialOrThrow(request);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "autopar-tune: rank %d: trial %lld: %s; aborting the job\n",
                 trials_.rank(), static_cast<long long>(request.trial_index()) + 1, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    throw;
  }
}

pb::RankTrialResult MegatronRankRunner::RunTrialOrThrow(const pb::TrialRequest& request) {
  const ParallelConfig c = coord::FromProto(request.config());
  int port = trials_.rank() == 0 ? FreePort() : 0;
  CheckMpi(MPI_Bcast(&port, 1, MPI_INT, 0, trials_.comm()), "MPI_Bcast(port)");
  MegatronTrialSettings settings;
  settings.train_iters =
      request.warmup_iterations() + kMaxTimedFactor * std::max(1, request.timed_iterations());
  settings.exit_duration_mins =
      std::max(1, static_cast<int>(std::ceil(request.deadline_s() / 60.0)));
  settings.mock_data = !context_.real_data;
  std::vector<std::string> notes;
  const std::vector<std::string> argv =
      MegatronTrialCommand(context_.train_command, context_.megatron_args,
                           SplitWords(MegatronFlags(c, in_.model, in_.train)), c, settings, &notes);
  const std::string log_path = PrepareLog(request);
  {
    std::ofstream head(log_path);
    for (const std::string& n : notes) head << "autopar-tune: " << n << "\n";
    head << "autopar-tune: trial " << request.trial_index() + 1 << " attempt " << request.attempt()
         << " " << request.spec() << "\nautopar-tune: command:";
    for (const std::string& a : argv) head << " " << a;
    head << "\n";
    if (!head) throw coord::IoError("write", log_path, "the trial's log");
  }
  const double start = Now();
  ChildProcess child(argv, Environment(c, port), log_path);
  double startup_s = 0;
  const Ending ending = Watch(child, log_path, request, start, &startup_s);
  const bool killed = !child.Poll();
  const ChildExit exit = child.KillGroup(kKillGraceS);
  const double wall_s = Now() - start;
  const MegatronLog log = ParseMegatronLog(ReadLog(log_path));
  pb::RankTrialResult r;
  r.set_rank(trials_.rank());
  SetOutcome(log, exit, killed, ending, &r);
  r.set_peak_memory_gib(log.max_reserved_mb / 1024.0);
  r.set_wall_s(wall_s);
  ShareTimes(log, request.warmup_iterations(), startup_s, &r);
  return r;
}

}  // namespace

std::unique_ptr<coord::TrialBackend> MakeMegatronBackend(const TuneContext& context) {
  const Inputs& in = context.inputs;
  auto make_runner = [&](device::Group trials) {
    return std::make_unique<MegatronRankRunner>(context, std::move(trials));
  };
  return CoordinateOrServe(StartMpiWorld(in.cluster), in.cluster, coord::Fingerprint(context.study),
                           make_runner, "megatron");
}

}  // namespace autopar::cli

#endif  // AUTOPAR_WITH_TRIALS
