// The MPI transport of the coordinator/worker protocol (include/autopar/coord/protocol.h) and rank
// 0's TrialBackend over it, shared by the cpu/cuda trial backends (mpi_trial_backend.cc) and
// the Megatron one (megatron_backend.cc). Internal to src/cli; needs MPI.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "autopar/coord/protocol.h"
#include "autopar/device/group.h"
#include "autopar/spec/cluster.h"

namespace autopar::cli {

inline void CheckMpiChannel(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw coord::ChannelError(std::string(what) + ": " + std::string(text, len));
  }
}

// Protocol messages over MPI: length-prefixed protobuf bytes on the world communicator's own
// duplicate, so they never match a trial's messages.
class MpiChannel : public coord::Channel {
 public:
  explicit MpiChannel(device::Group world)
      : world_(std::move(world)),
        comm_(world_.comm()),
        rank_(world_.rank()),
        size_(world_.size()) {}
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }

  void Broadcast(pb::Command* command) override {
    std::string bytes;
    if (rank_ == 0 && !command->SerializeToString(&bytes)) {
      throw coord::ChannelError("cannot serialise a command");
    }
    uint64_t length = bytes.size();
    CheckMpiChannel(MPI_Bcast(&length, 1, MPI_UINT64_T, 0, comm_), "MPI_Bcast(length)");
    bytes.resize(length);
    CheckMpiChannel(MPI_Bcast(bytes.data(), static_cast<int>(length), MPI_BYTE, 0, comm_),
                    "MPI_Bcast(command)");
    if (rank_ != 0 && !command->ParseFromString(bytes)) {
      throw coord::ChannelError("a command from rank 0 does not parse");
    }
  }

  void Gather(const pb::Report& mine, std::vector<pb::Report>* all) override {
    std::string bytes;
    if (!mine.SerializeToString(&bytes)) throw coord::ChannelError("cannot serialise a report");
    int length = static_cast<int>(bytes.size());
    std::vector<int> lengths(rank_ == 0 ? size_ : 0), offsets(lengths.size());
    CheckMpiChannel(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm_),
                    "MPI_Gather(length)");
    std::string gathered;
    if (rank_ == 0) {
      int total = 0;
      for (int r = 0; r < size_; ++r) {
        offsets[r] = total;
        total += lengths[r];
      }
      gathered.resize(total);
    }
    CheckMpiChannel(MPI_Gatherv(bytes.data(), length, MPI_BYTE, gathered.data(), lengths.data(),
                                offsets.data(), MPI_BYTE, 0, comm_),
                    "MPI_Gatherv(reports)");
    all->clear();
    if (rank_ != 0) return;
    for (int r = 0; r < size_; ++r) {
      pb::Report report;
      if (!report.ParseFromArray(gathered.data() + offsets[r], lengths[r])) {
        throw coord::ChannelError("the report of rank " + std::to_string(r) + " does not parse");
      }
      all->push_back(std::move(report));
    }
  }

 private:
  device::Group world_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

// Rank 0's TrialBackend: owns the channel and its runner, forwards to the protocol.
class CoordinatorBackend : public coord::TrialBackend {
 public:
  CoordinatorBackend(std::unique_ptr<MpiChannel> channel, std::unique_ptr<coord::RankRunner> runner,
                     coord::ChannelBackend::Options options, std::string name)
      : channel_(std::move(channel)),
        runner_(std::move(runner)),
        protocol_(*channel_, *runner_, std::move(options)),
        name_(std::move(name)) {}
  std::string name() const override { return name_; }
  pb::ProbeRecorded Probe() override { return protocol_.Probe(); }
  pb::TrialResult Run(const pb::TrialRequest& request) override { return protocol_.Run(request); }
  void Shutdown(const std::string& reason) override { protocol_.Shutdown(reason); }

 private:
  std::unique_ptr<MpiChannel> channel_;
  std::unique_ptr<coord::RankRunner> runner_;
  coord::ChannelBackend protocol_;
  std::string name_;
};

// What every MPI trial backend does with its world: a duplicate of it for the trials' own
// agreement (apart from the protocol) and the channel over it. Rank 0 returns the coordinator's
// TrialBackend named `name`; every other rank serves the trials of the runner that
// `make_runner(trials)` builds until the coordinator shuts the study down, then returns nullptr.
template <typename MakeRunner>
std::unique_ptr<coord::TrialBackend> CoordinateOrServe(device::Group world,
                                                       const ClusterSpec& cluster,
                                                       uint64_t study_fingerprint,
                                                       const MakeRunner& make_runner,
                                                       std::string name) {
  const int rank = world.rank();
  auto trials = world.Duplicate();
  if (!trials.ok()) throw coord::ChannelError(trials.status().ToString());
  auto channel = std::make_unique<MpiChannel>(std::move(world));
  std::unique_ptr<coord::RankRunner> runner = make_runner(std::move(*trials));
  if (rank != 0) {
    coord::RunWorkerLoop(*channel, *runner, study_fingerprint);
    return nullptr;
  }
  coord::ChannelBackend::Options options;
  options.nnodes = cluster.nnodes;
  options.nproc_per_node = cluster.gpus_per_node;
  options.study_fingerprint = study_fingerprint;
  return std::make_unique<CoordinatorBackend>(std::move(channel), std::move(runner), options,
                                              std::move(name));
}

}  // namespace autopar::cli
