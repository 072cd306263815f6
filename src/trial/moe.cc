#include "src/trial/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kernels/init.h"
#include "src/trial/linear.h"

namespace autopar::trial {
namespace {

using device::DType;
using device::OkStatus;
using device::Outcome;

// Host floats into a compute-dtype tensor (bf16: round to nearest even).
Status UploadCompute(Device& dev, Tensor dst, const std::vector<float>& v) {
  if (dst.dtype == DType::kF32) return dev.Upload(dst.Slice(0, static_cast<int64_t>(v.size())), v);
  if (dst.dtype != DType::kBF16) return Status(Outcome::kInvalid, "MoE: compute dtype f32 or bf16");
  std::vector<uint16_t> raw(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &v[i], sizeof bits);
    raw[i] = static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
  }
  return dev.CopyFromHost(dst, raw.data(), raw.size() * sizeof(uint16_t));
}

}  // namespace

StatusOr<std::unique_ptr<MoeLayer>> MoeLayer::Create(Device& device, const Shapes& s,
                                                     ProcessGroups& g, double samples_per_step) {
  std::unique_ptr<MoeLayer> m(new MoeLayer(device, s, g, samples_per_step));
  const int64_t Tr = s.tokens / s.tp, E = s.experts, k = s.topk, h = s.hidden;
  AUTOPAR_ASSIGN_OR_RETURN(m->compute_,
                           device.Allocate(Tr * h + Tr * E + Tr * k, device.compute_dtype()));
  AUTOPAR_ASSIGN_OR_RETURN(m->stats_,
                           device.Allocate(Tr * E + Tr * k + 2 * s.mbs * E, DType::kF32));
  AUTOPAR_ASSIGN_OR_RETURN(m->counts_, device.Allocate((2 + s.etp) * E, DType::kI32));
  const Tensor c = m->compute_.tensor(), f = m->stats_.tensor(), n = m->counts_.tensor();
  m->dx_ = c.Slice(0, Tr * h);
  m->dlogits_ = c.Slice(Tr * h, Tr * E);
  m->ones_ = c.Slice(Tr * h + Tr * E, Tr * k);
  m->logits_ = f.Slice(0, Tr * E);
  m->dgate_ = f.Slice(Tr * E, Tr * k);
  m->sample_stats_ = f.Slice(Tr * E + Tr * k, 2 * s.mbs * E);
  m->send_counts_ = n.Slice(0, E);
  m->recv_counts_ = n.Slice(E, E);
  m->all_counts_ = n.Slice(2 * E, s.etp * E);
  AUTOPAR_RETURN_IF_ERROR(device.Fill(m->ones_, 1.0f));
  return m;
}

double MoeLayer::TakeAuxLoss() {
  const double sum = aux_sum_;
  aux_sum_ = 0;
  return sum;
}

std::vector<int64_t> MoeLayer::Elements(const std::vector<int64_t>& rows, int64_t width) {
  std::vector<int64_t> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i] = rows[i] * width;
  return out;
}

StatusOr<std::vector<int32_t>> MoeLayer::ShareCounts(const std::vector<int32_t>& count) {
  const int64_t n = static_cast<int64_t>(count.size());
  std::vector<int32_t> recv(count);
  if (s_.experts / s_.local_experts > 1) {
    AUTOPAR_RETURN_IF_ERROR(dev_.Upload(send_counts_.Slice(0, n), count));
    AUTOPAR_RETURN_IF_ERROR(g_.ep.AllToAll(send_counts_.Slice(0, n), recv_counts_.Slice(0, n)));
    AUTOPAR_ASSIGN_OR_RETURN(recv, dev_.Download<int32_t>(recv_counts_.Slice(0, n)));
  }
  if (s_.etp == 1) return recv;
  AUTOPAR_RETURN_IF_ERROR(dev_.Upload(recv_counts_.Slice(0, n), recv));
  AUTOPAR_RETURN_IF_ERROR(
      etp_.AllGather(recv_counts_.Slice(0, n), all_counts_.Slice(0, s_.etp * n)));
  return dev_.Download<int32_t>(all_counts_.Slice(0, s_.etp * n));
}

namespace {

// Standard normal draws 2·pair and 2·pair + 1 of the stream (Box-Muller on the two 24-bit halves of
// one hash, the first in (0, 1]: |z| ≤ 5.8). One hash, one log and one sine and cosine for two:
// the host draws a logit per (token, expert) while the device waits.
void NormalPair(uint64_t stream, uint64_t pair, float* first, float* second) {
  const uint64_t h = kernels::ref::SplitMix64(stream + pair);
  const float u1 = static_cast<float>((h >> 40) + 1) * 0x1p-24f;
  const float u2 = static_cast<float>(h & 0xFFFFFF) * 0x1p-24f;
  const float r = std::sqrt(-2.0f * std::log(u1));
  const float angle = 6.28318530717958647692f * u2;
  *first = r * std::cos(angle);
  *second = r * std::sin(angle);
}

}  // namespace

