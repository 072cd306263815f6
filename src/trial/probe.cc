#include "autopar/trial/probe.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>

#include "autopar/device/timer.h"
#include "autopar/spec/units.h"

namespace autopar::trial {
namespace {

using device::Buffer;
using device::DType;
using device::OkStatus;
using device::Outcome;
using device::Status;
using device::StatusOr;
using device::Tensor;

// The maximum over ranks of a host value.
StatusOr<double> Slowest(const device::Group& world, double mine) {
  double slowest = 0;
  if (MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, world.comm()) != MPI_SUCCESS) {
    return Status(Outcome::kCommError, "probe: MPI_Allreduce failed");
  }
  return slowest;
}

// Median over repetitions (after one warm-up) of `run`, then the maximum over ranks.
template <class Fn>
StatusOr<double> Time(device::Device& dev, const device::Group& world, int repetitions, Fn run) {
  AUTOPAR_RETURN_IF_ERROR(run());
  std::vector<double> times;
  for (int i = 0; i < repetitions; ++i) {
    AUTOPAR_RETURN_IF_ERROR(dev.Synchronize());
    device::WallTimer timer;
    AUTOPAR_RETURN_IF_ERROR(run());
    AUTOPAR_RETURN_IF_ERROR(dev.Synchronize());
    times.push_back(timer.Seconds());
  }
  std::sort(times.begin(), times.end());
  return Slowest(world, times[times.size() / 2]);
}

// Tensor-parallel degrees to probe: the options', else the powers of two up to a node that
// divide the heads, the kv heads and the MLP width.
std::vector<int> ProbedTpDegrees(const ModelSpec& m, const ClusterSpec& cluster,
                                 const ProbeOptions& options) {
  std::vector<int> tps = options.tp_values;
  if (tps.empty()) {
    for (int tp = 1; tp <= cluster.gpus_per_node; tp *= 2) {
      if (m.num_attention_heads % tp == 0 && m.num_query_groups % tp == 0 &&
          m.ffn_hidden_size % tp == 0) {
        tps.push_back(tp);
      }
    }
  }
  return tps;
}

// Times the probe's work on one device, over one sequence of `tokens` rows, and adds each
// measurement with the analytic time for the same work to `samples`.
class Prober {
 public:
  Prober(device::Device& dev, const device::Group& world, const CostModel& cost, int repetitions,
         int64_t tokens)
      : dev_(dev),
        world_(world),
        cost_(cost),
        reps_(repetitions),
        tokens_(tokens),
        dt_(dev.compute_dtype()),
        elem_(static_cast<double>(device::DTypeSize(dt_))) {}

  // GEMMs of one layer's linear projections, forward, at tensor-parallel degree tp.
  Status Gemms(const ModelSpec& m, int tp);
  // Causal attention over the sequence with tp's heads.
  Status Attention(const ModelSpec& m, int tp);
  // A norm over the hidden states: memory-bound.
  Status Norm(int64_t h);
  // All-reduces of one layer's activations on groups inside a node (stride 1, tp-like) and
  // across nodes (stride = a node, dp-like).
  Status AllReduces(device::Platform& platform, const ClusterSpec& cluster, int64_t h);
  // The slowest rank's communicator set-up times and non-tensor memory.
  Status Overheads(ProbeOverheads& overheads);

  std::vector<ProbeSample> samples;

 private:
  Status Gemm(const char* name, int64_t n, int64_t k, double sharded, int tp);
  // On the group of n ranks at `stride` that holds this rank.
  Status AllReduce(device::Platform& platform, int n, int stride, int64_t h);

