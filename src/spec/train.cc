#include "autopar/spec/train.h"

#include <string>

#include "autopar/common/errors.h"
#include "internal.h"

namespace autopar {

void Validate(const TrainSpec& t) {
  if (t.global_batch_size <= 0) {
    throw InputError("global_batch_size",
                     "must be a positive integer, got " + std::to_string(t.global_batch_size));
  }
  if (t.seq_length <= 0) {
    throw InputError("seq_length",
                     "must be a positive integer, got " + std::to_string(t.seq_length));
  }
  using namespace spec_internal;
  RequireAtMost(t.global_batch_size, kMaxBatch, "global_batch_size");
  RequireAtMost(t.seq_length, kMaxSequence, "seq_length");
  if (t.global_batch_size * t.seq_length > kMaxTokensPerStep) {
    throw InputError("global_batch_size", "global_batch_size x seq_length must be at most " +
                                              std::to_string(kMaxTokensPerStep) +
                                              " tokens per step, got " +
                                              std::to_string(t.global_batch_size) + " x " +
                                              std::to_string(t.seq_length));
  }
}

}  // namespace autopar