void MoeLayer::DrawLogits(const RandomLogits& random, std::vector<float>& logits) const {
  const int64_t Tr = s_.tokens / s_.tp, E = s_.experts, mbs = s_.mbs;
  const uint64_t stream = kernels::ref::SplitMix64(random.layer_seed);
  const int64_t pairs = (E + 1) / 2;  // per token: experts 2j and 2j + 1 share pair j
  logits.resize(static_cast<size_t>(Tr * E));
  // Row r of the tensor-parallel region is (s, b) = (r / mbs, r % mbs), s this rank's position
  // of the sequence (GlobalPosition), b the micro-batch's sample; this tp rank routes rows
  // [tp·Tr, (tp + 1)·Tr).
  for (int64_t t = 0; t < Tr; ++t) {
    const int64_t r = g_.at.tp * Tr + t;
    const int64_t token =
        (random.first_sample + r % mbs) * s_.seq + GlobalPosition(s_, g_.at, r / mbs);
    float* row = logits.data() + t * E;
    for (int64_t e = 0; e < E; e += 2) {
      float second = 0;
      NormalPair(stream, static_cast<uint64_t>(token * pairs + e / 2), &row[e], &second);
      if (e + 1 < E) row[e + 1] = second;
    }
  }
}

// Router logits, top-k gates and the samples' load statistics.
Status MoeLayer::Route(const LayerWeights& w, MoeActs& a, Tensor x, bool count_aux,
                       const std::optional<RandomLogits>& random) {
  const int64_t Tr = s_.tokens / s_.tp, E = s_.experts, k = s_.topk, mbs = s_.mbs;
  // Megatron computes the gating before it replaces the logits, and so does this; the replaced
  // logits need not come to the host.
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Linear(Tr, E, s_.hidden), x, w.router, logits_));
  std::vector<float> logits;
  if (random) {
    DrawLogits(*random, logits);
  } else {
    AUTOPAR_ASSIGN_OR_RETURN(logits, dev_.Download<float>(logits_));
  }
  a.choice.assign(Tr * k, 0);
  a.gate.assign(Tr * k, 0.0f);
  a.probs.assign(Tr * E, 0.0f);
  std::vector<float> stats(2 * mbs * E, 0.0f);  // per sample: token counts, probability sums
  const int64_t row0 = g_.at.tp * Tr;
  std::vector<int32_t> order(E);
  // exp(z − max z), each once: the host's work, while the device waits.
  std::vector<double> scaled(E);
  for (int64_t t = 0; t < Tr; ++t) {
    const float* z = logits.data() + t * E;
    const double z_max = *std::max_element(z, z + E);
    double total = 0;
    for (int64_t e = 0; e < E; ++e) {
      scaled[e] = std::exp(z[e] - z_max);
      total += scaled[e];
    }
    const int64_t b = (row0 + t) % mbs;
    for (int64_t e = 0; e < E; ++e) {
      a.probs[t * E + e] = static_cast<float>(scaled[e] / total);
      stats[mbs * E + b * E + e] += a.probs[t * E + e];
    }
    // The k largest logits (ties to the lower expert), and a softmax over them.
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [z](int32_t i, int32_t j) { return z[i] > z[j] || (z[i] == z[j] && i < j); });
    double top_total = 0;
    for (int64_t j = 0; j < k; ++j) top_total += scaled[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      a.choice[t * k + j] = order[j];
      a.gate[t * k + j] = static_cast<float>(scaled[order[j]] / top_total);
      stats[b * E + order[j]] += 1.0f;
    }
  }
  // Sum the statistics over the ranks that hold pieces of the same samples.
  AUTOPAR_RETURN_IF_ERROR(dev_.Upload(sample_stats_, stats));
  AUTOPAR_RETURN_IF_ERROR(g_.seq.AllReduce(sample_stats_));
  AUTOPAR_ASSIGN_OR_RETURN(stats, dev_.Download<float>(sample_stats_));
  const double seq = static_cast<double>(s_.seq);
  a.load.assign(mbs * E, 0.0f);
  double aux = 0;
  for (int64_t b = 0; b < mbs; ++b) {
    for (int64_t e = 0; e < E; ++e) {
      a.load[b * E + e] = static_cast<float>(stats[b * E + e] / seq);
      aux += a.load[b * E + e] * (stats[mbs * E + b * E + e] / seq);
    }
  }
  if (count_aux && g_.seq.rank() == 0) {
    aux_sum_ += kAuxLossCoeff * static_cast<double>(E) / k * aux / samples_per_step_;
  }
  return OkStatus();
}

