#include "autopar/trial/probe.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>

#include "autopar/backend/timer.h"

namespace autopar::trial {
namespace {

using backend::Buffer;
using backend::DType;
using backend::OkStatus;
using backend::Outcome;
using backend::Status;
using backend::StatusOr;
using backend::Tensor;

// The maximum over ranks of a host value.
StatusOr<double> Slowest(const backend::Group& world, double mine) {
  double slowest = 0;
  if (MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, world.comm()) != MPI_SUCCESS) {
    return Status(Outcome::kCommError, "probe: MPI_Allreduce failed");
  }
  return slowest;
}

// Median over repetitions (after one warm-up) of `run`, then the maximum over ranks.
template <class Fn>
StatusOr<double> Time(backend::Device& dev, const backend::Group& world, int repetitions, Fn run) {
  AUTOPAR_RETURN_IF_ERROR(run());
  std::vector<double> times;
  for (int i = 0; i < repetitions; ++i) {
    AUTOPAR_RETURN_IF_ERROR(dev.Synchronize());
    backend::WallTimer timer;
    AUTOPAR_RETURN_IF_ERROR(run());
    AUTOPAR_RETURN_IF_ERROR(dev.Synchronize());
    times.push_back(timer.Seconds());
  }
  std::sort(times.begin(), times.end());
  return Slowest(world, times[times.size() / 2]);
}

}  // namespace

