#include "src/trial/context_attention.h"

#include <utility>
#include <vector>

#include "src/trial/carver.h"

namespace autopar::trial {
namespace {

using device::AttentionDesc;
using device::DType;
using device::OkStatus;
using device::P2POp;

constexpr int kKvTag = 101, kDkvTag = 102;  // ring messages on the cp group

// Index lists of the row gathers (rows.h), in units of head_dim-wide blocks.

// The first of the kv heads Ulysses rank u reads.
int64_t FirstKvHead(const Shapes& s, int64_t u) {
  const int64_t group = s.heads / s.kv_heads;
  return s.kv_heads >= s.up ? u * s.ul_kv_heads : u * s.ul_heads / group;
}

// Forward all-to-all: block u of the send buffer is [T rows, the columns of up rank u].
std::vector<int32_t> UlyssesPackQkv(const Shapes& s) {
  const int64_t Hq = s.heads, Hkv = s.kv_heads, Hu = s.ul_heads, kvu = s.ul_kv_heads;
  const int64_t ul_blocks = s.ul_cols / s.head_dim, qkv_blocks = s.qkv_cols / s.head_dim;
  std::vector<int32_t> pack;
  for (int64_t u = 0; u < s.up; ++u) {
    for (int64_t r = 0; r < s.tokens; ++r) {
      for (int64_t b = 0; b < ul_blocks; ++b) {
        const int64_t col = b < Hu         ? u * Hu + b
                            : b < Hu + kvu ? Hq + FirstKvHead(s, u) + b - Hu
                                           : Hq + Hkv + FirstKvHead(s, u) + b - Hu - kvu;
        pack.push_back(static_cast<int32_t>(r * qkv_blocks + col));
      }
    }
  }
  return pack;
}

// The output comes back as [source u][T rows][u's heads]: o's head block u·Hu + i.
std::vector<int32_t> UlyssesUnpackO(const Shapes& s) {
  const int64_t T = s.tokens, Hu = s.ul_heads;
  std::vector<int32_t> unpack_o;
  for (int64_t r = 0; r < T; ++r) {
    for (int64_t b = 0; b < s.heads; ++b) {
      unpack_o.push_back(static_cast<int32_t>(((b / Hu) * T + r) * Hu + b % Hu));
    }
  }
  return unpack_o;
}

// The output's gradient sent back the same way: [up rank u][T rows][u's heads].
std::vector<int32_t> UlyssesPackDo(const Shapes& s) {
  const int64_t Hu = s.ul_heads;
  std::vector<int32_t> pack_do;
  for (int64_t u = 0; u < s.up; ++u) {
    for (int64_t r = 0; r < s.tokens; ++r) {
      for (int64_t i = 0; i < Hu; ++i) {
        pack_do.push_back(static_cast<int32_t>(r * s.heads + u * Hu + i));
      }
    }
  }
  return pack_do;
}

// Backward all-to-all: [source u][T rows][ul columns] back into [T, q | k | v]. A kv head that
// several up ranks read gets one gradient from each: one list per replica `rep`, summed.
std::vector<int32_t> UlyssesUnpackDqkv(const Shapes& s, int64_t rep) {
  const int64_t T = s.tokens, U = s.up;
  const int64_t Hq = s.heads, Hkv = s.kv_heads, Hu = s.ul_heads, kvu = s.ul_kv_heads;
  const int64_t ul_blocks = s.ul_cols / s.head_dim, qkv_blocks = s.qkv_cols / s.head_dim;
  const int64_t none = U * T * ul_blocks;
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < T; ++r) {
    for (int64_t b = 0; b < qkv_blocks; ++b) {
      if (b < Hq) {
        ids.push_back(
            static_cast<int32_t>(rep == 0 ? ((b / Hu) * T + r) * ul_blocks + b % Hu : none));
        continue;
      }
      const bool is_v = b >= Hq + Hkv;
      const int64_t head = b - Hq - (is_v ? Hkv : 0);
      int64_t seen = 0, src = 0;
      for (int64_t u = 0; u < U; ++u) {
        if (FirstKvHead(s, u) <= head && head < FirstKvHead(s, u) + kvu && seen++ == rep) src = u;
      }
      ids.push_back(static_cast<int32_t>((src * T + r) * ul_blocks + Hu + (is_v ? kvu : 0) + head -
                                         FirstKvHead(s, src)));
    }
  }
  return ids;
}

// K and V of the rank's rows packed for the ring.
std::vector<int32_t> RingKvPack(const Shapes& s) {
  const int64_t ul_blocks = s.ul_cols / s.head_dim;
  std::vector<int32_t> kv_pack;
  for (int64_t r = 0; r < s.tokens * s.up; ++r) {
    for (int64_t i = 0; i < 2 * s.ul_kv_heads; ++i) {
      kv_pack.push_back(static_cast<int32_t>(r * ul_blocks + s.ul_heads + i));
    }
  }
  return kv_pack;
}

// The ring's dK/dV placed back beside dq (the q blocks take an id past the end: a zero row).
std::vector<int32_t> RingDkvAssemble(const Shapes& s) {
  const int64_t Tcp = s.tokens * s.up, Hu = s.ul_heads, kvu = s.ul_kv_heads;
  const int64_t ul_blocks = s.ul_cols / s.head_dim;
  std::vector<int32_t> assemble;
  for (int64_t r = 0; r < Tcp; ++r) {
    for (int64_t b = 0; b < ul_blocks; ++b) {
      assemble.push_back(static_cast<int32_t>(b < Hu ? Tcp * 2 * kvu : r * 2 * kvu + b - Hu));
    }
  }
  return assemble;
}

// The all-gather form's reorders, in rows of K/V: the gathered blocks (rank r's chunks r and
// 2·cp − 1 − r) into sequence order, and back.
int64_t ChunkOwner(const Shapes& s, int64_t g) { return g < s.cp ? g : 2 * s.cp - 1 - g; }

std::vector<int32_t> GatheredToSequence(const Shapes& s) {
  const int64_t chunk_rows = s.chunk * s.mbs;
  std::vector<int32_t> ids;
  for (int64_t g = 0; g < 2 * s.cp; ++g) {
    const int64_t first = ChunkOwner(s, g) * 2 * chunk_rows + (g < s.cp ? 0 : chunk_rows);
    for (int64_t i = 0; i < chunk_rows; ++i) ids.push_back(static_cast<int32_t>(first + i));
  }
  return ids;
}

std::vector<int32_t> SequenceToRanks(const Shapes& s) {
  const int64_t chunk_rows = s.chunk * s.mbs;
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < s.cp; ++r) {
    for (const int64_t g : {r, 2 * s.cp - 1 - r}) {
      for (int64_t i = 0; i < chunk_rows; ++i) {
        ids.push_back(static_cast<int32_t>(g * chunk_rows + i));
      }
    }
  }
  return ids;
}

}  // namespace