// Dispatch order (by expert, then token), the per-expert counts over the ep and etp groups, and
// the index lists of every row gather.
Status MoeLayer::Exchange(MoeActs& a) {
  const int64_t Tr = s_.tokens / s_.tp, E = s_.experts, k = s_.topk, El = s_.local_experts;
  const int64_t ep = E / El, etp = s_.etp;
  std::vector<int32_t> count(E, 0);
  for (int32_t e : a.choice) ++count[e];
  std::vector<int64_t> first(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) first[e + 1] = first[e] + count[e];
  std::vector<int32_t> dispatch(Tr * k), send_slot(Tr * k), slot(Tr * k);
  std::vector<int64_t> fill(first.begin(), first.end() - 1);
  for (int64_t t = 0; t < Tr; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = fill[a.choice[t * k + j]]++;
      dispatch[row] = static_cast<int32_t>(t);
      send_slot[row] = static_cast<int32_t>(t * k + j);
      slot[t * k + j] = static_cast<int32_t>(row);
    }
  }
  a.send_rows.assign(ep, 0);
  for (int64_t e = 0; e < E; ++e) a.send_rows[e / El] += count[e];

  // all[q][s][e]: rows etp rank q receives from ep rank s for its local expert e.
  AUTOPAR_ASSIGN_OR_RETURN(const std::vector<int32_t> all, ShareCounts(count));
  auto cnt = [&](int64_t q, int64_t src, int64_t e) {
    return int64_t{all[(q * ep + src) * El + e]};
  };
  const int64_t own = etp > 1 ? etp_.rank() : 0;
  a.recv_rows.assign(ep, 0);
  for (int64_t src = 0; src < ep; ++src) {
    for (int64_t e = 0; e < El; ++e) a.recv_rows[src] += cnt(own, src, e);
  }
  std::vector<int64_t> received(etp, 0);
  for (int64_t q = 0; q < etp; ++q) {
    for (int64_t i = 0; i < ep * El; ++i) received[q] += all[q * ep * El + i];
  }
  a.max_received = *std::max_element(received.begin(), received.end());
  a.all_received = std::accumulate(received.begin(), received.end(), int64_t{0});
  // Rows arrive as [etp rank q (padded to max_received)][ep rank s][local expert e]; the experts
  // want them grouped by e.
  std::vector<int32_t> sort, unsort(etp * a.max_received, static_cast<int32_t>(a.all_received));
  a.expert_rows.assign(El, 0);
  for (int64_t e = 0; e < El; ++e) {
    for (int64_t q = 0; q < etp; ++q) {
      int64_t at = q * a.max_received;
      for (int64_t src = 0; src < ep; ++src) {
        for (int64_t e2 = 0; e2 < El; ++e2) {
          if (e2 == e) {
            for (int64_t i = 0; i < cnt(q, src, e); ++i) {
              unsort[at + i] = static_cast<int32_t>(sort.size());
              sort.push_back(static_cast<int32_t>(at + i));
            }
            a.expert_rows[e] += cnt(q, src, e);
          }
          at += cnt(q, src, e2);
        }
      }
    }
  }
  a.ids = IdLists();
  a.dispatch = a.ids.Add(std::move(dispatch));
  a.send_slot = a.ids.Add(std::move(send_slot));
  a.slot = a.ids.Add(std::move(slot));
  a.sort = a.ids.Add(std::move(sort));
  a.unsort = a.ids.Add(std::move(unsort));
  return a.ids.Upload(dev_);
}

