// The replay backend (docs/cli.md §12): trials answered from a table, in one process. It is how search
// quality is measured (scripts/bench_search.sh) and how the fault tests drive a whole study.
//
// The table is CSV with a header naming at least the columns
//   tp,pp,dp,cp,up,ep,vpp,mbs,sp,recompute,dist_opt,step_time_s,peak_memory_gib,status
// in any order; `recompute_layers` and `noise_sd` are read when present, other columns are ignored.
// `noise_sd` (empty or 0: none) is the relative sd of a measurement of the row: step_time_s is then
// the noise-free step time and each measurement is drawn around it (ReplayBackend). sp and
// dist_opt are on/off (or true/false, 1/0); recompute none/selective/full; status one of ok, oom,
// timeout, comm_error, device_error, nonfinite, worker_lost, invalid. step_time_s is required on
// ok rows and may be empty elsewhere; peak_memory_gib may be empty. Blank lines and lines starting
// with '#' are skipped. With the replay backend the search space is exactly the table's rows.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "autopar/coord/backend.h"
#include "autopar/search/candidates.h"
#include "autopar/search/state.h"
#include "autopar/space/space.h"

namespace autopar::coord {

struct ReplayRow {
  ParallelConfig config;
  search::Outcome status = search::Outcome::kOk;
  double step_time_s = std::numeric_limits<double>::quiet_NaN();
  double peak_memory_gib = std::numeric_limits<double>::quiet_NaN();
  double noise_sd = 0;  // lognormal sd of one measurement of step_time_s (0: exact)
  int64_t line = 0;     // in the source file, for messages
};

class ReplayTable {
 public:
  // Throws InputError("--replay-table", "<source>:<line>: ...") naming the column and the allowed
  // values.
  static ReplayTable Parse(const std::string& text, const std::string& source);
  explicit ReplayTable(std::vector<ReplayRow> rows);

  const std::vector<ReplayRow>& rows() const { return rows_; }
  std::vector<ParallelConfig> configs() const;
  const ReplayRow* Find(const std::string& spec) const;
  // The fastest ok row (nullptr when none).
  const ReplayRow* Best() const;
  // Canonical CSV (header with recompute_layers, and noise_sd when a row has noise; what
  // make-replay-table writes).
  std::string ToCsv() const;

  // Every row must be a valid configuration of `space` (whose options should allow anything the
  // constraints allow). Throws InputError("--replay-table", "<source>:<line>: <spec>: reason").
  void Validate(const SearchSpace& space, const std::string& source) const;

 private:
  std::vector<ReplayRow> rows_;
  std::unordered_map<std::string, size_t> index_;
};

// Answers a trial with its row. An ok row with noise_sd > 0 is measured as
// step_time_s·exp(noise_sd·z), z a standard normal that is a pure function of (noise_seed, spec,
// attempt): the same study seed sees the same measurements, a resumed study included.
class ReplayBackend : public TrialBackend {
 public:
  explicit ReplayBackend(const ReplayTable& table, uint64_t noise_seed = 0)
      : table_(table), noise_seed_(noise_seed) {}
  std::string name() const override { return "replay"; }
  pb::ProbeRecorded Probe() override { return {}; }
  pb::TrialResult Run(const pb::TrialRequest& request) override;
  // The study's seed, once known (a resumed study's is in its description).
  void set_noise_seed(uint64_t seed) { noise_seed_ = seed; }

 private:
  const ReplayTable& table_;
  uint64_t noise_seed_;
};

// A synthetic "truth" for benchmark tables: the analytic model mis-specified the way real
// clusters mis-specify it. Per table, each compute feature is scaled by a factor drawn uniformly
// from [compute_low, compute_high] and each communication feature by a log-uniform factor from
// [comm_low, comm_high]; per configuration, the step time gets lognormal noise `noise` and the
// memory a scale drawn from [memory_scale_low, memory_scale_high] plus lognormal noise
// `memory_noise`. A row is oom when its true peak exceeds the capacity, and a share
// `surprise_oom` of the rows that fit fail with oom anyway (fragmentation, a driver's reserve).
struct SyntheticTruth {
  uint64_t seed = 1;
  double compute_low = 0.8, compute_high = 1.2;
  double comm_low = 0.5, comm_high = 2.0;
  double noise = 0.03;
  double memory_scale_low = 0.95, memory_scale_high = 1.1;
  double memory_noise = 0.02;
  double surprise_oom = 0.01;
};
ReplayTable MakeSyntheticTable(const search::CandidateSet& candidates, const SyntheticTruth& truth);

}  // namespace autopar::coord
