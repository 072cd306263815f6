#include "autopar/trial/schedule.h"

#include <algorithm>

#include "autopar/space/config.h"

namespace autopar::trial {

std::vector<PipelineOp> PipelineSchedule(int pp, int vpp, int rank, int microbatches) {
  std::vector<PipelineOp> ops;
  if (vpp <= 1) {
    // 1F1B: warm up with pp − rank − 1 forwards, alternate, then drain the backwards.
    const int warmup = static_cast<int>(PipelineWarmupForwards(pp, 1, rank, microbatches));
    int next_forward = 0, next_backward = 0;
    for (; next_forward < warmup; ++next_forward) ops.push_back({PipelineOp::kForward, next_forward, 0});
    while (next_forward < microbatches) {
      ops.push_back({PipelineOp::kForward, next_forward++, 0});
      ops.push_back({PipelineOp::kBackward, next_backward++, 0});
    }
    while (next_backward < microbatches) ops.push_back({PipelineOp::kBackward, next_backward++, 0});
    return ops;
  }
  // Interleaved: the k-th forward runs chunk (k mod pp·v) / pp of micro-batch
  // (k / (pp·v))·pp + k mod pp; backwards visit the chunks in reverse.
  const int total = microbatches * vpp;
  const int group = pp * vpp;
  auto op = [&](PipelineOp::Kind kind, int k) {
    return PipelineOp{
        kind, (k / group) * pp + k % pp,
        static_cast<int32_t>(InterleavedChunk(pp, vpp, k, kind == PipelineOp::kBackward))};
  };
  auto forward = [&](int k) { return op(PipelineOp::kForward, k); };
  auto backward = [&](int k) { return op(PipelineOp::kBackward, k); };
  const int warmup = static_cast<int>(PipelineWarmupForwards(pp, vpp, rank, microbatches));
  for (int k = 0; k < warmup; ++k) ops.push_back(forward(k));
  for (int k = 0; k < total - warmup; ++k) {
    ops.push_back(forward(warmup + k));
    ops.push_back(backward(k));
  }
  for (int k = total - warmup; k < total; ++k) ops.push_back(backward(k));
  return ops;
}

int MaxInFlight(const std::vector<PipelineOp>& ops) {
  int alive = 0, peak = 0;
  for (const PipelineOp& op : ops) {
    alive += op.kind == PipelineOp::kForward ? 1 : -1;
    peak = std::max(peak, alive);
  }
  return peak;
}

std::map<int64_t, int> SlotsBySize(const std::vector<PipelineOp>& ops,
                                   const std::vector<int64_t>& chunk_layers) {
  std::map<int64_t, int> alive, peak;
  for (const PipelineOp& op : ops) {
    const int64_t size = chunk_layers[static_cast<size_t>(op.chunk)];
    int& n = alive[size];
    n += op.kind == PipelineOp::kForward ? 1 : -1;
    peak[size] = std::max(peak[size], n);
  }
  return peak;
}

StageLinks LinksOf(int pp, int vpp, int rank, int chunk) {
  StageLinks l;
  const int stage = chunk * pp + rank;
  const int last = pp * vpp - 1;
  if (stage > 0) {
    l.prev_rank = (stage - 1) % pp;
    l.prev_chunk = (stage - 1) / pp;
  }
  if (stage < last) {
    l.next_rank = (stage + 1) % pp;
    l.next_chunk = (stage + 1) / pp;
  }
  return l;
}

std::vector<std::vector<PipelineTransfer>> PipelineExchanges(int pp, int vpp, int rank,
                                                             const std::vector<PipelineOp>& ops) {
  // The exchange before ops[k] gathers the transfers of a schedule step. A step is one op, except
  // in the interleaved schedule's steady state, where a forward and the backward after it are one
  // step (Megatron's forward_backward_pipelining_with_interleaving runs both, then one
  // send_forward_backward_recv_forward_backward): its inputs all arrive before the forward and
  // its outputs all leave after the backward. One op per step there lets every rank wait, at the
  // same step, for a neighbour that waits one step later on another: a cycle around the ring.
  const size_t n = ops.size();
  std::vector<size_t> step_start(n);  // the op that opens the step of ops[k]
  for (size_t k = 0; k < n; ++k) step_start[k] = k;
  if (vpp > 1) {
    const int microbatches = static_cast<int>(n) / 2 / vpp;
    const auto warmup = static_cast<size_t>(PipelineWarmupForwards(pp, vpp, rank, microbatches));
    const size_t steady = static_cast<size_t>(microbatches * vpp) - warmup;
    for (size_t i = 0; i < steady; ++i) step_start[warmup + 2 * i + 1] = warmup + 2 * i;
  }
  std::vector<std::vector<PipelineTransfer>> sends(n + 1), recvs(n + 1);
  for (size_t k = 0; k < n; ++k) {
    const PipelineOp& op = ops[k];
    const StageLinks l = LinksOf(pp, vpp, rank, op.chunk);
    const int stage = op.chunk * pp + rank;
    const bool forward = op.kind == PipelineOp::kForward;
    // The input: activations from the stage before, or the gradient from the stage after.
    const int from = forward ? l.prev_rank : l.next_rank;
    if (from >= 0) {
      recvs[step_start[k]].push_back(
          {PipelineTransfer::kRecv, from, op.microbatch, stage, !forward});
    }
    // The output, sent after the step's last op.
    const size_t step_end = k + 1 < n && step_start[k + 1] == step_start[k] ? k + 2 : k + 1;
    const int to = forward ? l.next_rank : l.prev_rank;
    if (to >= 0) {
      sends[step_end].push_back(
          {PipelineTransfer::kSend, to, op.microbatch, forward ? stage + 1 : stage - 1, !forward});
    }
  }
  // Sends before receives, each in op order, as Megatron's _p2p_ops issues them.
  std::vector<std::vector<PipelineTransfer>> groups(n + 1);
  for (size_t k = 0; k <= n; ++k) {
    groups[k] = std::move(sends[k]);
    groups[k].insert(groups[k].end(), recvs[k].begin(), recvs[k].end());
  }
  return groups;
}

int TrialMicrobatches(int pp, int vpp, int job_microbatches, int cap) {
  int m = std::min(job_microbatches, std::max(2 * pp, 2));
  if (cap > 0) m = std::min(m, std::max(cap, vpp > 1 ? pp : 1));
  if (vpp > 1) m = std::max(pp, m / pp * pp);  // the interleaved schedule's groups of pp
  return std::min(m, job_microbatches);
}

double ExtrapolateStepTime(double pipeline_s, double tail_s, int pp, int vpp, int ran, int total) {
  const double bubble = (pp - 1.0) / vpp;
  return pipeline_s * (total + bubble) / (ran + bubble) + tail_s;
}

double MedianOfMax(const std::vector<std::vector<double>>& times) {
  std::vector<double> maxima;
  for (const auto& per_rank : times) {
    if (!per_rank.empty()) maxima.push_back(*std::max_element(per_rank.begin(), per_rank.end()));
  }
  if (maxima.empty()) return 0;
  std::sort(maxima.begin(), maxima.end());
  const size_t n = maxima.size();
  return n % 2 ? maxima[n / 2] : 0.5 * (maxima[n / 2 - 1] + maxima[n / 2]);
}

}  // namespace autopar::trial