StatusOr<std::vector<ProbeSample>> RunProbe(backend::Backend& be, const backend::Group& world,
                                            const ModelSpec& m, const TrainSpec& t,
                                            const ClusterSpec& cluster, const CostModel& cost,
                                            const ProbeOptions& options,
                                            ProbeOverheads* overheads) {
  backend::Device& dev = be.device();
  const DType dt = dev.compute_dtype();
  const double elem = static_cast<double>(backend::DTypeSize(dt));
  const int64_t T = t.seq_length, h = m.hidden_size, d = m.head_dim();
  std::vector<int> tps = options.tp_values;
  if (tps.empty()) {
    for (int tp = 1; tp <= cluster.gpus_per_node; tp *= 2) {
      if (m.num_attention_heads % tp == 0 && m.num_query_groups % tp == 0 &&
          m.ffn_hidden_size % tp == 0) {
        tps.push_back(tp);
      }
    }
  }
  std::vector<ProbeSample> samples;
  const int reps = options.repetitions;
  for (int tp : tps) {
    const int64_t heads = m.num_attention_heads / tp, kv = m.num_query_groups / tp;
    const int64_t qkv = (heads + 2 * kv) * d, ffn = m.ffn_hidden_size / tp;
    const int64_t fc1 = m.activation == Activation::kSwiGLU ? 2 * ffn : ffn;
    // GEMMs of one layer's linear projections, forward, one sequence.
    struct Shape { const char* name; int64_t n, k; double sharded; };
    for (const Shape& g : {Shape{"qkv", qkv, h, static_cast<double>(heads * d)},
                           Shape{"fc1", fc1, h, static_cast<double>(ffn)},
                           Shape{"fc2", h, ffn, static_cast<double>(ffn)}}) {
      AUTOPAR_ASSIGN_OR_RETURN(Buffer x, dev.Allocate(T * g.k, dt));
      AUTOPAR_ASSIGN_OR_RETURN(Buffer w, dev.Allocate(g.n * g.k, dt));
      AUTOPAR_ASSIGN_OR_RETURN(Buffer y, dev.Allocate(T * g.n, dt));
      AUTOPAR_RETURN_IF_ERROR(dev.FillHash(x.tensor(), {1, 0.5f}));
      AUTOPAR_RETURN_IF_ERROR(dev.FillHash(w.tensor(), {2, 0.02f}));
      backend::GemmDesc desc;
      desc.trans_b = true;
      desc.m = T;
      desc.n = g.n;
      desc.k = g.k;
      AUTOPAR_ASSIGN_OR_RETURN(double s, Time(dev, world, reps, [&] {
        return dev.Gemm(desc, x.tensor(), w.tensor(), y.tensor());
      }));
      const double flops = 2.0 * T * g.n * g.k;
      samples.push_back({std::string("gemm ") + g.name + " tp=" + std::to_string(tp), kGemm, s,
                         cost.GemmTime(flops, g.sharded)});
    }
    // Causal attention over the sequence with this tp's heads.
    {
      AUTOPAR_ASSIGN_OR_RETURN(Buffer q, dev.Allocate(T * qkv, dt));
      AUTOPAR_ASSIGN_OR_RETURN(Buffer o, dev.Allocate(T * heads * d, dt));
      AUTOPAR_ASSIGN_OR_RETURN(Buffer lse, dev.Allocate(T * heads, DType::kF32));
      AUTOPAR_RETURN_IF_ERROR(dev.FillHash(q.tensor(), {3, 0.5f}));
      backend::AttentionDesc a;
      a.batch = 1;
      a.heads_q = heads;
      a.heads_kv = kv;
      a.head_dim = d;
      a.seq_q = a.seq_kv = T;
      a.q_stride = a.kv_stride = qkv;
      const Tensor all = q.tensor();
      AUTOPAR_ASSIGN_OR_RETURN(double s, Time(dev, world, reps, [&] {
        return dev.AttentionForward(a, all, all.Slice(heads * d, all.numel - heads * d),
                                    all.Slice((heads + kv) * d, all.numel - (heads + kv) * d),
                                    o.tensor(), lse.tensor());
      }));
      const double flops = 0.5 * 4.0 * T * T * heads * d;  // causal half of QKᵀ and PV
      samples.push_back({"attention tp=" + std::to_string(tp), kAttention, s,
                         cost.AttentionTime(flops)});
    }
  }
  // A norm over the hidden states: memory-bound.
  {
    AUTOPAR_ASSIGN_OR_RETURN(Buffer x, dev.Allocate(T * h, dt));
    AUTOPAR_ASSIGN_OR_RETURN(Buffer y, dev.Allocate(T * h, dt));
    AUTOPAR_ASSIGN_OR_RETURN(Buffer g, dev.Allocate(h, dt));
    AUTOPAR_ASSIGN_OR_RETURN(Buffer r, dev.Allocate(T, DType::kF32));
    AUTOPAR_RETURN_IF_ERROR(dev.FillHash(x.tensor(), {4, 1.0f}));
    AUTOPAR_RETURN_IF_ERROR(dev.Fill(g.tensor(), 1.0f));
    AUTOPAR_ASSIGN_OR_RETURN(double s, Time(dev, world, reps, [&] {
      return dev.RmsNormForward({T, h, 1e-5f}, x.tensor(), g.tensor(), y.tensor(), r.tensor());
    }));
    samples.push_back({"rmsnorm", kMemoryBound, s, cost.MemoryBoundTime(2 * elem * T * h)});
  }
  // All-reduces of one layer's activations on groups inside a node (stride 1, tp-like) and
  // across nodes (stride = a node, dp-like).
  const int world_size = world.size(), rank = world.rank();
  const int gpn = static_cast<int>(cluster.gpus_per_node);
  double setup_first_s = 0, setup_cached_s = 0;
  for (int stride : {1, gpn}) {
    if (stride == gpn && cluster.nnodes == 1) continue;
    for (int n = 2; n * stride <= world_size; n *= 2) {
      if (world_size % (n * stride) != 0 || (stride == 1 && n > gpn)) continue;
      const int block = n * stride;
      const int color = (rank / block) * stride + rank % stride;
      AUTOPAR_ASSIGN_OR_RETURN(backend::Group group, world.Split(color, (rank % block) / stride));
      // Twice: the first connection builds the communicator, the second shows what a later
      // trial over the same ranks pays.
      backend::WallTimer setup;
      AUTOPAR_ASSIGN_OR_RETURN(auto first, be.ConnectSplit(world, group));
      setup_first_s += setup.Seconds();
      first.reset();
      setup.Start();
      AUTOPAR_ASSIGN_OR_RETURN(auto coll, be.ConnectSplit(world, group));
      setup_cached_s += setup.Seconds();
      AUTOPAR_ASSIGN_OR_RETURN(Buffer buf, dev.Allocate(T * h, backend::DType::kF32));
      AUTOPAR_RETURN_IF_ERROR(dev.Fill(buf.tensor(), 1.0f));
      AUTOPAR_ASSIGN_OR_RETURN(double s, Time(dev, world, reps, [&] {
        return coll->AllReduce(buf.tensor(), buf.tensor(), backend::ReduceOp::kSum);
      }));
      const double bytes = elem * T * h;
      samples.push_back({"allreduce n=" + std::to_string(n) + " stride=" + std::to_string(stride),
                         stride == 1 ? kTpComm : kDpComm, s, cost.AllReduceTime(bytes, n, stride)});
    }
  }
  if (overheads != nullptr) {
    AUTOPAR_RETURN_IF_ERROR(dev.Synchronize());
    AUTOPAR_ASSIGN_OR_RETURN(const size_t non_tensor, dev.NonTensorBytes());
    AUTOPAR_ASSIGN_OR_RETURN(overheads->comm_setup_first_s, Slowest(world, setup_first_s));
    AUTOPAR_ASSIGN_OR_RETURN(overheads->comm_setup_cached_s, Slowest(world, setup_cached_s));
    AUTOPAR_ASSIGN_OR_RETURN(const double gib,
                             Slowest(world, static_cast<double>(non_tensor) / (1u << 30)));
    overheads->non_tensor_gib = gib;
  }
  return samples;
}

std::array<double, kNumFeatures> ProbeRatios(const std::vector<ProbeSample>& samples) {
  std::array<double, kNumFeatures> log_sum{}, count{}, ratio{};
  for (const ProbeSample& s : samples) {
    if (s.measured_s <= 0 || s.predicted_s <= 0) continue;
    log_sum[s.feature] += std::log(s.measured_s / s.predicted_s);
    count[s.feature] += 1;
  }
  for (int k = 0; k < kNumFeatures; ++k) {
    ratio[k] = count[k] > 0 ? std::exp(log_sum[k] / count[k]) : 1.0;
  }
  return ratio;
}

}  // namespace autopar::trial
