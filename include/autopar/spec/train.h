// TrainSpec: what one optimizer step processes.
#pragma once

#include <cstdint>

#include "autopar/spec/cluster.h"

namespace autopar {

struct TrainSpec {
  int64_t global_batch_size = 0;  // sequences per optimizer step
  int64_t seq_length = 0;         // tokens per sequence
  Precision precision = Precision::kBF16;
};

void Validate(const TrainSpec& t);

}  // namespace autopar
