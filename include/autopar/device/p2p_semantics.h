// The `--p2p-semantics` choice, apart from the platform interface so the CLI can parse it without
// MPI or the device library.
#pragma once

#include <string>
#include <string_view>

#include "autopar/device/status.h"

namespace autopar::device {

// How the CPU platform's collectives run (`--p2p-semantics`).
//  kMpi:  as MPI runs them: operations on a communicator progress independently, and a send
//         completes once MPI has buffered it.
//  kNccl: as NCCL runs them on one CUDA stream per communicator: each communicator executes its
//         operations one at a time in issue order, an operation starts only when the one before
//         it has completed, and a send completes only when the peer's matching receive is
//         executing, unless both are in one IBatchSendRecv group. Messages match by order per
//         peer pair (NCCL has no tags). A schedule that deadlocks on NCCL deadlocks here, and the
//         trial's deadline reports it as `timeout`.
enum class P2PSemantics { kMpi, kNccl };
// "mpi" or "nccl"; kInvalid naming --p2p-semantics and the allowed values otherwise.
inline StatusOr<P2PSemantics> ParseP2PSemantics(std::string_view name) {
  if (name == "mpi") return P2PSemantics::kMpi;
  if (name == "nccl") return P2PSemantics::kNccl;
  return Status(Outcome::kInvalid,
                "--p2p-semantics: unknown value '" + std::string(name) + "'; allowed: mpi, nccl");
}
inline std::string_view P2PSemanticsName(P2PSemantics semantics) {
  return semantics == P2PSemantics::kNccl ? "nccl" : "mpi";
}

}  // namespace autopar::device