// Flex dispatch: a row per (token, ep rank holding any of its experts), by rank then token, with
// the gates of that rank's experts beside it; the per-rank counts over the ep and etp groups;
// the received rows' gates; and the index lists of the gathers and row sums.
Status MoeLayer::ExchangeFlex(MoeActs& a) {
  const int64_t Tr = s_.tokens / s_.tp, k = s_.topk, El = s_.local_experts;
  const int64_t ep = s_.experts / El, etp = s_.etp;
  constexpr int32_t kReached = -2;
  std::vector<int32_t> row_of(Tr * ep, -1);  // [token, rank]: the row sent there, if any
  for (int64_t t = 0; t < Tr; ++t) {
    for (int64_t j = 0; j < k; ++j) row_of[t * ep + a.choice[t * k + j] / El] = kReached;
  }
  std::vector<int32_t> dispatch, count(ep, 0);
  for (int64_t r = 0; r < ep; ++r) {
    for (int64_t t = 0; t < Tr; ++t) {
      if (row_of[t * ep + r] != kReached) continue;
      row_of[t * ep + r] = static_cast<int32_t>(dispatch.size());
      dispatch.push_back(static_cast<int32_t>(t));
      ++count[r];
    }
  }
  const int64_t sent = static_cast<int64_t>(dispatch.size());
  std::vector<float> gates(sent * El, -1.0f);  // −1: the rank's expert was not chosen
  a.slot_row.assign(Tr * k, 0);
  for (int64_t t = 0; t < Tr; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = a.choice[t * k + j], row = row_of[t * ep + e / El];
      gates[row * El + e % El] = a.gate[t * k + j];
      a.slot_row[t * k + j] = row;
    }
  }
  std::vector<std::vector<int32_t>> token_rows(Tr);
  for (int64_t t = 0; t < Tr; ++t) {
    for (int64_t r = 0; r < ep; ++r) {
      if (row_of[t * ep + r] >= 0) token_rows[t].push_back(row_of[t * ep + r]);
    }
  }
  a.send_rows.assign(count.begin(), count.end());
  // all[q][s]: rows etp rank q receives from ep rank s.
  AUTOPAR_ASSIGN_OR_RETURN(const std::vector<int32_t> all, ShareCounts(count));
  const int64_t own = etp > 1 ? etp_.rank() : 0;
  a.recv_rows.assign(ep, 0);
  for (int64_t src = 0; src < ep; ++src) a.recv_rows[src] = all[own * ep + src];
  std::vector<int64_t> block(etp);  // rows each etp rank received
  for (int64_t q = 0; q < etp; ++q) {
    block[q] = std::accumulate(all.begin() + q * ep, all.begin() + (q + 1) * ep, int64_t{0});
  }
  a.max_received = *std::max_element(block.begin(), block.end());
  const int64_t arrivals = etp * a.max_received;
  // The gates travel as the rows do: El floats a row.
  const int64_t cells = std::max(sent, arrivals) * El;
  AUTOPAR_ASSIGN_OR_RETURN(Buffer gate_buffer,
                           dev_.Allocate(2 * std::max<int64_t>(cells, 1), DType::kF32));
  const Tensor send = gate_buffer.tensor().Slice(0, cells);
  AUTOPAR_RETURN_IF_ERROR(dev_.Upload(send.Slice(0, sent * El), gates));
  AUTOPAR_ASSIGN_OR_RETURN(const Tensor arrived,
                           Dispatch(a, send, gate_buffer.tensor().Slice(cells, cells), El));
  std::vector<float> received;
  if (arrivals > 0) {
    AUTOPAR_ASSIGN_OR_RETURN(received, dev_.Download<float>(arrived.Slice(0, arrivals * El)));
  }
  // Expert rows: by local expert, then in arrival order ([etp rank q, padded][ep rank s]).
  std::vector<int32_t> sort;
  std::vector<std::vector<int32_t>> arrival_rows(arrivals);
  a.row_gate.clear();
  a.gate_cell.clear();
  a.expert_rows.assign(El, 0);
  for (int64_t e = 0; e < El; ++e) {
    for (int64_t q = 0; q < etp; ++q) {
      for (int64_t row = q * a.max_received; row < q * a.max_received + block[q]; ++row) {
        if (received[row * El + e] < 0) continue;
        arrival_rows[row].push_back(static_cast<int32_t>(sort.size()));
        sort.push_back(static_cast<int32_t>(row));
        a.row_gate.push_back(received[row * El + e]);
        a.gate_cell.push_back(static_cast<int32_t>(row * El + e));
        ++a.expert_rows[e];
      }
    }
  }
  a.all_received = static_cast<int64_t>(sort.size());
  a.ids = IdLists();
  a.dispatch = a.ids.Add(std::move(dispatch));
  a.sort = a.ids.Add(std::move(sort));
  a.by_arrival = RowSum(arrival_rows, a.ids);
  a.by_token = RowSum(token_rows, a.ids);
  return a.ids.Upload(dev_);
}

StatusOr<Tensor> MoeLayer::Dispatch(MoeActs& a, Tensor send, Tensor other, int64_t width) {
  Tensor cur = send;
  if (s_.experts / s_.local_experts > 1) {
    AUTOPAR_RETURN_IF_ERROR(
        g_.ep.AllToAllV(cur, Elements(a.send_rows, width), other, Elements(a.recv_rows, width)));
    std::swap(cur, other);
  }
  if (s_.etp > 1) {
    const int64_t block = a.max_received * width;
    AUTOPAR_RETURN_IF_ERROR(etp_.AllGather(cur.Slice(0, block), other.Slice(0, s_.etp * block)));
    std::swap(cur, other);
  }
  return cur;
}

StatusOr<Tensor> MoeLayer::Combine(MoeActs& a, Tensor unsorted, Tensor other, int64_t width) {
  Tensor cur = unsorted;
  if (s_.etp > 1) {
    const int64_t block = a.max_received * width;
    AUTOPAR_RETURN_IF_ERROR(
        etp_.ReduceScatter(cur.Slice(0, s_.etp * block), other.Slice(0, block)));
    std::swap(cur, other);
  }
  if (s_.experts / s_.local_experts > 1) {
    AUTOPAR_RETURN_IF_ERROR(
        g_.ep.AllToAllV(cur, Elements(a.recv_rows, width), other, Elements(a.send_rows, width)));
    std::swap(cur, other);
  }
  return cur;
}

