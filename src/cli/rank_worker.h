// What every rank of an MPI command (trial, probe, tune --backend cpu|cuda) starts from: MPI, the
// world group, and the device platform of its GPU. Internal to src/cli; needs the trial runner.
#pragma once

#include <memory>
#include <string>

#include "autopar/coord/backend.h"
#include "autopar/device/group.h"
#include "autopar/device/platform.h"
#include "autopar/perf/constants.h"
#include "autopar/spec/cluster.h"
#include "autopar/trial/trial.h"

namespace autopar::cli {

struct RankWorker {
  device::Group world;
  std::unique_ptr<device::Platform> platform;
};

// Initialises MPI, checks that mpirun started --nnodes × --nproc-per-node ranks (InputError
// naming --nnodes otherwise), and starts `backend` with the GPU's memory as the rank's budget on
// the GPU of the rank's place in its node (InputError naming --backend when it cannot start).
// Throws std::runtime_error when MPI cannot give the world group.
// `p2p_semantics`: ReadP2PSemantics' value.
RankWorker StartRankWorker(const std::string& backend, const ClusterSpec& cluster,
                           device::P2PSemantics p2p_semantics);

// MPI and the world group alone (StartRankWorker without a device): the same checks.
device::Group StartMpiWorld(const ClusterSpec& cluster);

// What a trial takes from the stack the model assumes: Megatron's --ddp-bucket-size, and the
// hidden dropout where the stack keeps dropout.
inline void SetStackOptions(const StackOptions& stack, trial::TrialOptions& options) {
  options.ddp_bucket_size = stack.ddp_bucket_size;
  options.hidden_dropout = stack.dropout ? trial::kMegatronHiddenDropout : 0.0f;
}

struct TuneContext;
// `tune --backend megatron` (megatron_backend.cc): as the cpu/cuda factory, rank 0's backend or
// null after the worker loop on the other ranks.
std::unique_ptr<coord::TrialBackend> MakeMegatronBackend(const TuneContext& context);

}  // namespace autopar::cli
