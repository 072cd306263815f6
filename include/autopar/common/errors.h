// Error values that cross module boundaries.
//
// The pure core (spec, space, perf, search) reports bad input by throwing InputError, which names
// the field or flag at fault and, where there is a closed set, the values it accepts. The CLI turns
// an InputError into exit code 2 (docs/cli.md §10); nothing else catches it.
#pragma once

#include <stdexcept>
#include <string>

namespace autopar {

// Exit codes of every autopar-tune command (docs/cli.md §10).
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,
  kExitBadInput = 2,
  kExitInfeasible = 3,
  kExitStudyMismatch = 4,
};

class InputError : public std::runtime_error {
 public:
  // `field` is the flag (`--tp`) or field (`num_attention_heads`) at fault; `message` says what is
  // wrong and which values are allowed.
  InputError(std::string field, const std::string& message)
      : std::runtime_error(field + ": " + message), field_(std::move(field)) {}

  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

}  // namespace autopar
