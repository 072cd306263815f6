// The small job every numerical trial test runs, on the CPU and the CUDA platform alike.
#pragma once

#include "autopar/trial/trial.h"

namespace autopar::trial::testing {

// 8 sequences of 64 tokens.
inline TrainSpec SmallTrain(Precision precision) {
  TrainSpec t;
  t.global_batch_size = 8;
  t.seq_length = 64;
  t.precision = precision;
  return t;
}

// Every micro-batch, two steps (the second reads Adam's moments of the first), weight
// fingerprints, and Adam's eps raised so the update is proportional to the gradient.
inline TrialOptions NumericOptions() {
  TrialOptions o;
  o.warmup_iterations = 0;
  o.timed_iterations = 2;
  o.max_microbatches = -1;
  o.fingerprint = true;
  o.learning_rate = 1e-2f;
  o.adam_eps = 1.0f;
  o.timeout_s = 120;
  return o;
}

}  // namespace autopar::trial::testing
