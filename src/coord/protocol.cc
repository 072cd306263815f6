#include "autopar/coord/protocol.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "autopar/common/errors.h"
#include "autopar/coord/files.h"

namespace autopar::coord {
namespace {

// Root cause first: a rank that ran out of memory aborts its collectives, and its peers then see
// communication errors or timeouts; the merged outcome is the OOM.
int Severity(pb::TrialStatus s) {
  switch (s) {
    case pb::OK:
      return 0;
    case pb::TIMEOUT:
      return 1;
    case pb::WORKER_LOST:
      return 2;
    case pb::COMM_ERROR:
      return 3;
    case pb::NONFINITE:
      return 4;
    case pb::DEVICE_ERROR:
      return 5;
    case pb::OOM:
      return 6;
    default:
      return 7;  // INVALID, or a worker that did not set a status
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void Expect(bool ok, const std::string& what) {
  if (!ok) throw ChannelError("protocol violation: " + what);
}

}  // namespace

pb::TrialResult MergeRankResults(const pb::TrialRequest& request,
                                 const std::vector<pb::Report>& reports) {
  pb::TrialResult out;
  out.set_trial_index(request.trial_index());
  out.set_attempt(request.attempt());
  out.set_spec(request.spec());
  out.set_failed_rank(-1);
  Expect(!reports.empty(), "no trial reports");
  pb::TrialStatus status = pb::OK;
  size_t iterations = SIZE_MAX;
  double peak = 0, wall = 0;
  for (size_t r = 0; r < reports.size(); ++r) {
    Expect(reports[r].has_trial(), "rank " + std::to_string(r) + " sent no trial result");
    const pb::RankTrialResult& t = reports[r].trial();
    if (Severity(t.status()) > Severity(status)) {
      status = t.status() == pb::STATUS_UNSPECIFIED ? pb::INVALID : t.status();
      out.set_failed_rank(static_cast<int32_t>(r));
      out.set_message("rank " + std::to_string(r) + ": " + t.message());
    }
    iterations = std::min<size_t>(iterations, static_cast<size_t>(t.iteration_times_s_size()));
    peak = std::max(peak, t.peak_memory_gib());
    wall = std::max(wall, t.wall_s());
    out.set_startup_s(std::max(out.startup_s(), t.startup_s()));
    out.set_tflops_per_gpu(std::max(out.tflops_per_gpu(), t.tflops_per_gpu()));
  }
  out.set_peak_memory_gib(peak);
  out.set_wall_s(wall);
  if (status == pb::OK) {
    // A step ends when its slowest rank ends: max over ranks per iteration, then the median over
    // iterations, which ignores a stray slow iteration.
    std::vector<double> step(iterations, 0.0);
    bool finite = true;
    for (const pb::Report& report : reports) {
      for (size_t i = 0; i < iterations; ++i) {
        const double x = report.trial().iteration_times_s(static_cast<int>(i));
        finite = finite && std::isfinite(x);
        step[i] = std::max(step[i], x);
      }
    }
    const double t = iterations > 0 && finite ? Median(step) : std::nan("");
    if (!(std::isfinite(t) && t > 0)) {
      status = pb::NONFINITE;
      out.set_message(iterations == 0 ? "no timed iterations reported"
                                      : "an iteration time is not finite and positive");
    } else {
      out.set_step_time_s(t);
    }
  }
  out.set_status(status);
  return out;
}

pb::ProbeRecorded ProbeRatios(const std::vector<pb::Report>& reports) {
  // feature → benchmark name → ratios over ranks.
  std::map<std::string, std::map<std::string, std::vector<double>>> by_feature;
  double non_tensor_gib = 0;
  for (const pb::Report& report : reports) {
    Expect(report.has_probe(), "a rank sent no probe result");
    if (report.probe().status() != pb::OK) continue;  // a failed probe leaves the prior alone
    non_tensor_gib = std::max(non_tensor_gib, report.probe().non_tensor_gib());
    for (const pb::ProbeMeasurement& m : report.probe().measurements()) {
      const double ratio = m.measured_s() / m.predicted_s();
      if (std::isfinite(ratio) && ratio > 0) by_feature[m.feature()][m.name()].push_back(ratio);
    }
  }
  pb::ProbeRecorded out;
  out.set_non_tensor_gib(non_tensor_gib);
  for (const auto& [feature, benchmarks] : by_feature) {
    pb::ProbeRecorded::Feature* f = out.add_features();
    f->set_feature(feature);
    for (const auto& [name, ratios] : benchmarks) f->add_ratios(Median(ratios));
  }
  return out;
}

void RunWorkerLoop(Channel& channel, RankRunner& runner, uint64_t study_fingerprint) {
  Expect(channel.rank() != 0, "RunWorkerLoop on rank 0");
  for (;;) {
    pb::Command command;
    channel.Broadcast(&command);
    pb::Report mine;
    std::vector<pb::Report> unused;
    switch (command.kind_case()) {
      case pb::Command::kHello:
        *mine.mutable_facts() = runner.Facts();
        mine.mutable_facts()->set_rank(channel.rank());
        mine.mutable_facts()->set_study_fingerprint(study_fingerprint);
        break;
      case pb::Command::kProbe:
        *mine.mutable_probe() = runner.Probe(command.probe());
        mine.mutable_probe()->set_rank(channel.rank());
        break;
      case pb::Command::kTrial:
        *mine.mutable_trial() = runner.RunTrial(command.trial());
        mine.mutable_trial()->set_rank(channel.rank());
        break;
      case pb::Command::kShutdown:
        return;  // rank 0 gathers nothing after Shutdown
      default:
        throw ChannelError("protocol violation: empty command");
    }
    channel.Gather(mine, &unused);
  }
}

ChannelBackend::ChannelBackend(Channel& channel, RankRunner& local, Options options)
    : channel_(channel), local_(local), options_(std::move(options)) {
  Expect(channel_.rank() == 0, "ChannelBackend on a rank other than 0");
  const int64_t expected = options_.nnodes * options_.nproc_per_node;
  if (channel_.world_size() != expected) {
    throw InputError(
        "--nnodes",
        "the launch has " + std::to_string(channel_.world_size()) +
            " ranks but --nnodes × --nproc-per-node = " + std::to_string(options_.nnodes) + " × " +
            std::to_string(options_.nproc_per_node) + " = " + std::to_string(expected));
  }
  pb::Command command;
  pb::Hello& hello = *command.mutable_hello();
  hello.set_world_size(channel_.world_size());
  hello.set_nnodes(static_cast<int32_t>(options_.nnodes));
  hello.set_nproc_per_node(static_cast<int32_t>(options_.nproc_per_node));
  hello.set_study_fingerprint(options_.study_fingerprint);
  channel_.Broadcast(&command);
  pb::Report mine;
  *mine.mutable_facts() = local_.Facts();
  mine.mutable_facts()->set_rank(0);
  mine.mutable_facts()->set_study_fingerprint(options_.study_fingerprint);
  std::vector<pb::Report> all;
  channel_.Gather(mine, &all);
  Expect(static_cast<int>(all.size()) == channel_.world_size(), "gather returned a wrong count");
  for (const pb::Report& r : all) {
    Expect(r.has_facts(), "a rank answered Hello without its facts");
    if (r.facts().study_fingerprint() != options_.study_fingerprint) {
      throw StudyError("rank " + std::to_string(r.facts().rank()) + " on " + r.facts().hostname() +
                       " derived a different study from its flags than rank 0: launch every "
                       "rank with the same arguments");
    }
    hosts_.push_back(r.facts());
  }
}

pb::ProbeRecorded ChannelBackend::Probe() {
  pb::Command command;
  *command.mutable_probe() = options_.probe;
  channel_.Broadcast(&command);
  pb::Report mine;
  *mine.mutable_probe() = local_.Probe(options_.probe);
  mine.mutable_probe()->set_rank(0);
  std::vector<pb::Report> all;
  channel_.Gather(mine, &all);
  return ProbeRatios(all);
}

pb::TrialResult ChannelBackend::Run(const pb::TrialRequest& request) {
  pb::Command command;
  *command.mutable_trial() = request;
  channel_.Broadcast(&command);
  pb::Report mine;
  *mine.mutable_trial() = local_.RunTrial(request);
  mine.mutable_trial()->set_rank(0);
  std::vector<pb::Report> all;
  channel_.Gather(mine, &all);
  return MergeRankResults(request, all);
}

void ChannelBackend::Shutdown(const std::string& reason) {
  if (shut_down_) return;
  shut_down_ = true;
  pb::Command command;
  command.mutable_shutdown()->set_reason(reason);
  channel_.Broadcast(&command);
}

}  // namespace autopar::coord
