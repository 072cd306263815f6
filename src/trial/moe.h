// A mixture-of-experts layer's routed part with expert parallelism (Megatron-core's all-to-all
// token dispatcher, dropless).
//
// Each tp rank routes its own slice of the tensor-parallel region's rows (under SP, its local
// rows): a replicated router gives top-k softmax gates (softmax over the k largest logits,
// Megatron's default) and a Switch-style load-balancing loss per sample, α·E/k·Σ_e f_e·P_e with
// f_e the share of the sample's tokens routed to e and P_e its mean router probability, whose
// statistics are summed over the ranks holding the sample. Dispatch sorts the rows by expert, sends
// per-expert counts over the ep group (an equal-split all-to-all), then the rows (all-to-all-v);
// with etp > 1 the expert-tensor group (Megatron's --expert-tensor-parallel-size, the tp group
// when etp = tp) all-gathers what its ranks received, since every expert is etp-sharded (fc1
// column-, fc2 row-parallel); the rows are sorted by local expert and each expert runs its GEMMs.
// Combine is the mirror image: unsort, reduce-scatter over etp (the partial sums of the
// row-parallel fc2), all-to-all-v back, and the gate-weighted sum of each token's k outputs.
//
// With Megatron's flex dispatcher (Shapes::flex; DeepEP and its kin) a token travels once to each
// ep rank holding any of its experts, with the gates of that rank's experts beside it (El floats,
// −1 for an expert not chosen): the rank sorts the rows it received by local expert, scales each
// expert row's activation by its gate before fc2 (as Megatron's experts apply the routing
// probabilities), sums each received row's expert outputs and sends that one row back, where the
// token's rows from its ranks are summed. The gates' gradient is found beside the experts and
// travels home the way the outputs do. With etp > 1 the rows and their gates are all-gathered
// over etp and the sums reduce-scattered, as below.
//
// Token counts vary per expert, so the exchange is variable-size (Collectives::AllToAllV), and
// everything whose size depends on the routing is allocated per micro-batch: results are exact
// (no capacity, no dropped tokens) and independent of the layout. The etp all-gather and
// reduce-scatter pad each rank's block to the largest count in the etp group.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "src/trial/rows.h"
#include "src/trial/shard.h"

namespace autopar::trial {

// The routing and activations of one MoE layer for one micro-batch, kept for its backward.
struct MoeActs {
  Buffer compute;          // saved activations (sizes depend on the routing)
  Tensor ex_in, h1, a1;    // the local experts' rows [R_all, h], fc1 out, activation
  Tensor combined, gates;  // experts' outputs per (token, slot) [Tr·k, h]; gates [Tr·k]
  IdLists ids;             // row gathers of dispatch and combine
  size_t dispatch = 0, send_slot = 0, slot = 0, sort = 0, unsort = 0;
  std::vector<int32_t> choice;                 // [Tr·k] expert of each (token, slot)
  std::vector<float> gate, probs;              // [Tr·k] gates, [Tr·E] router probabilities
  std::vector<float> load;                     // [mbs·E] f_e of each sample
  std::vector<int64_t> send_rows, recv_rows;   // rows sent to / received from each ep rank
  std::vector<int64_t> expert_rows;            // rows of each local expert (over the etp group)
  int64_t max_received = 0, all_received = 0;  // over the etp group
  std::vector<float> dlogits;                  // [Tr·E], from BackwardExperts for BackwardRouter
  // Flex dispatch: the row sent for each (token, slot) [Tr·k]; each expert row's gate and its
  // cell (received row · El + local expert) in the received gate matrix [R]; the sums of each
  // received row's expert rows and of each token's returned rows; the expert rows' gates on the
  // device [R] (in `compute`).
  std::vector<int32_t> slot_row, gate_cell;
  std::vector<float> row_gate;
  RowSum by_arrival, by_token;
  Tensor row_gates;
};

// Megatron's --moe-router-force-load-balancing (its RandomSTE, what its MoE benchmarks run): the
// forward replaces the router's logits by standard normal draws, and the backward passes the
// logits' gradient straight through to the router. The draw of (token, expert) is a pure function
// of the layer's stream and the token's place in the global batch (its sample and position), so
// every layout, and a recomputed forward, routes alike; training cannot unbalance it.
struct RandomLogits {
  uint64_t layer_seed = 0;   // the global layer's stream, the same on every rank
  int64_t first_sample = 0;  // the micro-batch's first sample in the global batch
};

class MoeLayer {
 public:
  // The load-balancing loss coefficient (Megatron's --moe-aux-loss-coeff; 1e-2 as in Switch).
  static constexpr double kAuxLossCoeff = 1e-2;