Status MoeLayer::ExpertsForward(const LayerWeights& w, MoeActs& a, Tensor out, Tensor a1w) {
  const int64_t h = s_.hidden, f = s_.expert_ffn, fc1 = (s_.swiglu ? 2 : 1) * f;
  int64_t row = 0;
  for (int64_t e = 0; e < s_.local_experts; ++e) {
    const int64_t n = a.expert_rows[e];
    if (n == 0) continue;
    const Tensor x = a.ex_in.Slice(row * h, n * h), h1 = a.h1.Slice(row * fc1, n * fc1);
    const Tensor a1 = a.a1.Slice(row * f, n * f);
    AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Linear(n, fc1, h), x, w.experts[e].fc1, h1));
    AUTOPAR_RETURN_IF_ERROR(s_.swiglu ? dev_.SwiGluForward(n, f, h1, a1)
                                      : dev_.GeluForward(h1, a1));
    Tensor fc2_in = a1;
    if (a1w.numel > 0) {  // flex: each row's activation times its gate
      fc2_in = a1w.Slice(row * f, n * f);
      AUTOPAR_RETURN_IF_ERROR(
          dev_.Gemm(Batched(n, 1, f, 1, false), a.row_gates.Slice(row, n), a1, fc2_in));
    }
    AUTOPAR_RETURN_IF_ERROR(
        dev_.Gemm(Linear(n, h, f), fc2_in, w.experts[e].fc2, out.Slice(row * h, n * h)));
    row += n;
  }
  return OkStatus();
}

Status MoeLayer::ExpertsBackward(const LayerWeights& w, MoeActs& a, Tensor dy, Tensor da1,
                                 Tensor dh1, Tensor dx, Tensor a1w, Tensor dgate) {
  const int64_t h = s_.hidden, f = s_.expert_ffn, fc1 = (s_.swiglu ? 2 : 1) * f;
  const bool flex = a1w.numel > 0;  // the gates were applied before fc2
  int64_t row = 0;
  for (int64_t e = 0; e < s_.local_experts; ++e) {
    const int64_t n = a.expert_rows[e];
    if (n == 0) continue;
    const ExpertWeights& ew = w.experts[e];
    const Tensor dy_e = dy.Slice(row * h, n * h), x = a.ex_in.Slice(row * h, n * h);
    const Tensor h1 = a.h1.Slice(row * fc1, n * fc1), a1 = a.a1.Slice(row * f, n * f);
    const Tensor da1_e = da1.Slice(row * f, n * f), dh1_e = dh1.Slice(row * fc1, n * fc1);
    const Tensor gates = flex ? a.row_gates.Slice(row, n) : Tensor{};
    const Tensor a1w_e = flex ? a1w.Slice(row * f, n * f) : Tensor{};
    if (flex) {  // fc2 read the gated activation
      AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Batched(n, 1, f, 1, false), gates, a1, a1w_e));
    }
    AUTOPAR_RETURN_IF_ERROR(
        dev_.Gemm(LinearWeightGrad(n, h, f), dy_e, flex ? a1w_e : a1, ew.d_fc2));
    AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearInputGrad(n, h, f), dy_e, ew.fc2, da1_e));
    Tensor d_act = da1_e;
    if (flex) {  // the gate's gradient: dgate = da1w · a1; the activation's: gate · da1w
      AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Batched(n, 1, 1, f, true), da1_e, a1, dgate.Slice(row, n)));
      AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Batched(n, 1, f, 1, false), gates, da1_e, a1w_e));
      d_act = a1w_e;
    }
    AUTOPAR_RETURN_IF_ERROR(s_.swiglu ? dev_.SwiGluBackward(n, f, d_act, h1, dh1_e)
                                      : dev_.GeluBackward(d_act, h1, dh1_e));
    AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearWeightGrad(n, fc1, h), dh1_e, x, ew.d_fc1));
    AUTOPAR_RETURN_IF_ERROR(
        dev_.Gemm(LinearInputGrad(n, fc1, h), dh1_e, ew.fc1, dx.Slice(row * h, n * h)));
    row += n;
  }
  return OkStatus();
}

