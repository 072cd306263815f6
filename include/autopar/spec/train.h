// TrainSpec: what one optimizer step processes.
#pragma once

#include <cstdint>

#include "autopar/spec/cluster.h"

namespace autopar {

struct TrainSpec {
  int64_t global_batch_size = 0;  // sequences per optimizer step
  int64_t seq_length = 0;         // tokens per sequence
  Precision precision = Precision::kBF16;
  // With precision kFP8 (`--fp8-format`): hybrid (TransformerEngine's Format.HYBRID) quantizes
  // activations and weights to e4m3 and gradients to e5m2; e4m3 quantizes everything to e4m3.
  enum class Fp8Format : uint8_t { kHybrid, kE4M3 };
  Fp8Format fp8_format = Fp8Format::kHybrid;
};

void Validate(const TrainSpec& t);

}  // namespace autopar