StatusOr<std::unique_ptr<ContextAttention>> ContextAttention::Create(Device& device,
                                                                     const Shapes& s,
                                                                     ProcessGroups& g) {
  std::unique_ptr<ContextAttention> a(new ContextAttention(device, s, g));
  // Workspaces: measured, then allocated and carved.
  const auto [compute, stats] = a->CarveWorkspaces(Carver(), Carver());
  AUTOPAR_ASSIGN_OR_RETURN(a->compute_, device.Allocate(compute, device.compute_dtype()));
  AUTOPAR_ASSIGN_OR_RETURN(a->stats_, device.Allocate(std::max<int64_t>(stats, 1), DType::kF32));
  a->CarveWorkspaces(Carver(a->compute_.tensor()), Carver(a->stats_.tensor()));
  if (s.up > 1) {
    a->pack_qkv_ = a->ids_.Add(UlyssesPackQkv(s));
    a->unpack_o_ = a->ids_.Add(UlyssesUnpackO(s));
    a->pack_do_ = a->ids_.Add(UlyssesPackDo(s));
    const int64_t replicas = s.up * s.ul_kv_heads / s.kv_heads;
    for (int64_t rep = 0; rep < replicas; ++rep) {
      a->unpack_dqkv_.push_back(a->ids_.Add(UlyssesUnpackDqkv(s, rep)));
    }
  }
  if (s.cp > 1) {
    a->kv_pack_ = a->ids_.Add(RingKvPack(s));
    a->dkv_assemble_ = a->ids_.Add(RingDkvAssemble(s));
  }
  if (s.cp > 1 && s.cp_allgather) {
    a->to_sequence_ = a->ids_.Add(GatheredToSequence(s));
    a->to_ranks_ = a->ids_.Add(SequenceToRanks(s));
  }
  AUTOPAR_RETURN_IF_ERROR(a->ids_.Upload(device));
  return a;
}

