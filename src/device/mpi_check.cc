#include "autopar/device/mpi_check.h"

#include <string>

namespace autopar::device {

Status MpiError(int rc, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  std::string reason;
  if (MPI_Error_string(rc, text, &length) == MPI_SUCCESS) {
    reason.assign(text, static_cast<std::size_t>(length));
  } else {
    reason = "unknown MPI error";
  }
  return Status::Error(
      Outcome::kCommError,
      std::string(call) + " failed: " + reason + " (code " + std::to_string(rc) + ")", file, line);
}

}  // namespace autopar::device
