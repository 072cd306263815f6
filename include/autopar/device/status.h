// The failure class of device and trial work, carried as a value.
//
// Every device op and collective returns a Status instead of throwing or aborting, so a trial can
// turn an out-of-memory, a communication failure or a non-finite loss into its outcome
// (docs/trial.md §10) and the worker stays alive for the next trial. The check macros stamp the
// first error with
// `[host:pid] file:line` and add one `<- file:line` frame at every level it is passed up through,
// like nccl-tests' testResult_t with its TESTCHECK.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace autopar::device {

// Trial outcomes a worker can observe by itself; `worker_lost` is decided by the coordinator.
enum class Outcome { kOk, kOom, kTimeout, kCommError, kDeviceError, kNonfinite, kInvalid };

// The outcome's name as docs/trial.md §10 spells it: "ok", "oom", "timeout", "comm_error", ...
const char* OutcomeName(Outcome outcome);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(Outcome outcome, std::string message) : outcome_(outcome), message_(std::move(message)) {}

  // An error whose message starts with where it happened: `[host:pid] file:line: what`.
  static Status Error(Outcome outcome, std::string_view what, const char* file, int line);

  bool ok() const { return outcome_ == Outcome::kOk; }
  Outcome outcome() const { return outcome_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;  // "oom: [host:pid] device.cc:40: ..." or "ok"

  // Appends the frame ` <- file:line` as the error travels up a level.
  Status WithFrame(const char* file, int line) &&;

 private:
  Outcome outcome_ = Outcome::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }

// Prints `what` (with the status, when one is given) to stderr and aborts: the end of a broken
// internal invariant, never of bad input or a failed external call (those are Status values).
[[noreturn]] void DieOfBrokenInvariant(const char* what, const char* file, int line);
[[noreturn]] void DieOfEmptyStatusOr(const Status& status);

// A value or the error that prevented it. Building one from an ok Status is a programming error
// and yields kInvalid rather than an empty value.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit like absl
    if (status_.ok()) status_ = Status(Outcome::kInvalid, "StatusOr built from an ok Status");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit like absl

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // The value; reading it from an error aborts with the error (DieOfEmptyStatusOr), so a missed
  // ok() check is a loud crash naming the cause, never undefined behaviour.
  T& value() & { return Checked(); }
  const T& value() const& { return Checked(); }
  T&& value() && { return std::move(Checked()); }
  T& operator*() & { return Checked(); }
  const T& operator*() const& { return Checked(); }
  T* operator->() { return &Checked(); }
  const T* operator->() const { return &Checked(); }

 private:
  T& Checked() {
    if (!value_) DieOfEmptyStatusOr(status_);
    return *value_;
  }
  const T& Checked() const {
    if (!value_) DieOfEmptyStatusOr(status_);
    return *value_;
  }

  Status status_;
  std::optional<T> value_;
};

// Where errors come from; cached once per process.
const std::string& HostPidTag();  // "host:pid"

}  // namespace autopar::device

#define AUTOPAR_STATUS_CONCAT_INNER_(a, b) a##b
#define AUTOPAR_STATUS_CONCAT_(a, b) AUTOPAR_STATUS_CONCAT_INNER_(a, b)

// Returns a non-ok Status from the enclosing function, adding this file:line as a frame.
#define AUTOPAR_RETURN_IF_ERROR(expr)                                  \
  do {                                                                 \
    ::autopar::device::Status autopar_status_ = (expr);                \
    if (!autopar_status_.ok()) {                                       \
      return std::move(autopar_status_).WithFrame(__FILE__, __LINE__); \
    }                                                                  \
  } while (0)

// `AUTOPAR_ASSIGN_OR_RETURN(Buffer buf, device.Allocate(n));` declares or assigns `lhs`.
#define AUTOPAR_ASSIGN_OR_RETURN(lhs, expr) \
  AUTOPAR_ASSIGN_OR_RETURN_IMPL_(AUTOPAR_STATUS_CONCAT_(autopar_statusor_, __LINE__), lhs, expr)
// NOLINTBEGIN(bugprone-macro-parentheses): `tmp` is a name and `lhs` a declaration ("Buffer buf");
// neither can be parenthesised.
#define AUTOPAR_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr)                            \
  auto tmp = (expr);                                                              \
  if (!tmp.ok()) {                                                                \
    return ::autopar::device::Status(tmp.status()).WithFrame(__FILE__, __LINE__); \
  }                                                                               \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)

// An internal invariant: when `cond` is false the program is wrong, and it aborts naming the
// condition and the place (DieOfBrokenInvariant). Not for input or external calls.
#define AUTOPAR_INVARIANT(cond)                                                      \
  do {                                                                               \
    if (!(cond)) ::autopar::device::DieOfBrokenInvariant(#cond, __FILE__, __LINE__); \
  } while (0)

// Argument and shape checks: a failed one is the caller's bug, reported as kInvalid.
#define AUTOPAR_CHECK_ARG(cond, what)                                                             \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      return ::autopar::device::Status::Error(::autopar::device::Outcome::kInvalid,               \
                                              std::string("check `" #cond "` failed: ") + (what), \
                                              __FILE__, __LINE__);                                \
    }                                                                                             \
  } while (0)
