// Reading a study back (for `report`): the specs its description was made from, and its trials
// from the journal, without taking the study's lock or changing any file, so a running or an
// interrupted study can be read as well as a finished one.
#pragma once

#include <string>
#include <vector>

#include "autopar/perf/constants.h"
#include "autopar/spec/cluster.h"
#include "autopar/spec/model.h"
#include "autopar/spec/train.h"
#include "proto/autopar.pb.h"

namespace autopar::coord {

struct StudySpecs {
  ModelSpec model;
  TrainSpec train;
  ClusterSpec cluster;
  PerfConstants constants;
};
// The inverse of Describe(). Throws StudyError naming the field when a value is not one we write.
StudySpecs SpecsOf(const pb::StudyDescription& d);

// One trial as the journal tells it: its last attempt, finished or still in flight.
struct JournaledTrial {
  int64_t index = 0;
  int32_t attempts = 0;
  std::string spec;
  bool finished = false;
  pb::TrialResult result;  // when finished
  double predicted_step_time_s = 0, predicted_memory_gib = 0, p_oom = 0;
  double elapsed_s = 0;    // study tuning time when it finished
};

struct JournalSummary {
  std::vector<JournaledTrial> trials;  // by index, each once
  int sessions = 0;
  std::string stop_reason;             // empty when the study did not finish
  // The recommendation after the last finished trial that records one (empty in a journal
  // written before TrialFinished carried it) and its estimated step time.
  std::string best_spec;
  double best_step_time_s = 0;
  double elapsed_s = 0;
  size_t valid_bytes = 0, file_bytes = 0;  // a torn tail shows as valid < file
};

// Reads `dir`/study.pb and `dir`/journal. Throws IoError / StudyError naming the path: the
// journal's JournalCorrupt ("corrupt at record N"), or JournalForeign when its header names
// another study than `description` (docs/journal.md §5).
pb::StudyDescription ReadStudyDescription(const std::string& dir);
JournalSummary ReadJournal(const std::string& dir, const pb::StudyDescription& description);

}  // namespace autopar::coord
