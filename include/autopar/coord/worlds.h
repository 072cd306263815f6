// Benchmark worlds: replay tables whose truth is NOT the analytic model with scaled components
// (docs/search.md §11). `make-replay-table --world FAMILY` writes one; scripts/bench_search.py
// measures the search on them.
//
// Every family starts from the `scaled` truth of replay.h (SyntheticTruth: a factor per feature,
// a fixed per-configuration deviation, a memory scale, surprise OOMs), drawn from the same stream
// as MakeSyntheticTable, so that a world divided by the scaled table of the same seed is exactly
// the family's own structure. A family's parameters come from their own stream,
// Rng(seed, component, kSynthetic), and the cell values of a table of knob values (an interaction,
// a per-tp memory term) from the knob values themselves, so a world is a pure function of (family,
// seed, candidate set) and `mixed` holds the same components as the families it combines. A row's
// own draws (its deviation, memory noise, surprise) are keyed by its configuration too: two
// candidate sets draw the same rows alike, and only the set-wide normalisations (kernel's median,
// near_memory's scale) follow the set.
//
// clang-format off
//   family        truth (on top of `scaled`)                                      parameters (per table)
//   scaled        nothing: MakeSyntheticTable, bit for bit                        —
//   interactions  step × Π_pairs f_pair(a, b), one lognormal factor per pair of   sd per pair U[0.05, 0.10]
//                 values of tp×pp, mbs×recompute, tp×mbs, pp×vpp (not a product
//                 of per-knob effects: the level effects cannot express it)
//   kernel        GEMM time ÷ e(M, N), attention time ÷ e_a(S), normalised to a   M0 logU[512, 4096] tokens,
//                 median of 1, with M = mbs·seq/(cp·up) tokens, N = hidden/tp,    N0 logU[256, 2048],
//                 S = seq/cp, e(M, N) = 1/((1 + (M0/M)^p)(1 + (N0/N)^q)),         p, q U[0.5, 1],
//                 e_a(S) = 1/(1 + (S0/S)^p); and one bad shape: a value of tp or  S0 logU[256, 2048],
//                 mbs whose GEMM and attention kernels are slower                 bad ×U[1.15, 1.30]
//   memory        peak = s·m̂·(noise) + g(tp) GiB: the model's memory scaled up    s U[1.05, 1.15],
//                 plus a per-tp term (communicators, workspaces) the model lacks,  g(tp) = U[0.5, 1.5]·
//                 so configurations the model says fit run out of memory          (1 + log2 tp) per value
//   noisy         the table keeps the noise-free step time and a noise_sd column;  sd U[0.02, 0.05]
//                 ReplayBackend multiplies each measurement by exp(sd·z), z from
//                 (study seed, spec, attempt)
//   near_memory   step × (1 − b·min(m̂/capacity, 1.25)): memory-hungry             b U[0.10, 0.25],
//                 configurations (no recompute, large mbs, no dist_opt) are        fraction U[0.90, 0.99]
//                 faster; the memory is then scaled up (×[1, 1.3]) so that the
//                 fastest configuration that fits peaks at `fraction` of the capacity
//   mixed         interactions + kernel + memory + noisy                          theirs
// clang-format on
//
// Statuses follow the truth: a row is oom when its true peak exceeds the capacity (or it is one of
// the scaled truth's surprise OOMs).
#pragma once

#include <optional>
#include <string>

#include "autopar/coord/replay.h"
#include "autopar/search/candidates.h"
#include "autopar/spec/model.h"
#include "autopar/spec/train.h"

namespace autopar::coord {

enum class WorldFamily { kScaled, kInteractions, kKernel, kMemory, kNoisy, kNearMemory, kMixed };
const char* ToString(WorldFamily family);
std::optional<WorldFamily> ParseWorldFamily(const std::string& text);
// "scaled, interactions, kernel, memory, noisy, near_memory, mixed" (for messages).
const char* WorldFamilyNames();

// The dimensions the kernel family's efficiencies depend on.
struct WorldShape {
  int64_t hidden_size = 0;
  int64_t seq_length = 0;
  static WorldShape Of(const ModelSpec& model, const TrainSpec& train);
};

// The table of `family` over `candidates`, from `truth` (the scaled part and the seed). When
// `summary` is given it receives one line naming the parameters drawn (the bad shape, the memory
// term, ...). Throws std::invalid_argument when `shape` is incomplete for the kernel family.
ReplayTable MakeWorldTable(const search::CandidateSet& candidates, const WorldShape& shape,
                           WorldFamily family, const SyntheticTruth& truth,
                           std::string* summary = nullptr);

}  // namespace autopar::coord