  device::Device& dev_;
  const device::Group& world_;
  const CostModel& cost_;
  const int reps_;
  const int64_t tokens_;
  const DType dt_;
  const double elem_;
  double setup_first_s_ = 0, setup_cached_s_ = 0;  // summed over the all-reduce groups
};

Status Prober::Gemms(const ModelSpec& m, int tp) {
  const int64_t h = m.hidden_size, d = m.head_dim();
  const int64_t heads = m.num_attention_heads / tp, kv = m.num_query_groups / tp;
  const int64_t qkv = (heads + 2 * kv) * d, ffn = m.ffn_hidden_size / tp;
  const int64_t fc1 = m.activation == Activation::kSwiGLU ? 2 * ffn : ffn;
  AUTOPAR_RETURN_IF_ERROR(Gemm("qkv", qkv, h, static_cast<double>(heads * d), tp));
  AUTOPAR_RETURN_IF_ERROR(Gemm("fc1", fc1, h, static_cast<double>(ffn), tp));
  return Gemm("fc2", h, ffn, static_cast<double>(ffn), tp);
}

Status Prober::Gemm(const char* name, int64_t n, int64_t k, double sharded, int tp) {
  AUTOPAR_ASSIGN_OR_RETURN(Buffer x, dev_.Allocate(tokens_ * k, dt_));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer w, dev_.Allocate(n * k, dt_));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer y, dev_.Allocate(tokens_ * n, dt_));
  AUTOPAR_RETURN_IF_ERROR(dev_.FillHash(x.tensor(), {1, 0.5f}));
  AUTOPAR_RETURN_IF_ERROR(dev_.FillHash(w.tensor(), {2, 0.02f}));
  device::GemmDesc desc;
  desc.trans_b = true;
  desc.m = tokens_;
  desc.n = n;
  desc.k = k;
  AUTOPAR_ASSIGN_OR_RETURN(double s, Time(dev_, world_, reps_, [&] {
                             return dev_.Gemm(desc, x.tensor(), w.tensor(), y.tensor());
                           }));
  const double flops = 2.0 * tokens_ * n * k;
  samples.push_back({std::string("gemm ") + name + " tp=" + std::to_string(tp), kGemm, s,
                     cost_.GemmTime(flops, sharded)});
  return OkStatus();
}

Status Prober::Attention(const ModelSpec& m, int tp) {
  const int64_t T = tokens_, d = m.head_dim();
  const int64_t heads = m.num_attention_heads / tp, kv = m.num_query_groups / tp;
  const int64_t qkv = (heads + 2 * kv) * d;
  AUTOPAR_ASSIGN_OR_RETURN(Buffer q, dev_.Allocate(T * qkv, dt_));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer o, dev_.Allocate(T * heads * d, dt_));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer lse, dev_.Allocate(T * heads, DType::kF32));
  AUTOPAR_RETURN_IF_ERROR(dev_.FillHash(q.tensor(), {3, 0.5f}));
  device::AttentionDesc a;
  a.batch = 1;
  a.heads_q = heads;
  a.heads_kv = kv;
  a.head_dim = d;
  a.seq_q = a.seq_kv = T;
  a.q_stride = a.kv_stride = qkv;
  const Tensor all = q.tensor();
  AUTOPAR_ASSIGN_OR_RETURN(double s, Time(dev_, world_, reps_, [&] {
                             return dev_.AttentionForward(
                                 a, all, all.Slice(heads * d, all.numel - heads * d),
                                 all.Slice((heads + kv) * d, all.numel - (heads + kv) * d),
                                 o.tensor(), lse.tensor());
                           }));
  const double flops = 0.5 * 4.0 * T * T * heads * d;  // causal half of QKᵀ and PV
  samples.push_back(
      {"attention tp=" + std::to_string(tp), kAttention, s, cost_.AttentionTime(flops)});
  return OkStatus();
}

Status Prober::Norm(int64_t h) {
  const int64_t T = tokens_;
  AUTOPAR_ASSIGN_OR_RETURN(Buffer x, dev_.Allocate(T * h, dt_));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer y, dev_.Allocate(T * h, dt_));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer g, dev_.Allocate(h, dt_));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer r, dev_.Allocate(T, DType::kF32));
  AUTOPAR_RETURN_IF_ERROR(dev_.FillHash(x.tensor(), {4, 1.0f}));
  AUTOPAR_RETURN_IF_ERROR(dev_.Fill(g.tensor(), 1.0f));
  AUTOPAR_ASSIGN_OR_RETURN(
      double s, Time(dev_, world_, reps_, [&] {
        return dev_.RmsNormForward({T, h, 1e-5f}, x.tensor(), g.tensor(), y.tensor(), r.tensor());
      }));
  samples.push_back({"rmsnorm", kMemoryBound, s, cost_.MemoryBoundTime(2 * elem_ * T * h)});
  return OkStatus();
}

