// Collectives over MPI on host memory: the CPU backend's transport.
#pragma once

#include <memory>

#include "autopar/backend/backend.h"
#include "autopar/backend/collectives.h"
#include "autopar/backend/group.h"
#include "src/backend/cpu/stream_order.h"

namespace autopar::backend {

// Collective over `group`: duplicates its communicator, so the result owns its tag space and may
// outlive `group`. Under P2PSemantics::kNccl the operations run as NCCL runs them on one stream
// (see P2PSemantics and stream_order.h): a schedule that would hang on NCCL hangs here too.
StatusOr<std::unique_ptr<Collectives>> MakeMpiCollectives(
    const Group& group, P2PSemantics semantics = P2PSemantics::kMpi);

}  // namespace autopar::backend