std::pair<int64_t, int64_t> ContextAttention::CarveWorkspaces(Carver cc, Carver cs) {
  const int64_t Tcp = s_.tokens * s_.up, d = s_.head_dim, Hu = s_.ul_heads;
  const int64_t kv_cols = 2 * s_.ul_kv_heads * d, chunk_rows = s_.chunk * s_.mbs;
  pack_ = cc.Take(Tcp * s_.ul_cols);
  if (s_.up > 1) {
    recv_ = cc.Take(Tcp * s_.ul_cols);
    do_ul_ = cc.Take(Tcp * Hu * d);
    dqkv_ul_ = cc.Take(Tcp * s_.ul_cols);
  }
  if (s_.cp > 1 && s_.cp_allgather) {
    // The own K/V and its reduced gradient; every rank's, three ways (GatherKv, the backward).
    kv_[0] = cc.Take(Tcp * kv_cols);
    dkv_[0] = cc.Take(Tcp * kv_cols);
    kv_ranks_ = cc.Take(s_.cp * Tcp * kv_cols);
    kv_seq_ = cc.Take(s_.cp * Tcp * kv_cols);
    dkv_seq_ = cc.Take(s_.cp * Tcp * kv_cols);
  } else if (s_.cp > 1) {
    for (Tensor& t : kv_) t = cc.Take(Tcp * kv_cols);
    for (Tensor& t : dkv_) t = cc.Take(Tcp * kv_cols);
  }
  if (s_.cp > 1) {
    part_out_ = cc.Take(chunk_rows * Hu * d);
    part_lse_ = cs.Take(chunk_rows * Hu);
  }
  return std::pair{cc.used(), cs.used()};
}

int64_t ContextAttention::ChunkStart(int cp_rank, int c) const {
  return (c == 0 ? cp_rank : 2 * s_.cp - 1 - cp_rank) * s_.chunk;
}

AttentionDesc ContextAttention::PairDesc(int qc, int src, int kc) const {
  AttentionDesc d;
  d.batch = s_.mbs;
  d.heads_q = s_.ul_heads;
  d.heads_kv = s_.ul_kv_heads;
  d.head_dim = s_.head_dim;
  d.seq_q = d.seq_kv = s_.chunk;
  d.q_offset = ChunkStart(g_.at.cp, qc);
  d.kv_offset = ChunkStart(src, kc);
  d.q_stride = s_.ul_cols;
  d.kv_stride = 2 * s_.ul_kv_heads * s_.head_dim;
  return d;
}

// RoPE on the ul layout by global positions: one run of rows per chunk.
Status ContextAttention::Rope(Tensor ul, bool backward) {
  if (!s_.rope) return OkStatus();
  const int64_t d = s_.head_dim, chunk_rows = s_.chunk * s_.mbs;
  const int chunks = s_.cp > 1 ? 2 : 1;
  for (int c = 0; c < chunks; ++c) {
    device::RopeDesc r;
    r.seq = chunks == 2 ? s_.chunk : 2 * s_.chunk;
    r.batch = s_.mbs;
    r.head_dim = d;
    r.row_stride = s_.ul_cols;
    r.position_offset = chunks == 2 ? ChunkStart(g_.at.cp, c) : 0;
    const int64_t row0 = c * chunk_rows * s_.ul_cols;
    for (auto [col, heads] :
         {std::pair{int64_t{0}, s_.ul_heads}, std::pair{s_.ul_heads * d, s_.ul_kv_heads}}) {
      r.heads = heads;
      const Tensor x = ul.Slice(row0 + col, ul.numel - row0 - col);
      AUTOPAR_RETURN_IF_ERROR(backward ? dev_.RopeBackward(r, x, x) : dev_.RopeForward(r, x, x));
    }
  }
  return OkStatus();
}

