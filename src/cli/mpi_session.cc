#if defined(AUTOPAR_WITH_TRIALS)

#include "autopar/cli/mpi_session.h"

#include <mpi.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace autopar::cli {
namespace {

void FinalizeAtExit() {
  int finalized = 0;
  if (MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Finalize();
}

}  // namespace

void EnsureMpi() {
  int initialized = 0;
  if (MPI_Initialized(&initialized) != MPI_SUCCESS) throw std::runtime_error("MPI_Initialized");
  if (initialized) return;
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    throw std::runtime_error("MPI_Init_thread failed");
  }
  if (std::atexit(FinalizeAtExit) != 0) throw std::runtime_error("atexit failed");
}

int MpiWorldRank() {
  int rank = 0;
  if (MPI_Comm_rank(MPI_COMM_WORLD, &rank) != MPI_SUCCESS) throw std::runtime_error("MPI_Comm_rank");
  return rank;
}

int MpiWorldSize() {
  int size = 0;
  if (MPI_Comm_size(MPI_COMM_WORLD, &size) != MPI_SUCCESS) throw std::runtime_error("MPI_Comm_size");
  return size;
}

}  // namespace autopar::cli

#endif  // AUTOPAR_WITH_TRIALS
