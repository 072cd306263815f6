// Proposal strategies: Thompson sampling over the posterior (docs/search.md §6) and the baselines it is
// measured against (grid, random, analytic-only).
//
// A searcher is a pure function of (state, seed, trial index): it keeps no state of its own, so
// the proposal after replaying a journal is the proposal an uninterrupted run would make.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autopar/search/rng.h"
#include "autopar/search/state.h"

namespace autopar::search {

class Searcher {
 public:
  virtual ~Searcher() = default;
  virtual const char* name() const = 0;
  // Whether the searcher follows the posterior (the convergence stop rules apply only then).
  virtual bool uses_posterior() const = 0;
  // The candidate to run as trial `trial_index`; nullopt when no candidate is eligible.
  virtual std::optional<int64_t> Propose(const SearchState& state, uint64_t seed,
                                         int64_t trial_index) const = 0;
};

// Thompson sampling (Thompson 1933; Russo et al. 2018, "A Tutorial on Thompson Sampling"): draw
// θ from the posterior, predict every candidate with one matrix–vector product X·θ, take the
// eligible argmin. The draw decides check trials, repeats and the first trial; a repeat it picks
// gives way with probability 1 − top_two_beta to a fresh draw's other pick (top-two sampling,
// docs/search.md §7a). Any other trial measures the largest expected improvement on the
// recommendation (Jones et al. 1998) of a shortlist: the candidates of lowest posterior mean and
// the draw's own pick (docs/search.md §6).
class ThompsonSearcher : public Searcher {
 public:
  const char* name() const override { return "thompson"; }
  bool uses_posterior() const override { return true; }
  std::optional<int64_t> Propose(const SearchState& state, uint64_t seed,
                                 int64_t trial_index) const override;

 private:
  // One Thompson draw's pick: the eligible argmin of a drawn θ that fits a drawn memory model, or
  // a contender worth measuring again whose drawn estimate is lower (a check: the wider draw).
  static std::optional<int64_t> ThompsonDraw(const SearchState& state, Rng& rng, bool check);
};

// Exhaustive sweep in the enumeration order of the space (or the rows of a replay table), as
// grid autotuners do; skips what the memory model rules out.
class GridSearcher : public Searcher {
 public:
  const char* name() const override { return "grid"; }
  bool uses_posterior() const override { return false; }
  std::optional<int64_t> Propose(const SearchState& state, uint64_t seed,
                                 int64_t trial_index) const override;
};

// Uniform among the eligible candidates.
class RandomSearcher : public Searcher {
 public:
  const char* name() const override { return "random"; }
  bool uses_posterior() const override { return false; }
  std::optional<int64_t> Propose(const SearchState& state, uint64_t seed,
                                 int64_t trial_index) const override;
};

// The analytic model's ranking, fastest first, with no feedback from measured times (what a
// planner-then-verify workflow does).
class AnalyticSearcher : public Searcher {
 public:
  explicit AnalyticSearcher(const CandidateSet& candidates);
  const char* name() const override { return "analytic"; }
  bool uses_posterior() const override { return false; }
  std::optional<int64_t> Propose(const SearchState& state, uint64_t seed,
                                 int64_t trial_index) const override;

 private:
  std::vector<int64_t> order_;
};

// By name: thompson, random, grid, analytic. Throws InputError("--searcher", allowed values).
std::unique_ptr<Searcher> MakeSearcher(const std::string& name, const CandidateSet& candidates);

// argmin over eligible candidates of t (ties: lowest index; +inf excludes a candidate); -1 when
// none is left.
int64_t EligibleArgmin(const SearchState& state, const std::vector<double>& t);

}  // namespace autopar::search