Status ContextAttention::Forward(Tensor qkv, Tensor qkv_ul, Tensor o_ul, Tensor lse, Tensor o) {
  const int64_t Tcp = s_.tokens * s_.up, d = s_.head_dim;
  if (s_.up > 1) {
    const Tensor send = pack_.Slice(0, Tcp * s_.ul_cols);
    AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, qkv, d, ids_[pack_qkv_], send));
    AUTOPAR_RETURN_IF_ERROR(g_.up.AllToAll(send, qkv_ul.Slice(0, Tcp * s_.ul_cols)));
  }
  AUTOPAR_RETURN_IF_ERROR(Rope(qkv_ul, false));
  AUTOPAR_RETURN_IF_ERROR(Core(qkv_ul, o_ul, lse));
  if (s_.up == 1) return OkStatus();
  const Tensor back = recv_.Slice(0, Tcp * s_.ul_heads * d);
  AUTOPAR_RETURN_IF_ERROR(g_.up.AllToAll(o_ul.Slice(0, back.numel), back));
  return PickRows(dev_, back, d, ids_[unpack_o_], o);
}

Status ContextAttention::Core(Tensor qkv_ul, Tensor o_ul, Tensor lse) {
  if (s_.cp > 1 && s_.cp_allgather) return AllGatherForward(qkv_ul, o_ul, lse);
  if (s_.cp > 1) return RingForward(qkv_ul, o_ul, lse);
  AttentionDesc att = PairDesc(0, 0, 0);
  att.seq_q = att.seq_kv = 2 * s_.chunk;  // the whole sequence, positions from 0
  att.kv_stride = s_.ul_cols;
  const int64_t n = qkv_ul.numel, d = s_.head_dim;
  return dev_.AttentionForward(
      att, qkv_ul, qkv_ul.Slice(s_.ul_heads * d, n - s_.ul_heads * d),
      qkv_ul.Slice((s_.ul_heads + s_.ul_kv_heads) * d, n - (s_.ul_heads + s_.ul_kv_heads) * d),
      o_ul, lse);
}

Status ContextAttention::Backward(Tensor qkv_ul, Tensor o_ul, Tensor lse, Tensor d_o, Tensor dqkv) {
  const int64_t Tcp = s_.tokens * s_.up, d = s_.head_dim;
  Tensor do_ul = d_o, dqkv_ul = dqkv;
  if (s_.up > 1) {
    const Tensor send = pack_.Slice(0, Tcp * s_.ul_heads * d);
    AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, d_o, d, ids_[pack_do_], send));
    AUTOPAR_RETURN_IF_ERROR(g_.up.AllToAll(send, do_ul_));
    do_ul = do_ul_;
    dqkv_ul = dqkv_ul_;
  }
  if (s_.cp > 1 && s_.cp_allgather) {
    AUTOPAR_RETURN_IF_ERROR(AllGatherBackward(qkv_ul, o_ul, lse, do_ul, dqkv_ul));
  } else if (s_.cp > 1) {
    AUTOPAR_RETURN_IF_ERROR(RingBackward(qkv_ul, o_ul, lse, do_ul, dqkv_ul));
  } else {
    AttentionDesc att = PairDesc(0, 0, 0);
    att.seq_q = att.seq_kv = 2 * s_.chunk;
    att.kv_stride = s_.ul_cols;
    const int64_t k_off = s_.ul_heads * d, v_off = (s_.ul_heads + s_.ul_kv_heads) * d;
    const int64_t n = qkv_ul.numel, dn = dqkv_ul.numel;
    AUTOPAR_RETURN_IF_ERROR(dev_.AttentionBackward(
        att, qkv_ul, qkv_ul.Slice(k_off, n - k_off), qkv_ul.Slice(v_off, n - v_off), o_ul, do_ul,
        lse, dqkv_ul, dqkv_ul.Slice(k_off, dn - k_off), dqkv_ul.Slice(v_off, dn - v_off), false));
  }
  AUTOPAR_RETURN_IF_ERROR(Rope(dqkv_ul, true));
  if (s_.up == 1) return OkStatus();
  const Tensor back = recv_.Slice(0, Tcp * s_.ul_cols);
  AUTOPAR_RETURN_IF_ERROR(g_.up.AllToAll(dqkv_ul.Slice(0, back.numel), back));
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, back, d, ids_[unpack_dqkv_[0]], dqkv));
  for (size_t rep = 1; rep < unpack_dqkv_.size(); ++rep) {
    const Tensor more = pack_.Slice(0, dqkv.numel);
    AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, back, d, ids_[unpack_dqkv_[rep]], more));
    AUTOPAR_RETURN_IF_ERROR(dev_.Add(dqkv, more, dqkv));
  }
  return OkStatus();
}

