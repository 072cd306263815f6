// Collectives over MPI on host memory: the CPU platform's transport.
#pragma once

#include <memory>

#include "autopar/device/collectives.h"
#include "autopar/device/group.h"
#include "autopar/device/platform.h"
#include "src/device/cpu/stream_order.h"

namespace autopar::device {

// Collective over `group`: duplicates its communicator, so the result owns its tag space and may
// outlive `group`. Under P2PSemantics::kNccl the operations run as NCCL runs them on one stream
// (see P2PSemantics and stream_order.h): a schedule that would hang on NCCL hangs here too.
StatusOr<std::unique_ptr<Collectives>> MakeMpiCollectives(
    const Group& group, P2PSemantics semantics = P2PSemantics::kMpi);

}  // namespace autopar::device