  static StatusOr<std::unique_ptr<MoeLayer>> Create(Device& device, const Shapes& s,
                                                    ProcessGroups& g, double samples_per_step);

  // Routes this tp rank's rows x [Tr, h] and adds the gate-weighted expert outputs into out
  // [Tr, h]. Adds the layer's load-balancing loss of the samples to the running sum when
  // `count_aux` (not on a full-recompute rerun), on one rank per sample. With `random`, the
  // routing is forced to balance (RandomLogits).
  Status Forward(const LayerWeights& w, MoeActs& a, Tensor x, Tensor out, bool count_aux,
                 const std::optional<RandomLogits>& random = std::nullopt);
  // From dy [Tr, h], the gradient at `out`: the experts' weight gradients, the gradient reaching x
  // through the experts (kept for BackwardRouter) and the router logits' gradient.
  Status BackwardExperts(const LayerWeights& w, MoeActs& a, Tensor dy);
  // The router's weight gradient and dx [Tr, h] += the gradient through the router and the
  // experts. Frees `a`.
  Status BackwardRouter(const LayerWeights& w, MoeActs& a, Tensor x, Tensor dx);
  // The load-balancing loss added since the last call (already divided by the step's samples).
  double TakeAuxLoss();

 private:
  MoeLayer(Device& d, const Shapes& s, ProcessGroups& g, double samples)
      : dev_(d), s_(s), g_(g), etp_(s.etp == s.tp ? g.tp : g.etp), samples_per_step_(samples) {}
  Status Route(const LayerWeights& w, MoeActs& a, Tensor x, bool count_aux,
               const std::optional<RandomLogits>& random);
  // RandomLogits' draws for this rank's rows, in place of the router's: `logits` becomes [Tr·E].
  void DrawLogits(const RandomLogits& random, std::vector<float>& logits) const;
  // Row counts, `count.size() / ep` for each ep rank, through the ep all-to-all and the etp
  // all-gather: what each etp rank of the group received from each ep rank, [etp][ep][n].
  StatusOr<std::vector<int32_t>> ShareCounts(const std::vector<int32_t>& count);
  Status Exchange(MoeActs& a);
  Status ExchangeFlex(MoeActs& a);
  // Per-peer row counts as element counts of [rows, width].
  static std::vector<int64_t> Elements(const std::vector<int64_t>& rows, int64_t width);
  // Rows of `width` in dispatch order through the ep all-to-all and the etp all-gather
  // (Dispatch), or unsorted expert outputs through the etp reduce-scatter and the all-to-all back
  // (Combine). The two buffers alternate as source and destination; the result is in the
  // returned one.
  StatusOr<Tensor> Dispatch(MoeActs& a, Tensor send, Tensor other, int64_t width);
  StatusOr<Tensor> Combine(MoeActs& a, Tensor unsorted, Tensor other, int64_t width);
  // Flex dispatch's row counts: sent, received over the etp group (padded), and the most rows a
  // work buffer holds.
  struct FlexSizes {
    int64_t sent, arrivals, rows;
  };
  FlexSizes FlexRows(const MoeActs& a) const;
  Status ForwardFlex(const LayerWeights& w, MoeActs& a, Tensor x, Tensor out);
  // The flex backward to dx_, returning the gates' gradient [Tr·k].
  StatusOr<std::vector<float>> BackwardFlex(const LayerWeights& w, MoeActs& a, Tensor dy);
  // The router logits' gradient (a.dlogits) from the gates' gradient.
  void RouterGradient(MoeActs& a, const std::vector<float>& dgate) const;
  // The experts' GEMMs and activations. With flex dispatch (`a1w` given, [R, f]) each row's
  // activation is scaled by its gate before fc2, and the backward writes the gates' gradient
  // (`dgate`, f32 [R]).
  Status ExpertsForward(const LayerWeights& w, MoeActs& a, Tensor out, Tensor a1w = {});
  Status ExpertsBackward(const LayerWeights& w, MoeActs& a, Tensor dy, Tensor da1, Tensor dh1,
                         Tensor dx, Tensor a1w = {}, Tensor dgate = {});

  Device& dev_;
  const Shapes s_;
  ProcessGroups& g_;
  Comm& etp_;  // the expert-tensor group (the tp group at etp = tp)
  const double samples_per_step_;
  Buffer compute_, stats_, counts_;
  Tensor dx_, dlogits_, ones_;                     // compute: [Tr, h], [Tr, E], [Tr·k]
  Tensor logits_, dgate_, sample_stats_;           // f32: [Tr, E], [Tr·k], [2·mbs·E]
  Tensor send_counts_, recv_counts_, all_counts_;  // i32: [E], [E], [etp·E]
  double aux_sum_ = 0;
};

}  // namespace autopar::trial