Status Prober::AllReduces(device::Platform& platform, const ClusterSpec& cluster, int64_t h) {
  const int world_size = world_.size();
  const int gpn = static_cast<int>(cluster.gpus_per_node);
  for (int stride : {1, gpn}) {
    if (stride == gpn && cluster.nnodes == 1) continue;
    for (int n = 2; n * stride <= world_size; n *= 2) {
      if (world_size % (n * stride) != 0 || (stride == 1 && n > gpn)) continue;
      AUTOPAR_RETURN_IF_ERROR(AllReduce(platform, n, stride, h));
    }
  }
  return OkStatus();
}

Status Prober::AllReduce(device::Platform& platform, int n, int stride, int64_t h) {
  const int rank = world_.rank();
  const int block = n * stride;
  const int color = (rank / block) * stride + rank % stride;
  AUTOPAR_ASSIGN_OR_RETURN(device::Group group, world_.Split(color, (rank % block) / stride));
  // Twice: the first connection builds the communicator, the second shows what a later
  // trial over the same ranks pays.
  device::WallTimer setup;
  AUTOPAR_ASSIGN_OR_RETURN(auto first, platform.ConnectSplit(world_, group));
  setup_first_s_ += setup.Seconds();
  first.reset();
  setup.Start();
  AUTOPAR_ASSIGN_OR_RETURN(auto coll, platform.ConnectSplit(world_, group));
  setup_cached_s_ += setup.Seconds();
  AUTOPAR_ASSIGN_OR_RETURN(Buffer buf, dev_.Allocate(tokens_ * h, device::DType::kF32));
  AUTOPAR_RETURN_IF_ERROR(dev_.Fill(buf.tensor(), 1.0f));
  AUTOPAR_ASSIGN_OR_RETURN(double s, Time(dev_, world_, reps_, [&] {
                             return coll->AllReduce(buf.tensor(), buf.tensor(),
                                                    device::ReduceOp::kSum);
                           }));
  const double bytes = elem_ * tokens_ * h;
  samples.push_back({"allreduce n=" + std::to_string(n) + " stride=" + std::to_string(stride),
                     stride == 1 ? kTpComm : kDpComm, s, cost_.AllReduceTime(bytes, n, stride)});
  return OkStatus();
}

Status Prober::Overheads(ProbeOverheads& overheads) {
  AUTOPAR_RETURN_IF_ERROR(dev_.Synchronize());
  AUTOPAR_ASSIGN_OR_RETURN(const size_t non_tensor, dev_.NonTensorBytes());
  AUTOPAR_ASSIGN_OR_RETURN(overheads.comm_setup_first_s, Slowest(world_, setup_first_s_));
  AUTOPAR_ASSIGN_OR_RETURN(overheads.comm_setup_cached_s, Slowest(world_, setup_cached_s_));
  AUTOPAR_ASSIGN_OR_RETURN(const double gib,
                           Slowest(world_, static_cast<double>(non_tensor) / kGiB));
  overheads.non_tensor_gib = gib;
  return OkStatus();
}

}  // namespace

StatusOr<std::vector<ProbeSample>> RunProbe(device::Platform& platform, const device::Group& world,
                                            const ModelSpec& m, const TrainSpec& t,
                                            const ClusterSpec& cluster, const CostModel& cost,
                                            const ProbeOptions& options,
                                            ProbeOverheads* overheads) {
  Prober probe(platform.device(), world, cost, options.repetitions, t.seq_length);
  for (int tp : ProbedTpDegrees(m, cluster, options)) {
    AUTOPAR_RETURN_IF_ERROR(probe.Gemms(m, tp));
    AUTOPAR_RETURN_IF_ERROR(probe.Attention(m, tp));
  }
  AUTOPAR_RETURN_IF_ERROR(probe.Norm(m.hidden_size));
  AUTOPAR_RETURN_IF_ERROR(probe.AllReduces(platform, cluster, m.hidden_size));
  if (overheads != nullptr) AUTOPAR_RETURN_IF_ERROR(probe.Overheads(*overheads));
  return std::move(probe.samples);
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