Status MoeLayer::Forward(const LayerWeights& w, MoeActs& a, Tensor x, Tensor out, bool count_aux,
                         const std::optional<RandomLogits>& random) {
  AUTOPAR_RETURN_IF_ERROR(Route(w, a, x, count_aux, random));
  if (s_.flex) return ForwardFlex(w, a, x, out);
  AUTOPAR_RETURN_IF_ERROR(Exchange(a));
  const int64_t Tr = s_.tokens / s_.tp, k = s_.topk, h = s_.hidden, R = a.all_received;
  const int64_t f = s_.expert_ffn, fc1 = (s_.swiglu ? 2 : 1) * f;
  const int64_t rows = std::max(Tr * k, s_.etp * a.max_received);
  // Under moe_act recompute the activation output is transient (in `work`) and rebuilt from h1
  // in backward (BackwardExperts).
  const int64_t kept_f = s_.Reruns(kRecomputeMoeAct) ? 0 : f;
  a.compute.Reset();
  AUTOPAR_ASSIGN_OR_RETURN(
      a.compute, dev_.Allocate(R * (h + fc1 + kept_f) + Tr * k * (h + 1), dev_.compute_dtype()));
  const Tensor c = a.compute.tensor();
  a.ex_in = c.Slice(0, R * h);
  a.h1 = c.Slice(R * h, R * fc1);
  a.combined = c.Slice(R * (h + fc1 + kept_f), Tr * k * h);
  a.gates = c.Slice(R * (h + fc1 + kept_f) + Tr * k * h, Tr * k);
  AUTOPAR_ASSIGN_OR_RETURN(Buffer work,
                           dev_.Allocate(2 * rows * h + R * (f - kept_f), dev_.compute_dtype()));
  const Tensor bx = work.tensor().Slice(0, rows * h), by = work.tensor().Slice(rows * h, rows * h);
  a.a1 = kept_f > 0 ? c.Slice(R * (h + fc1), R * f) : work.tensor().Slice(2 * rows * h, R * f);

  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, x, h, a.ids[a.dispatch], bx));
  AUTOPAR_ASSIGN_OR_RETURN(const Tensor arrived, Dispatch(a, bx, by, h));
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, arrived, h, a.ids[a.sort], a.ex_in));
  AUTOPAR_RETURN_IF_ERROR(ExpertsForward(w, a, bx));
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, bx, h, a.ids[a.unsort], by));
  AUTOPAR_ASSIGN_OR_RETURN(const Tensor back, Combine(a, by, bx, h));
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, back, h, a.ids[a.slot], a.combined));
  AUTOPAR_RETURN_IF_ERROR(UploadCompute(dev_, a.gates, a.gate));
  if (kept_f == 0) a.a1 = Tensor{};  // freed with `work`
  // out[t] += Σ_j gate[t, j] · combined[t, j].
  return dev_.Gemm(Batched(Tr, 1, h, k, false, 1.0f), a.gates, a.combined, out);
}

Status MoeLayer::BackwardExperts(const LayerWeights& w, MoeActs& a, Tensor dy) {
  if (s_.flex) {
    AUTOPAR_ASSIGN_OR_RETURN(const std::vector<float> dgate, BackwardFlex(w, a, dy));
    RouterGradient(a, dgate);
    return OkStatus();
  }
  const int64_t Tr = s_.tokens / s_.tp, k = s_.topk, h = s_.hidden;
  const int64_t R = a.all_received, f = s_.expert_ffn, fc1 = (s_.swiglu ? 2 : 1) * f;
  const int64_t rows = std::max(Tr * k, s_.etp * a.max_received);
  const int64_t rebuilt_f = s_.Reruns(kRecomputeMoeAct) ? f : 0;
  AUTOPAR_ASSIGN_OR_RETURN(Buffer work, dev_.Allocate(2 * rows * h + R * (f + fc1 + h + rebuilt_f),
                                                      dev_.compute_dtype()));
  const Tensor wt = work.tensor();
  const Tensor bx = wt.Slice(0, rows * h), by = wt.Slice(rows * h, rows * h);
  const Tensor da1 = wt.Slice(2 * rows * h, R * f), dh1 = wt.Slice(2 * rows * h + R * f, R * fc1);
  const Tensor d_ex_in = wt.Slice(2 * rows * h + R * (f + fc1), R * h);
  if (rebuilt_f > 0) {  // moe_act recompute: the activation again, every expert's rows at once
    a.a1 = wt.Slice(2 * rows * h + R * (f + fc1 + h), R * f);
    if (R > 0) {
      AUTOPAR_RETURN_IF_ERROR(s_.swiglu ? dev_.SwiGluForward(R, f, a.h1, a.a1)
                                        : dev_.GeluForward(a.h1, a.a1));
    }
  }

  // Gates: dgate[t, j] = dy[t] · combined[t, j]; each (token, slot) row gets gate · dy[t].
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Batched(Tr, 1, k, h, true), dy, a.combined, dgate_));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Batched(Tr, k, h, 1, false), a.gates, dy, bx));
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, bx, h, a.ids[a.send_slot], by));
  AUTOPAR_ASSIGN_OR_RETURN(const Tensor arrived, Dispatch(a, by, bx, h));
  const Tensor d_ex_out = arrived.data == bx.data ? by : bx;
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, arrived, h, a.ids[a.sort], d_ex_out));
  AUTOPAR_RETURN_IF_ERROR(ExpertsBackward(w, a, d_ex_out, da1, dh1, d_ex_in));
  if (rebuilt_f > 0) a.a1 = Tensor{};  // freed with `work`
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, d_ex_in, h, a.ids[a.unsort], bx));
  AUTOPAR_ASSIGN_OR_RETURN(const Tensor back, Combine(a, bx, by, h));
  const Tensor per_slot = back.data == bx.data ? by : bx;
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, back, h, a.ids[a.slot], per_slot));
  // The k slots of a token sum into its input gradient.
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Batched(Tr, 1, h, k, false), ones_, per_slot, dx_));

  AUTOPAR_ASSIGN_OR_RETURN(const std::vector<float> dgate, dev_.Download<float>(dgate_));
  RouterGradient(a, dgate);
  return OkStatus();
}