namespace {
// The chunk pairs a step computes, by global positions: the own block is causal within and
// between its chunks; an earlier rank's block is seen (first chunk only) by both query chunks;
// a later rank's block (both chunks) only by the second query chunk.
struct Pair {
  int q, kv;
};
std::vector<Pair> VisiblePairs(int step, int src, int me) {
  if (step == 0) return {{0, 0}, {1, 0}, {1, 1}};
  if (src < me) return {{0, 0}, {1, 0}};
  return {{1, 0}, {1, 1}};
}
}  // namespace

Status ContextAttention::RingForward(Tensor qkv_ul, Tensor o_ul, Tensor lse) {
  const int cp = static_cast<int>(s_.cp), me = g_.at.cp;
  const int next = (me + 1) % cp, prev = (me + cp - 1) % cp;
  const int64_t d = s_.head_dim, Hu = s_.ul_heads, kvu = s_.ul_kv_heads;
  const int64_t chunk_rows = s_.chunk * s_.mbs, kv_cols = 2 * kvu * d;
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, qkv_ul, d, ids_[kv_pack_], kv_[0]));
  bool written[2] = {false, false};
  std::unique_ptr<device::Request> ring;
  for (int step = 0; step < cp; ++step) {
    const int src = (me - step + cp) % cp;
    const Tensor cur = kv_[step == 0 ? 0 : 1 + (step - 1) % 2];
    if (step + 1 < cp) {  // the next block travels while this one is computed, as one group
      const P2POp shift[] = {{P2POp::kSend, cur, next, kKvTag},
                             {P2POp::kRecv, kv_[1 + step % 2], prev, kKvTag}};
      AUTOPAR_RETURN_IF_ERROR(g_.cp.StartSendRecv(shift, ring));
    }
    for (const Pair p : VisiblePairs(step, src, me)) {
      const AttentionDesc att = PairDesc(p.q, src, p.kv);
      const Tensor q = qkv_ul.Slice(p.q * chunk_rows * s_.ul_cols, chunk_rows * s_.ul_cols);
      const int64_t k0 = p.kv * chunk_rows * kv_cols;
      const Tensor k = cur.Slice(k0, chunk_rows * kv_cols);
      const Tensor v = cur.Slice(k0 + kvu * d, chunk_rows * kv_cols - kvu * d);
      const Tensor out = o_ul.Slice(p.q * chunk_rows * Hu * d, chunk_rows * Hu * d);
      const Tensor out_lse = lse.Slice(p.q * chunk_rows * Hu, chunk_rows * Hu);
      if (!written[p.q]) {
        AUTOPAR_RETURN_IF_ERROR(dev_.AttentionForward(att, q, k, v, out, out_lse));
        written[p.q] = true;
        continue;
      }
      AUTOPAR_RETURN_IF_ERROR(dev_.AttentionForward(att, q, k, v, part_out_, part_lse_));
      AUTOPAR_RETURN_IF_ERROR(
          dev_.AttentionMerge(chunk_rows * Hu, d, out, out_lse, part_out_, part_lse_));
    }
    AUTOPAR_RETURN_IF_ERROR(g_.cp.Wait(ring));
  }
  return OkStatus();
}

