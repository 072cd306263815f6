#include "autopar/spec/train.h"

#include <string>

#include "autopar/common/status.h"

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
}

}  // namespace autopar