// Router logits: through the top-k softmax of the gates and the load-balancing loss's full
// softmax (whose f_e are counts, constants of the gradient).
void MoeLayer::RouterGradient(MoeActs& a, const std::vector<float>& dgate) const {
  const int64_t Tr = s_.tokens / s_.tp, E = s_.experts, k = s_.topk;
  const double aux_scale = kAuxLossCoeff * static_cast<double>(E) /
                           (k * static_cast<double>(s_.seq)) / samples_per_step_;
  const int64_t row0 = g_.at.tp * Tr;
  a.dlogits.assign(Tr * E, 0.0f);
  for (int64_t t = 0; t < Tr; ++t) {
    const float* p = a.probs.data() + t * E;
    const float* load = a.load.data() + ((row0 + t) % s_.mbs) * E;
    float* dl = a.dlogits.data() + t * E;
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += p[e] * aux_scale * load[e];
    for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<float>(p[e] * (aux_scale * load[e] - dot));
    double gated = 0;
    for (int64_t j = 0; j < k; ++j) gated += a.gate[t * k + j] * dgate[t * k + j];
    for (int64_t j = 0; j < k; ++j) {
      dl[a.choice[t * k + j]] += static_cast<float>(a.gate[t * k + j] * (dgate[t * k + j] - gated));
    }
  }
}

MoeLayer::FlexSizes MoeLayer::FlexRows(const MoeActs& a) const {
  const int64_t sent = a.ids[a.dispatch].numel, arrivals = s_.etp * a.max_received;
  return {sent, arrivals, std::max({sent, arrivals, a.all_received, s_.tokens / s_.tp})};
}

Status MoeLayer::ForwardFlex(const LayerWeights& w, MoeActs& a, Tensor x, Tensor out) {
  AUTOPAR_RETURN_IF_ERROR(ExchangeFlex(a));
  const int64_t Tr = s_.tokens / s_.tp, h = s_.hidden, R = a.all_received;
  const int64_t f = s_.expert_ffn, fc1 = (s_.swiglu ? 2 : 1) * f;
  const auto [sent, arrivals, rows] = FlexRows(a);
  const int64_t kept_f = s_.Reruns(kRecomputeMoeAct) ? 0 : f;  // as in Forward
  a.compute.Reset();
  AUTOPAR_ASSIGN_OR_RETURN(
      a.compute,
      dev_.Allocate(std::max<int64_t>(R * (h + fc1 + kept_f + 1), 1), dev_.compute_dtype()));
  const Tensor c = a.compute.tensor();
  a.ex_in = c.Slice(0, R * h);
  a.h1 = c.Slice(R * h, R * fc1);
  a.row_gates = c.Slice(R * (h + fc1 + kept_f), R);
  if (R > 0) AUTOPAR_RETURN_IF_ERROR(UploadCompute(dev_, a.row_gates, a.row_gate));
  AUTOPAR_ASSIGN_OR_RETURN(
      Buffer work, dev_.Allocate(3 * rows * h + R * (2 * f - kept_f), dev_.compute_dtype()));
  const Tensor wt = work.tensor();
  const Tensor bx = wt.Slice(0, rows * h), by = wt.Slice(rows * h, rows * h);
  const Tensor bz = wt.Slice(2 * rows * h, rows * h), a1w = wt.Slice(3 * rows * h, R * f);
  a.a1 = kept_f > 0 ? c.Slice(R * (h + fc1), R * f) : wt.Slice(3 * rows * h + R * f, R * f);

  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, x, h, a.ids[a.dispatch], bx));
  AUTOPAR_ASSIGN_OR_RETURN(const Tensor arrived, Dispatch(a, bx, by, h));
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, arrived, h, a.ids[a.sort], a.ex_in));
  AUTOPAR_RETURN_IF_ERROR(ExpertsForward(w, a, bx, a1w));  // expert rows [R, h] in bx
  if (kept_f == 0) a.a1 = Tensor{};                        // freed with `work`
  // Each received row's expert outputs summed (in place of bx), then home, then each token's.
  AUTOPAR_RETURN_IF_ERROR(a.by_arrival.Apply(dev_, a.ids, bx, h, by, bz, bx));
  AUTOPAR_ASSIGN_OR_RETURN(const Tensor back, Combine(a, bx, by, h));
  const Tensor free = back.data == bx.data ? by : bx;
  AUTOPAR_RETURN_IF_ERROR(a.by_token.Apply(dev_, a.ids, back, h, free, bz, back));
  return dev_.Add(out, back.Slice(0, Tr * h), out);
}

