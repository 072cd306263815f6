// Rng: the only source of randomness of the search (docs/search.md §9).
//
// Every stream is a pure function of (study seed, trial index, purpose), so replaying a journal
// reproduces every draw, and a draw made for one purpose never shifts another's stream (the stop
// rule's 200 draws do not move the proposal's). The generator is std::mt19937_64, whose output the
// standard fixes bit for bit; the variates are computed here rather than with <random>'s
// distributions, whose algorithms differ between standard libraries.
#pragma once

#include <cstdint>
#include <random>

namespace autopar::search {

enum class Purpose : uint64_t {
  kProposal = 1,      // the Thompson draw of a proposal
  kStopCheck = 2,     // the draws of the convergence rules
  kRandomSearch = 3,  // the random baseline's pick
  kSynthetic = 4,     // synthetic replay tables (benchmarks)
};

class Rng {
 public:
  Rng(uint64_t seed, int64_t index, Purpose purpose);

  uint64_t Bits() { return engine_(); }
  // Uniform on [0, 1) with 53 random bits.
  double Uniform();
  // Uniform integer in [0, n), n > 0, without modulo bias.
  uint64_t Below(uint64_t n);
  // Standard normal (Marsaglia's polar method; the spare value is kept).
  double Normal();
  // Gamma(shape, 1), shape > 0 (Marsaglia & Tsang 2000, "A simple method for generating gamma
  // variables", ACM TOMS 26(3); shape < 1 boosted by U^(1/shape)).
  double Gamma(double shape);

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0;
};

// SplitMix64 finaliser (Steele, Lea & Flood 2014): a bijective 64-bit mix, used to derive stream
// seeds and to build digests.
uint64_t Mix64(uint64_t x);

// Order-dependent hash of a sequence of 64-bit words (for digests and fingerprints).
class Hasher {
 public:
  void Add(uint64_t word) { state_ = Mix64(state_ ^ Mix64(word + 0x9e3779b97f4a7c15ULL)); }
  void Add(double v);  // by bit pattern, with -0.0 and every NaN folded to one value
  void Add(const char* bytes, size_t n);
  uint64_t value() const { return state_; }

 private:
  uint64_t state_ = 0x6a09e667f3bcc909ULL;
};

}  // namespace autopar::search
