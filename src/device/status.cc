#include "autopar/device/status.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace autopar::device {

const char* OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kOk:
      return "ok";
    case Outcome::kOom:
      return "oom";
    case Outcome::kTimeout:
      return "timeout";
    case Outcome::kCommError:
      return "comm_error";
    case Outcome::kDeviceError:
      return "device_error";
    case Outcome::kNonfinite:
      return "nonfinite";
    case Outcome::kInvalid:
      return "invalid";
  }
  return "unknown";
}

const std::string& HostPidTag() {
  static const std::string tag = [] {
    char host[256] = {};
    // An unnamed host must not hide the error being reported, so fall back to a placeholder.
    if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown-host");
    return std::string(host) + ":" + std::to_string(getpid());
  }();
  return tag;
}

namespace {

// Paths are long and the same on every host; the file name is enough to find the line.
const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash != nullptr ? slash + 1 : path;
}

}  // namespace

Status Status::Error(Outcome outcome, std::string_view what, const char* file, int line) {
  std::string message = "[" + HostPidTag() + "] " + Basename(file) + ":" + std::to_string(line) +
                        ": " + std::string(what);
  return Status(outcome, std::move(message));
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(OutcomeName(outcome_)) + ": " + message_;
}

Status Status::WithFrame(const char* file, int line) && {
  if (!ok()) message_ += std::string(" <- ") + Basename(file) + ":" + std::to_string(line);
  return std::move(*this);
}

void DieOfBrokenInvariant(const char* what, const char* file, int line) {
  std::fprintf(stderr, "[%s] %s:%d: internal invariant broken: %s\n", HostPidTag().c_str(),
               Basename(file), line, what);
  std::abort();
}

void DieOfEmptyStatusOr(const Status& status) {
  std::fprintf(stderr, "[%s] StatusOr::value() of an error: %s\n", HostPidTag().c_str(),
               status.ToString().c_str());
  std::abort();
}

}  // namespace autopar::device
