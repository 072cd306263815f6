// The study directory (docs/journal.md §1–§2) and its description.
//
//   DIR/lock         flock'ed by the coordinator that owns the study (a second one: exit 4)
//   DIR/study.pb     pb::StudyDescription: model, train, cluster, space, perf constants, search
//   DIR/journal      see journal.h
//   DIR/result.json, DIR/trials.csv, DIR/best.args   written atomically by the CLI
//
// `--resume` rebuilds the description from the flags and refuses (StudyError, exit 4) one whose
// model, train, cluster, space (the candidate set included), perf constants or search identity
// (searcher, seed, backend, OOM threshold, failure limit) differ from study.pb.
#pragma once

#include <cstdint>
#include <string>

#include "autopar/coord/files.h"
#include "autopar/perf/constants.h"
#include "autopar/search/candidates.h"
#include "autopar/space/space.h"
#include "autopar/spec/cluster.h"
#include "autopar/spec/model.h"
#include "autopar/spec/train.h"
#include "proto/autopar.pb.h"

namespace autopar::coord {

inline constexpr int kStudyFormatVersion = 1;

pb::ModelDesc Describe(const ModelSpec& m);
pb::TrainDesc Describe(const TrainSpec& t);
pb::ClusterDesc Describe(const ClusterSpec& c);
pb::SpaceDesc Describe(const SpaceOptions& s, const search::CandidateSet& candidates);
pb::PerfDesc Describe(const PerfConstants& k);

// Throws StudyError naming the first part that differs and the differing fields.
void CheckSameStudy(const pb::StudyDescription& stored, const pb::StudyDescription& given);

// A hash of the deterministic serialisation of what decides the trials (model, train, cluster,
// space, perf; not the search, whose seed rank 0 alone may read from study.pb): the ranks compare
// it in the protocol's Hello.
uint64_t Fingerprint(const pb::StudyDescription& d);

// The study a journal belongs to (its header's fingerprint, journal.h): Fingerprint's parts and
// the search's identity (searcher, seed, backend, max P(OOM), failure limit), what CheckSameStudy
// compares; not the stop-rule knobs, the replay table's path or created_by, which a resume may
// change. Never 0 (0 is "none recorded").
uint64_t JournalFingerprint(const pb::StudyDescription& d);

class StudyDir {
 public:
  // Creates `dir` if needed and takes its lock. Throws IoError or StudyError (locked).
  explicit StudyDir(const std::string& dir);

  const std::string& dir() const { return dir_; }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  bool HasDescription() const;
  // Throws IoError, or StudyError when study.pb does not parse.
  pb::StudyDescription ReadDescription() const;
  void WriteDescription(const pb::StudyDescription& d) const;  // atomic

 private:
  static const std::string& Created(const std::string& dir);
  std::string dir_;
  DirectoryLock lock_;
};

}  // namespace autopar::coord
