// Collectives over MPI on host memory: the CPU backend's transport.
#pragma once

#include <memory>

#include "autopar/backend/collectives.h"
#include "autopar/backend/group.h"

namespace autopar::backend {

// Collective over `group`: duplicates its communicator, so the result owns its tag space and may
// outlive `group`.
StatusOr<std::unique_ptr<Collectives>> MakeMpiCollectives(const Group& group);

}  // namespace autopar::backend
