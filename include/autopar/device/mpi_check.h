// Checking MPI calls.
//
// Communicators made by this module use MPI_ERRORS_RETURN, so an MPI failure comes back as a code
// and becomes Outcome::kCommError with the MPI error text, instead of aborting the job. (A rank
// that dies still takes Open MPI down; docs/protocol.md §4 covers that with the supervisor.)
#pragma once

#include <mpi.h>

#include "autopar/device/status.h"

namespace autopar::device {

// kCommError for `rc`, naming the call and the MPI error string.
Status MpiError(int rc, const char* call, const char* file, int line);

}  // namespace autopar::device

#define AUTOPAR_CHECK_MPI(call)                                                       \
  do {                                                                                \
    const int autopar_mpi_rc_ = (call);                                               \
    if (autopar_mpi_rc_ != MPI_SUCCESS) {                                             \
      return ::autopar::device::MpiError(autopar_mpi_rc_, #call, __FILE__, __LINE__); \
    }                                                                                 \
  } while (0)