Status ContextAttention::RingBackward(Tensor qkv_ul, Tensor o_ul, Tensor lse, Tensor do_ul,
                                      Tensor dqkv_ul) {
  const int cp = static_cast<int>(s_.cp), me = g_.at.cp;
  const int next = (me + 1) % cp, prev = (me + cp - 1) % cp;
  const int64_t d = s_.head_dim, Hu = s_.ul_heads, kvu = s_.ul_kv_heads;
  const int64_t chunk_rows = s_.chunk * s_.mbs, kv_cols = 2 * kvu * d;
  AUTOPAR_RETURN_IF_ERROR(dev_.Fill(dqkv_ul, 0.0f));
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, qkv_ul, d, ids_[kv_pack_], kv_[0]));
  // dK/dV of the block at hand: this rank's part goes into dkv_[step % 2], the part the earlier
  // ranks of the ring accumulated arrives in dkv_[2], and the sum moves on to the next rank.
  // Each step's transfers are one group: the next K/V block, and the previous step's dK/dV sum
  // out and the one this step adds to in. A lone dK/dV send after the compute would wait on NCCL
  // for a receive that the next rank queues behind its own lone send: a cycle around the ring.
  std::unique_ptr<device::Request> ring;
  const Tensor incoming = dkv_[2];
  for (int step = 0; step < cp; ++step) {
    const int src = (me - step + cp) % cp;
    const Tensor cur = kv_[step == 0 ? 0 : 1 + (step - 1) % 2];
    P2POp shift[4];
    size_t n = 0;
    if (step + 1 < cp) {
      shift[n++] = {P2POp::kSend, cur, next, kKvTag};
      shift[n++] = {P2POp::kRecv, kv_[1 + step % 2], prev, kKvTag};
    }
    if (step > 0) {
      shift[n++] = {P2POp::kSend, dkv_[(step - 1) % 2], next, kDkvTag};
      shift[n++] = {P2POp::kRecv, incoming, prev, kDkvTag};
    }
    AUTOPAR_RETURN_IF_ERROR(g_.cp.StartSendRecv(std::span(shift, n), ring));
    const Tensor part = dkv_[step % 2];
    AUTOPAR_RETURN_IF_ERROR(dev_.Fill(part, 0.0f));
    for (const Pair p : VisiblePairs(step, src, me)) {
      const AttentionDesc att = PairDesc(p.q, src, p.kv);
      const int64_t q0 = p.q * chunk_rows * s_.ul_cols, k0 = p.kv * chunk_rows * kv_cols;
      const int64_t o0 = p.q * chunk_rows * Hu * d;
      const Tensor q = qkv_ul.Slice(q0, chunk_rows * s_.ul_cols);
      const Tensor dq = dqkv_ul.Slice(q0, chunk_rows * s_.ul_cols);
      const Tensor k = cur.Slice(k0, chunk_rows * kv_cols);
      const Tensor v = cur.Slice(k0 + kvu * d, chunk_rows * kv_cols - kvu * d);
      const Tensor dk = part.Slice(k0, chunk_rows * kv_cols);
      const Tensor dv = part.Slice(k0 + kvu * d, chunk_rows * kv_cols - kvu * d);
      AUTOPAR_RETURN_IF_ERROR(dev_.AttentionBackward(
          att, q, k, v, o_ul.Slice(o0, chunk_rows * Hu * d), do_ul.Slice(o0, chunk_rows * Hu * d),
          lse.Slice(p.q * chunk_rows * Hu, chunk_rows * Hu), dq, dk, dv, true));
    }
    AUTOPAR_RETURN_IF_ERROR(g_.cp.Wait(ring));
    if (step > 0) AUTOPAR_RETURN_IF_ERROR(dev_.Add(part, incoming, part));
  }
  // The last hop brings this rank's own block's gradient home.
  const P2POp home[] = {{P2POp::kSend, dkv_[(cp - 1) % 2], next, kDkvTag},
                        {P2POp::kRecv, incoming, prev, kDkvTag}};
  AUTOPAR_RETURN_IF_ERROR(g_.cp.SendRecv(home));
  const Tensor placed = pack_.Slice(0, dqkv_ul.numel);
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, incoming, d, ids_[dkv_assemble_], placed));
  return dev_.Add(dqkv_ul, placed, dqkv_ul);
}

std::vector<AttentionDesc> ContextAttention::PrefixDescs(int qc) const {
  const AttentionDesc own = PairDesc(qc, g_.at.cp, qc);
  if (own.q_offset == 0) return {own};
  AttentionDesc prefix = own;  // every key before the chunk's first query: nothing masked
  prefix.kv_offset = 0;
  prefix.seq_kv = own.q_offset;
  return {own, prefix};
}

std::pair<Tensor, Tensor> ContextAttention::KeysOf(const AttentionDesc& att, Tensor kv) const {
  const int64_t vd = s_.ul_kv_heads * s_.head_dim, kv_cols = 2 * vd;
  const int64_t k0 = att.kv_offset * s_.mbs * kv_cols, n = att.seq_kv * s_.mbs * kv_cols;
  return {kv.Slice(k0, n), kv.Slice(k0 + vd, n - vd)};
}

