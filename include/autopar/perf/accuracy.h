// How far the model has been from published measurements of runs like the one predicted: the
// spread a prediction carries (docs/models.md §5.2). The figures are what
// scripts/bench_accuracy.sh measured over shared/calibration for each kind of run, not a
// statistical model of the error; they must be updated when the model or the benchmark changes.
#pragma once

#include "autopar/perf/constants.h"
#include "autopar/spec/train.h"

namespace autopar {

struct PredictionSpread {
  double relative = 0;    // the mean absolute relative error of those rows (0: none measured)
  int rows = 0;           // how many published rows it rests on
  const char* like = "";  // which rows
};

// The published rows that resemble a run of this precision on this software stack.
PredictionSpread SpreadOf(const TrainSpec& train, const StackOptions& stack);

}  // namespace autopar
