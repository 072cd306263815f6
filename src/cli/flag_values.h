// The value parsers that our flags (inputs.cc) and a pasted Megatron-LM argument list
// (megatron_script_reader.cc) share. Each refuses what it cannot read with an InputError naming
// the flag and the values allowed.
#pragma once

#include <cstdint>
#include <string>

#include "autopar/cli/inputs.h"

namespace autopar::cli {

// Validate(ClusterSpec)'s bound on gpus_per_node, checked where the flag is read.
inline constexpr int64_t kMaxGpusPerNode = 1024;

// "--x" is a flag, "-5" a value.
bool IsFlag(const std::string& s);

// A script's `$NAME` that nothing set stays as written (SplitCommandLine): refused, naming the
// flag and --megatron-env.
void RefuseUnsetVariable(const std::string& flag, const std::string& text);

// An integer in [min_value, max_value]: out of range (of the bound or of int64) is refused with
// the range, never wrapped.
int64_t ToInt(const std::string& flag, const std::string& text, int64_t min_value,
              int64_t max_value = kMaxIntFlag);

// A finite number in [0, max_value].
double ToDouble(const std::string& flag, const std::string& text, double max_value = 1e15);

// An integer from 0 to 2^64 - 1.
uint64_t ToUnsigned(const std::string& flag, const std::string& text);

// "3600", "90s", "30m", "8h" → seconds; at most 1e9 (~31 years: a deadline past it would
// overflow the clocks it is added to).
double ParseDuration(const std::string& flag, const std::string& text);

}  // namespace autopar::cli
