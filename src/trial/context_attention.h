// Attention over a sequence split across ranks: Ulysses (DeepSpeed-Ulysses, Jacobs et al. 2023)
// and context parallelism (ring attention, Liu et al. 2023, with Megatron-core's load-balanced
// causal layout), alone or together.
//
// Layout. The sequence is cut in 2·cp chunks; cp rank i holds chunks i and 2·cp − 1 − i, so every
// rank does the same causal work. Inside a cp rank, up rank u holds the u-th slice of those rows.
// A rank's rows are (s, b) with s slowest (GlobalPosition maps s to the global position).
//
// Ulysses. After the QKV projection an all-to-all over the up group trades the rank's rows of all
// its heads for all the cp rank's rows of heads/up query heads (and the kv heads they read,
// replicated when there are fewer kv heads than up ranks); the output goes back the same way. The
// buffers are packed by row gathers (rows.h), in the "ul" layout [cp rows, q | k | v].
//
// Ring. K and V of the rank's two chunks travel around the cp ring; each step computes the visible
// chunk pairs of the block at hand (by global positions) while the next block is in flight
// (one grouped send/recv per step, as Transformer Engine's ring does, then wait), and merges by
// log-sum-exp. Backward runs the same ring with the final
// output and log-sum-exp; dK/dV of a block travel with it, each rank adding its part, and reach
// the owner after a last hop.
//
// All-gather (cp_allgather; Megatron's --cp-comm-type all_gather, Transformer Engine's
// AttnFuncWithCPAndKVAllGather). K and V of every cp rank are all-gathered (rank order: each
// rank's two chunks) and put in sequence order; each query chunk attends to the keys up to its
// own end. Nothing overlaps the gather. Backward gathers K and V again (the gathered copy is not
// kept), accumulates dK/dV over the whole sequence, puts them back in rank order and
// reduce-scatters them in the compute dtype. Transformer Engine runs a query chunk against its
// key prefix as one call with a bottom-right causal mask; here it is the prefix's earlier chunks
// (no mask) and the chunk's own (causal), merged by log-sum-exp, the two forms cuDNN's path
// takes (cudnn_attention_plan.h).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "src/trial/carver.h"
#include "src/trial/rows.h"
#include "src/trial/shard.h"

namespace autopar::trial {

class ContextAttention {
 public:
  // For shapes with cp > 1 or up > 1. Allocates the workspaces; kOom when they do not fit.
  static StatusOr<std::unique_ptr<ContextAttention>> Create(Device& device, const Shapes& s,
                                                            ProcessGroups& g);

  // qkv [T, qkv_cols] is the projection's output; writes qkv_ul [T·up, ul_cols] (RoPE applied),
  // the attention output o_ul [T·up, ul_heads·d] with its log-sum-exp lse (f32), and o
  // [T, q_cols]. With up == 1 there is no all-to-all: qkv must be qkv_ul and o must be o_ul.
  Status Forward(Tensor qkv, Tensor qkv_ul, Tensor o_ul, Tensor lse, Tensor o);
  // The attention core alone, for selective recompute.
  Status Core(Tensor qkv_ul, Tensor o_ul, Tensor lse);
  // d_o [T, q_cols] → dqkv [T, qkv_cols] (RoPE undone), given the final o_ul and lse.
  Status Backward(Tensor qkv_ul, Tensor o_ul, Tensor lse, Tensor d_o, Tensor dqkv);

 private:
  ContextAttention(Device& d, const Shapes& s, ProcessGroups& g) : dev_(d), s_(s), g_(g) {}
  // Carves the workspaces from `cc` (compute dtype) and `cs` (f32); returns the elements taken
  // of each (default Carvers only measure).
  std::pair<int64_t, int64_t> CarveWorkspaces(Carver cc, Carver cs);
  Status Rope(Tensor ul, bool backward);
  Status RingForward(Tensor qkv_ul, Tensor o_ul, Tensor lse);
  Status RingBackward(Tensor qkv_ul, Tensor o_ul, Tensor lse, Tensor do_ul, Tensor dqkv_ul);
  // The all-gather form: K and V of every cp rank into kv_seq_, in sequence order.
  Status GatherKv(Tensor qkv_ul);
  Status AllGatherForward(Tensor qkv_ul, Tensor o_ul, Tensor lse);
  Status AllGatherBackward(Tensor qkv_ul, Tensor o_ul, Tensor lse, Tensor do_ul, Tensor dqkv_ul);
  // The all-gather form's calls for query chunk qc: its key prefix's earlier chunks (none for the
  // sequence's first chunk) and its own chunk.
  std::vector<device::AttentionDesc> PrefixDescs(int qc) const;
  // The K and V views of `kv` (K/V rows in sequence order, or their gradients) that call `att`
  // reads.
  std::pair<Tensor, Tensor> KeysOf(const device::AttentionDesc& att, Tensor kv) const;
  // The causal descriptor of query chunk qc (0: first, 1: second) against kv chunk kc of the
  // block owned by cp rank `src`.
  device::AttentionDesc PairDesc(int qc, int src, int kc) const;
  int64_t ChunkStart(int cp_rank, int c) const;

  Device& dev_;
  const Shapes s_;
  ProcessGroups& g_;
  Buffer compute_, stats_;
  Tensor pack_, recv_, do_ul_, dqkv_ul_, kv_[3], dkv_[3], part_out_, part_lse_;
  // The all-gather form's K/V of every rank: as gathered (rank order; also dK/dV put back in
  // rank order for the reduce-scatter), in sequence order, and their gradients in sequence order.
  Tensor kv_ranks_, kv_seq_, dkv_seq_;
  IdLists ids_;
  size_t pack_qkv_ = 0, unpack_o_ = 0, pack_do_ = 0, kv_pack_ = 0, dkv_assemble_ = 0;
  size_t to_sequence_ = 0, to_ranks_ = 0;  // the all-gather form's reorders
  std::vector<size_t> unpack_dqkv_;  // one list per replica of a kv head
};

}  // namespace autopar::trial
