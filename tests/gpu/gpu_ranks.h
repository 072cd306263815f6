// Shared by the tests that need one CUDA device per MPI rank.
#pragma once

#include <mpi.h>

#include "autopar/device/cuda_platform.h"

namespace autopar::device {

// True on every rank iff every rank has a GPU of its own (no fewer devices on each node than
// ranks on it). Collective over MPI_COMM_WORLD: every rank calls it, and all skip together.
inline bool EveryRankHasAGpu() {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local_size = 1;
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  int mine = CudaDeviceCount() >= local_size ? 1 : 0;
  int all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

}  // namespace autopar::device