StatusOr<std::vector<float>> MoeLayer::BackwardFlex(const LayerWeights& w, MoeActs& a, Tensor dy) {
  const int64_t Tr = s_.tokens / s_.tp, k = s_.topk, h = s_.hidden, R = a.all_received;
  const int64_t El = s_.local_experts, f = s_.expert_ffn, fc1 = (s_.swiglu ? 2 : 1) * f;
  const auto [sent, arrivals, rows] = FlexRows(a);
  const int64_t rebuilt_f = s_.Reruns(kRecomputeMoeAct) ? f : 0;
  AUTOPAR_ASSIGN_OR_RETURN(
      Buffer work,
      dev_.Allocate(3 * rows * h + R * (2 * f + fc1 + h + rebuilt_f), dev_.compute_dtype()));
  const Tensor wt = work.tensor();
  const Tensor bx = wt.Slice(0, rows * h), by = wt.Slice(rows * h, rows * h);
  const Tensor bz = wt.Slice(2 * rows * h, rows * h);
  int64_t at = 3 * rows * h;
  auto take = [&](int64_t n) {
    const Tensor t = wt.Slice(at, n);
    at += n;
    return t;
  };
  const Tensor da1 = take(R * f), a1w = take(R * f), dh1 = take(R * fc1), d_ex_in = take(R * h);
  if (rebuilt_f > 0) {  // moe_act recompute, as in BackwardExperts
    a.a1 = take(R * f);
    if (R > 0) {
      AUTOPAR_RETURN_IF_ERROR(s_.swiglu ? dev_.SwiGluForward(R, f, a.h1, a.a1)
                                        : dev_.GeluForward(a.h1, a.a1));
    }
  }
  const int64_t cells = std::max(sent, arrivals) * El;
  AUTOPAR_ASSIGN_OR_RETURN(Buffer f32,
                           dev_.Allocate(std::max<int64_t>(R + 2 * cells, 1), DType::kF32));
  const Tensor dg = f32.tensor().Slice(0, R);

  // The token's gradient to every rank holding its experts, sorted by expert there.
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, dy, h, a.ids[a.dispatch], bx));
  AUTOPAR_ASSIGN_OR_RETURN(const Tensor arrived, Dispatch(a, bx, by, h));
  const Tensor d_ex_out = arrived.data == bx.data ? by : bx;
  AUTOPAR_RETURN_IF_ERROR(PickRows(dev_, arrived, h, a.ids[a.sort], d_ex_out));
  AUTOPAR_RETURN_IF_ERROR(ExpertsBackward(w, a, d_ex_out, da1, dh1, d_ex_in, a1w, dg));
  if (rebuilt_f > 0) a.a1 = Tensor{};  // freed with `work`
  // The input gradients summed as the outputs were: per received row, home, per token.
  AUTOPAR_RETURN_IF_ERROR(a.by_arrival.Apply(dev_, a.ids, d_ex_in, h, bx, by, bz));
  AUTOPAR_ASSIGN_OR_RETURN(const Tensor back, Combine(a, bz, bx, h));
  const Tensor free = back.data == bx.data ? bz : bx;
  AUTOPAR_RETURN_IF_ERROR(a.by_token.Apply(dev_, a.ids, back, h, free, by, dx_));

  // The gates' gradient in the received rows' gate matrix, home the same way (summed over etp).
  std::vector<float> matrix(arrivals * El, 0.0f);
  if (R > 0) {
    AUTOPAR_ASSIGN_OR_RETURN(const std::vector<float> per_row, dev_.Download<float>(dg));
    for (int64_t r = 0; r < R; ++r) matrix[a.gate_cell[r]] = per_row[r];
  }
  const Tensor cells_a = f32.tensor().Slice(R, cells),
               cells_b = f32.tensor().Slice(R + cells, cells);
  if (arrivals > 0) AUTOPAR_RETURN_IF_ERROR(dev_.Upload(cells_a.Slice(0, arrivals * El), matrix));
  AUTOPAR_ASSIGN_OR_RETURN(const Tensor home, Combine(a, cells_a, cells_b, El));
  std::vector<float> sent_cells;
  if (sent > 0) {
    AUTOPAR_ASSIGN_OR_RETURN(sent_cells, dev_.Download<float>(home.Slice(0, sent * El)));
  }
  std::vector<float> dgate(Tr * k);
  for (int64_t i = 0; i < Tr * k; ++i) {
    dgate[i] = sent_cells[a.slot_row[i] * El + a.choice[i] % El];
  }
  return dgate;
}

Status MoeLayer::BackwardRouter(const LayerWeights& w, MoeActs& a, Tensor x, Tensor dx) {
  const int64_t Tr = s_.tokens / s_.tp, E = s_.experts, h = s_.hidden;
  AUTOPAR_RETURN_IF_ERROR(UploadCompute(dev_, dlogits_, a.dlogits));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearWeightGrad(Tr, E, h), dlogits_, x, w.d_router));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearInputGrad(Tr, E, h, 1.0f), dlogits_, w.router, dx));
  AUTOPAR_RETURN_IF_ERROR(dev_.Add(dx, dx_, dx));
  a.compute.Reset();
  a.ids = IdLists();
  return OkStatus();
}

}  // namespace autopar::trial
