#include "src/trial/shard.h"

#include <algorithm>
#include <cstring>

#include "kernels/init.h"

namespace autopar::trial {
namespace {

using backend::DType;
using backend::OkStatus;
using backend::Outcome;

constexpr float kInitScale = 0.02f;

// Seeds of the global parameter matrices: a pure function of (seed, kind, layer).
enum Kind : uint64_t { kQ = 1, kK, kV, kProj, kGate, kUp, kFc2, kWord, kPos, kOutput };
uint64_t SeedOf(uint64_t seed, Kind kind, int64_t layer) {
  return kernels::ref::SplitMix64(seed ^ (static_cast<uint64_t>(kind) << 40) ^
                                  (static_cast<uint64_t>(layer) * 0x9E3779B97F4A7C15ull));
}

// Initialises elements [begin, begin + target.numel) of the flat parameter vector into `target`
// (the whole weights, or a dp rank's share of the fp32 master copy). Hash-filled pieces are made
// in row blocks of a scratch buffer of the target's dtype, so a share may start mid-row.
Status FillPieces(Device& device, const std::vector<Piece>& pieces, Tensor target, int64_t begin) {
  const int64_t end = begin + target.numel;
  for (const Piece& p : pieces) {
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    const Tensor out = target.Slice(lo - begin, hi - lo);
    if (p.init != Piece::kHash) {
      AUTOPAR_RETURN_IF_ERROR(device.Fill(out, p.init == Piece::kOnes ? 1.0f : 0.0f));
      continue;
    }
    if (lo == p.offset && hi == p.offset + p.numel) {
      AUTOPAR_RETURN_IF_ERROR(device.FillHash(
          out, {p.seed, kInitScale, p.rows, p.cols, p.global_cols, p.row_offset, p.col_offset}));
      continue;
    }
    const int64_t block_rows = std::max<int64_t>(1, (int64_t{1} << 20) / p.cols);
    AUTOPAR_ASSIGN_OR_RETURN(Buffer scratch, device.Allocate(block_rows * p.cols, target.dtype));
    for (int64_t r = (lo - p.offset) / p.cols; r * p.cols < hi - p.offset; r += block_rows) {
      const int64_t rows = std::min(block_rows, p.rows - r);
      const Tensor block = scratch.tensor().Slice(0, rows * p.cols);
      AUTOPAR_RETURN_IF_ERROR(device.FillHash(block, {p.seed, kInitScale, rows, p.cols,
                                                      p.global_cols, p.row_offset + r,
                                                      p.col_offset}));
      const int64_t block_lo = std::max(lo, p.offset + r * p.cols);
      const int64_t block_hi = std::min(hi, p.offset + (r + rows) * p.cols);
      AUTOPAR_RETURN_IF_ERROR(
          device.Copy(target.Slice(block_lo - begin, block_hi - block_lo),
                      block.Slice(block_lo - p.offset - r * p.cols, block_hi - block_lo)));
    }
  }
  return OkStatus();
}

}  // namespace

Coordinates Coordinates::Of(int rank, const ParallelConfig& c) {
  Coordinates at;
  at.tp = rank % c.tp;
  rank /= c.tp;
  at.up = rank % c.up;
  rank /= c.up;
  at.cp = rank % c.cp;
  rank /= c.cp;
  at.dp = rank % c.dp;
  at.pp = rank / c.dp;
  return at;
}

StatusOr<ProcessGroups> ProcessGroups::Create(backend::Backend& backend,
                                              const backend::Group& world,
                                              const ParallelConfig& c, Deadline deadline) {
  ProcessGroups g;
  const int rank = world.rank();
  g.at = Coordinates::Of(rank, c);
  const int tp_stride = 1, dp_stride = c.tp * c.up * c.cp, pp_stride = dp_stride * c.dp;
  // A group along one dimension: the ranks that differ only in that coordinate.
  auto along = [&](int coordinate, int stride, Comm& out) -> Status {
    AUTOPAR_ASSIGN_OR_RETURN(backend::Group group, world.Split(rank - coordinate * stride,
                                                               coordinate));
    AUTOPAR_ASSIGN_OR_RETURN(auto collectives, backend.Connect(group));
    out = Comm(std::move(collectives), deadline);
    return OkStatus();
  };
  AUTOPAR_RETURN_IF_ERROR(along(g.at.tp, tp_stride, g.tp));
  AUTOPAR_RETURN_IF_ERROR(along(g.at.dp, dp_stride, g.dp));
  AUTOPAR_RETURN_IF_ERROR(along(g.at.pp, pp_stride, g.pp));
  // The first and last pipeline stage share the (tied) word embedding.
  const bool end_stage = g.at.pp == 0 || g.at.pp == c.pp - 1;
  const int color = end_stage && c.pp > 1 ? rank - g.at.pp * pp_stride : -1;
  AUTOPAR_ASSIGN_OR_RETURN(backend::Group embedding, world.Split(color, g.at.pp));
  if (!embedding.empty()) {
    AUTOPAR_ASSIGN_OR_RETURN(auto collectives, backend.Connect(embedding));
    g.embedding = Comm(std::move(collectives), deadline);
  }
  return g;
}

Shapes Shapes::Of(const ModelSpec& m, const TrainSpec& t, const ParallelConfig& c, int tp_rank) {
  Shapes s{};
  s.tp = c.tp;
  s.pp = c.pp;
  s.vpp = c.vpp;
  s.mbs = c.mbs;
  s.seq = t.seq_length;
  s.tokens = s.mbs * s.seq;
  s.sp = c.sp;
  s.local_tokens = c.sp ? s.tokens / c.tp : s.tokens;
  s.hidden = m.hidden_size;
  s.head_dim = m.head_dim();
  s.heads = m.num_attention_heads / c.tp;
  s.kv_heads = m.num_query_groups / c.tp;
  s.q_cols = s.heads * s.head_dim;
  s.kv_cols = s.kv_heads * s.head_dim;
  s.qkv_cols = s.q_cols + 2 * s.kv_cols;
  s.swiglu = m.activation == Activation::kSwiGLU;
  s.ffn = m.ffn_hidden_size / c.tp;
  s.fc1_cols = s.swiglu ? 2 * s.ffn : s.ffn;
  s.vocab = m.vocab_size;
  s.vocab_shard = m.vocab_size / c.tp;
  s.vocab_start = tp_rank * s.vocab_shard;
  s.rmsnorm = m.norm == NormKind::kRMSNorm;
  s.rope = m.position_embedding == PositionEmbedding::kRope;
  s.learned_positions = !s.rope;
  s.max_positions = std::max<int64_t>(m.max_position_embeddings, t.seq_length);
  s.tied = !m.untie_embeddings;
  s.layers_per_chunk = m.num_layers / (int64_t{c.pp} * c.vpp);
  return s;
}

std::string Unsupported(const ModelSpec& m, const TrainSpec& t, const ParallelConfig& c) {
  if (c.cp > 1 || c.up > 1) return "context and Ulysses parallelism are not in the trial runner yet";
  if (m.is_moe() || c.ep > 1) return "mixture-of-experts layers are not in the trial runner yet";
  if (m.is_mla()) return "multi-head latent attention is not in the trial runner yet";
  if (m.num_query_groups % c.tp != 0) {
    return "the trial runner needs num_query_groups divisible by tp (no replicated kv heads)";
  }
  if (m.vocab_size % c.tp != 0) return "the trial runner needs vocab_size divisible by tp";
  if (c.sp && (int64_t{c.mbs} * t.seq_length) % c.tp != 0) {
    return "sequence parallelism needs the micro-batch's tokens divisible by tp";
  }
  return {};
}

StatusOr<ModelShard> ModelShard::Create(Device& device, const ModelSpec& m, const Shapes& s,
                                        const ParallelConfig& c, const Coordinates& at,
                                        uint64_t seed) {
  ModelShard shard;
  std::vector<Piece>& pieces = shard.pieces_;
  int64_t next = 0;
  // Reserves a piece; views are made once the flat buffers exist.
  auto add = [&](Piece p) {
    p.offset = next;
    if (p.numel == 0) p.numel = p.rows * p.cols;
    next += p.numel;
    pieces.push_back(p);
    return pieces.size() - 1;
  };
  auto norm = [&](bool bias) {
    return add({.numel = s.hidden, .init = bias ? Piece::kZeros : Piece::kOnes,
                .tp_replicated = true});
  };
  auto matrix = [&](uint64_t sd, int64_t rows, int64_t cols, int64_t global_cols,
                    int64_t row_offset, int64_t col_offset) {
    return add({.seed = sd, .init = Piece::kHash, .rows = rows, .cols = cols,
                .global_cols = global_cols, .row_offset = row_offset, .col_offset = col_offset});
  };
  const bool layernorm = !s.rmsnorm;
  const int64_t h = s.hidden;
  struct LayerIdx { size_t n1, n1b, q, proj, n2, n2b, fc1, fc2; };
  std::vector<std::vector<LayerIdx>> layer_idx(s.vpp);
  for (int chunk = 0; chunk < s.vpp; ++chunk) {
    const int64_t first = (int64_t{chunk} * s.pp + at.pp) * s.layers_per_chunk;
    for (int64_t j = 0; j < s.layers_per_chunk; ++j) {
      const int64_t layer = first + j;
      LayerIdx li{};
      li.n1 = norm(false);
      li.n1b = layernorm ? norm(true) : SIZE_MAX;
      li.q = matrix(SeedOf(seed, kQ, layer), s.q_cols, h, h, at.tp * s.q_cols, 0);
      matrix(SeedOf(seed, kK, layer), s.kv_cols, h, h, at.tp * s.kv_cols, 0);
      matrix(SeedOf(seed, kV, layer), s.kv_cols, h, h, at.tp * s.kv_cols, 0);
      li.proj = matrix(SeedOf(seed, kProj, layer), h, s.q_cols, s.q_cols * s.tp, 0,
                       at.tp * s.q_cols);
      li.n2 = norm(false);
      li.n2b = layernorm ? norm(true) : SIZE_MAX;
      li.fc1 = matrix(SeedOf(seed, kGate, layer), s.ffn, h, h, at.tp * s.ffn, 0);
      if (s.swiglu) matrix(SeedOf(seed, kUp, layer), s.ffn, h, h, at.tp * s.ffn, 0);
      li.fc2 = matrix(SeedOf(seed, kFc2, layer), h, s.ffn, s.ffn * s.tp, 0, at.tp * s.ffn);
      layer_idx[chunk].push_back(li);
    }
  }
  const bool first_stage = at.pp == 0, last_stage = at.pp == s.pp - 1;
  size_t word = SIZE_MAX, pos = SIZE_MAX, fnorm = SIZE_MAX, fnorm_b = SIZE_MAX, out = SIZE_MAX;
  if (first_stage) {
    word = matrix(SeedOf(seed, kWord, 0), s.vocab_shard, h, h, s.vocab_start, 0);
    if (s.learned_positions) {
      pos = matrix(SeedOf(seed, kPos, 0), s.max_positions, h, h, 0, 0);
      pieces[pos].tp_replicated = true;
    }
  }
  if (last_stage) {
    fnorm = norm(false);
    fnorm_b = layernorm ? norm(true) : SIZE_MAX;
    if (!s.tied) {
      out = matrix(SeedOf(seed, kOutput, 0), s.vocab_shard, h, h, s.vocab_start, 0);
    } else if (!first_stage) {
      out = matrix(SeedOf(seed, kWord, 0), s.vocab_shard, h, h, s.vocab_start, 0);
      pieces[out].duplicate = true;
    }
  }

  // Flat buffers, padded so the distributed optimizer can split them evenly over dp.
  const int64_t dp = c.dist_opt ? c.dp : 1;
  shard.padded_numel_ = (next + dp - 1) / dp * dp;
  const int64_t n = shard.padded_numel_;
  const DType compute = device.compute_dtype();
  shard.separate_master_ = compute != DType::kF32;
  AUTOPAR_ASSIGN_OR_RETURN(shard.weights_, device.Allocate(n, compute));
  AUTOPAR_ASSIGN_OR_RETURN(shard.grads_, device.Allocate(n, DType::kF32));
  const int64_t owned = n / dp;
  if (shard.separate_master_) {
    AUTOPAR_ASSIGN_OR_RETURN(shard.master_, device.Allocate(owned, DType::kF32));
  }
  AUTOPAR_ASSIGN_OR_RETURN(shard.exp_avg_, device.Allocate(owned, DType::kF32));
  AUTOPAR_ASSIGN_OR_RETURN(shard.exp_avg_sq_, device.Allocate(owned, DType::kF32));

  const Tensor w = shard.weights_.tensor(), g = shard.grads_.tensor();
  AUTOPAR_RETURN_IF_ERROR(device.Fill(w, 0.0f));
  AUTOPAR_RETURN_IF_ERROR(device.Fill(g, 0.0f));
  AUTOPAR_RETURN_IF_ERROR(device.Fill(shard.exp_avg_.tensor(), 0.0f));
  AUTOPAR_RETURN_IF_ERROR(device.Fill(shard.exp_avg_sq_.tensor(), 0.0f));
  AUTOPAR_RETURN_IF_ERROR(FillPieces(device, pieces, w, 0));
  if (shard.separate_master_) {
    // 16-bit compute keeps an fp32 master copy of this rank's share, from the same pure function.
    AUTOPAR_RETURN_IF_ERROR(
        FillPieces(device, pieces, shard.master_.tensor(), (c.dist_opt ? at.dp : 0) * owned));
  }
  shard.tied_ = s.tied;

  // Views: a parameter spans its consecutive pieces (q, k, v; gate, up).
  auto span = [&](size_t first, size_t count, Tensor base) {
    if (first == SIZE_MAX) return Tensor{};
    int64_t numel = 0;
    for (size_t i = first; i < first + count; ++i) numel += pieces[i].numel;
    return base.Slice(pieces[first].offset, numel);
  };
  shard.chunks.resize(s.vpp);
  for (int chunk = 0; chunk < s.vpp; ++chunk) {
    shard.chunks[chunk].first_layer = static_cast<int>((chunk * s.pp + at.pp) * s.layers_per_chunk);
    for (const LayerIdx& li : layer_idx[chunk]) {
      const size_t fc1_pieces = s.swiglu ? 2 : 1;
      LayerWeights lw;
      lw.norm1 = span(li.n1, 1, w);
      lw.norm1_bias = span(li.n1b, 1, w);
      lw.qkv = span(li.q, 3, w);
      lw.proj = span(li.proj, 1, w);
      lw.norm2 = span(li.n2, 1, w);
      lw.norm2_bias = span(li.n2b, 1, w);
      lw.fc1 = span(li.fc1, fc1_pieces, w);
      lw.fc2 = span(li.fc2, 1, w);
      lw.d_norm1 = span(li.n1, 1, g);
      lw.d_norm1_bias = span(li.n1b, 1, g);
      lw.d_qkv = span(li.q, 3, g);
      lw.d_proj = span(li.proj, 1, g);
      lw.d_norm2 = span(li.n2, 1, g);
      lw.d_norm2_bias = span(li.n2b, 1, g);
      lw.d_fc1 = span(li.fc1, fc1_pieces, g);
      lw.d_fc2 = span(li.fc2, 1, g);
      shard.chunks[chunk].layers.push_back(lw);
    }
  }
  shard.word_embedding = span(word, 1, w);
  shard.d_word_embedding = span(word, 1, g);
  shard.positions = span(pos, 1, w);
  shard.d_positions = span(pos, 1, g);
  shard.final_norm = span(fnorm, 1, w);
  shard.d_final_norm = span(fnorm, 1, g);
  shard.final_norm_bias = span(fnorm_b, 1, w);
  shard.d_final_norm_bias = span(fnorm_b, 1, g);
  if (last_stage && s.tied && first_stage) {
    shard.output = shard.word_embedding;
    shard.d_output = shard.d_word_embedding;
  } else {
    shard.output = span(out, 1, w);
    shard.d_output = span(out, 1, g);
  }
  return shard;
}

Status ModelShard::ZeroGrads(Device& device) { return device.Fill(grads_.tensor(), 0.0f); }

Status ModelShard::Step(Device& device, ProcessGroups& g, const ParallelConfig& c, float lr,
                        float eps, int64_t step) {
  const Tensor grads = grads_.tensor();
  if (c.sp) {
    // Under SP each tp rank saw a slice of the tokens: replicated parameters sum their grads.
    for (const Piece& p : pieces_) {
      if (p.tp_replicated) AUTOPAR_RETURN_IF_ERROR(g.tp.AllReduce(grads.Slice(p.offset, p.numel)));
    }
  }
  if (tied_ && g.embedding.active()) {
    // First and last stage both used the tied embedding: its gradient is their sum.
    AUTOPAR_RETURN_IF_ERROR(g.embedding.AllReduce(g.at.pp == 0 ? d_word_embedding : d_output));
  }
  backend::AdamParams adam;
  adam.lr = lr;
  adam.eps = eps;
  adam.step = step;
  const Tensor weights = weights_.tensor();
  // With 16-bit weights Adam updates the fp32 master copy and writes the weights from it.
  if (!c.dist_opt || c.dp == 1) {
    AUTOPAR_RETURN_IF_ERROR(g.dp.AllReduce(grads));
    if (separate_master_) {
      return device.AdamStep(adam, master_.tensor(), grads, exp_avg_.tensor(),
                             exp_avg_sq_.tensor(), weights);
    }
    return device.AdamStep(adam, weights, grads, exp_avg_.tensor(), exp_avg_sq_.tensor(), {});
  }
  // Distributed optimizer: each dp rank reduces, updates and gathers back its 1/dp of the
  // state, all in place in the flat buffers (Megatron-core's layout).
  const int64_t owned = padded_numel_ / c.dp;
  const Tensor mine = weights.Slice(g.at.dp * owned, owned);
  const Tensor my_grads = grads.Slice(g.at.dp * owned, owned);
  AUTOPAR_RETURN_IF_ERROR(g.dp.ReduceScatter(grads, my_grads));
  if (separate_master_) {
    AUTOPAR_RETURN_IF_ERROR(device.AdamStep(adam, master_.tensor(), my_grads, exp_avg_.tensor(),
                                            exp_avg_sq_.tensor(), mine));
  } else {
    AUTOPAR_RETURN_IF_ERROR(
        device.AdamStep(adam, mine, my_grads, exp_avg_.tensor(), exp_avg_sq_.tensor(), {}));
  }
  return g.dp.AllGather(mine, weights);
}

StatusOr<std::pair<double, double>> ModelShard::Fingerprint(Device& device, const Coordinates& at,
                                                            uint64_t seed) {
  double sum = 0, projection = 0;
  if (at.dp != 0) return std::pair{sum, projection};  // every dp replica holds the same weights
  // The weights on the host as floats: bf16 is the upper half of an fp32.
  const Tensor w = weights_.tensor();
  std::vector<float> host(static_cast<size_t>(w.numel));
  if (w.dtype == DType::kF32) {
    AUTOPAR_RETURN_IF_ERROR(device.CopyToHost(host.data(), w, w.bytes()));
  } else if (w.dtype == DType::kBF16) {
    std::vector<uint16_t> raw(host.size());
    AUTOPAR_RETURN_IF_ERROR(device.CopyToHost(raw.data(), w, w.bytes()));
    for (size_t i = 0; i < raw.size(); ++i) {
      const uint32_t bits = static_cast<uint32_t>(raw[i]) << 16;
      std::memcpy(&host[i], &bits, sizeof bits);
    }
  } else {
    return Status(Outcome::kInvalid, "fingerprint: weights must be f32 or bf16");
  }
  for (const Piece& p : pieces_) {
    if (p.duplicate || (p.tp_replicated && at.tp != 0)) continue;
    // Replicated norms have no matrix geometry: index them by position alone.
    const int64_t cols = p.cols > 0 ? p.cols : p.numel;
    const int64_t global_cols = p.global_cols > 0 ? p.global_cols : p.numel;
    const uint64_t key = kernels::ref::SplitMix64(seed ^ p.seed ^ 0xF1F1F1F1ull);
    for (int64_t i = 0; i < p.numel; ++i) {
      const int64_t r = i / cols, col = i % cols;
      const uint64_t index = static_cast<uint64_t>((p.row_offset + r) * global_cols +
                                                   p.col_offset + col);
      const double v = host[p.offset + i];
      sum += v;
      projection += v * kernels::ref::HashUniform(key, index);
    }
  }
  return std::pair{sum, projection};
}

}  // namespace autopar::trial