Status ContextAttention::GatherKv(Tensor qkv_ul) {
  const int64_t kv_cols = 2 * s_.ul_kv_heads * s_.head_dim;
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, qkv_ul, s_.head_dim, ids_[kv_pack_], kv_[0]));
  AUTOPAR_RETURN_IF_ERROR(g_.cp.AllGather(kv_[0], kv_ranks_));
  return PickRows(dev_, kv_ranks_, kv_cols, ids_[to_sequence_], kv_seq_);
}

Status ContextAttention::AllGatherForward(Tensor qkv_ul, Tensor o_ul, Tensor lse) {
  const int64_t d = s_.head_dim, Hu = s_.ul_heads, chunk_rows = s_.chunk * s_.mbs;
  AUTOPAR_RETURN_IF_ERROR(GatherKv(qkv_ul));
  for (int qc = 0; qc < 2; ++qc) {
    const Tensor q = qkv_ul.Slice(qc * chunk_rows * s_.ul_cols, chunk_rows * s_.ul_cols);
    const Tensor out = o_ul.Slice(qc * chunk_rows * Hu * d, chunk_rows * Hu * d);
    const Tensor out_lse = lse.Slice(qc * chunk_rows * Hu, chunk_rows * Hu);
    bool written = false;
    for (const AttentionDesc& att : PrefixDescs(qc)) {
      const auto [k, v] = KeysOf(att, kv_seq_);
      if (!written) {
        AUTOPAR_RETURN_IF_ERROR(dev_.AttentionForward(att, q, k, v, out, out_lse));
        written = true;
        continue;
      }
      AUTOPAR_RETURN_IF_ERROR(dev_.AttentionForward(att, q, k, v, part_out_, part_lse_));
      AUTOPAR_RETURN_IF_ERROR(
          dev_.AttentionMerge(chunk_rows * Hu, d, out, out_lse, part_out_, part_lse_));
    }
  }
  return OkStatus();
}

Status ContextAttention::AllGatherBackward(Tensor qkv_ul, Tensor o_ul, Tensor lse, Tensor do_ul,
                                           Tensor dqkv_ul) {
  const int64_t d = s_.head_dim, Hu = s_.ul_heads, kvu = s_.ul_kv_heads;
  const int64_t chunk_rows = s_.chunk * s_.mbs, kv_cols = 2 * kvu * d;
  AUTOPAR_RETURN_IF_ERROR(dev_.Fill(dqkv_ul, 0.0f));
  AUTOPAR_RETURN_IF_ERROR(dev_.Fill(dkv_seq_, 0.0f));
  AUTOPAR_RETURN_IF_ERROR(GatherKv(qkv_ul));
  for (int qc = 0; qc < 2; ++qc) {
    const int64_t q0 = qc * chunk_rows * s_.ul_cols, o0 = qc * chunk_rows * Hu * d;
    const Tensor q = qkv_ul.Slice(q0, chunk_rows * s_.ul_cols);
    const Tensor dq = dqkv_ul.Slice(q0, chunk_rows * s_.ul_cols);
    for (const AttentionDesc& att : PrefixDescs(qc)) {
      const auto [k, v] = KeysOf(att, kv_seq_);
      const auto [dk, dv] = KeysOf(att, dkv_seq_);
      AUTOPAR_RETURN_IF_ERROR(dev_.AttentionBackward(
          att, q, k, v, o_ul.Slice(o0, chunk_rows * Hu * d), do_ul.Slice(o0, chunk_rows * Hu * d),
          lse.Slice(qc * chunk_rows * Hu, chunk_rows * Hu), dq, dk, dv, true));
    }
  }
  // dK/dV back in rank order (in the gathered buffer, free now), each rank's share summed home.
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, dkv_seq_, kv_cols, ids_[to_ranks_], kv_ranks_));
  AUTOPAR_RETURN_IF_ERROR(g_.cp.ReduceScatter(kv_ranks_, dkv_[0]));
  const Tensor placed = pack_.Slice(0, dqkv_ul.numel);
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, dkv_[0], d, ids_[dkv_assemble_], placed));
  return dev_.Add(dqkv_ul, placed, dqkv_ul);
}

}  // namespace autopar::trial
