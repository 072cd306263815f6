// The GPU figures of scripts/gpu_check.sh, measured through the platform's Device interface (the
// ops trials run) and printed as one JSON object; scripts/gpu_check_report.py sets their targets.
//
//   mpirun -np 1 gpu_bench   attention forward and backward TFLOP/s (bf16, causal, head_dim 128,
//                            GQA 8:1: 32 query heads, 4 key/value heads; seq 4k, 8k, 32k),
//                            bf16 GEMM 8192³ TFLOP/s, and the device attention's largest error
//                            against the host double reference (kernels/attention.cc)
//   mpirun -np N gpu_bench   (N >= 2) NCCL all-reduce bus bandwidth, one GPU per rank
//
// Timing (nccl-tests' and FlashAttention's benchmarks): warm-up calls, then cudaEvents recorded on
// the device's compute stream around each repetition; the figure is the median repetition (for
// the all-reduce, the slowest rank's median).
//
// FLOPs, as FlashAttention's benchmarks and Megatron count them (2 per multiply-add):
//   attention forward   4 · batch · seq² · heads_q · head_dim, halved when causal (QKᵀ and PV
//                       over the visible half of the score matrix);
//   attention backward  2.5 × forward (dQ, dK, dV, dP and the recomputed QKᵀ: five products of the
//                       forward's two);
//   GEMM                2 · m · n · k;
//   all-reduce          bus bandwidth = 2 (n - 1) / n · bytes / time (nccl-tests' busBw).
//
// Attention runs on the engine the CUDA device picks; AUTOPAR_ATTENTION (src/device/cuda/
// cudnn_attention_plan.h: auto, kernel, cudnn) chooses it per process, so one engine per run, and
// the JSON records what was asked for. On the CUDA-core kernel (AUTOPAR_ATTENTION=kernel, a
// comparison with no speed target) the 32k shape is left out: at ~10 TFLOP/s its 13 forward and
// backward calls alone would take over a minute of gpu_check's few minutes of device time.
//
// Without a GPU of its own on every rank, it prints {"skipped": "no GPU"} and exits 0. Exit 1 when
// an op fails. With AUTOPAR_GPU_BENCH_DIR set, rank 0 also writes the JSON to
// $AUTOPAR_GPU_BENCH_DIR/<name>.json (`--name NAME`, default gpu_bench_np<ranks>); AUTOPAR_GPU (a
// GPU preset name) adds that preset's bf16 peak and NVLink bandwidth to the JSON, for the targets.
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "autopar/device/cuda_platform.h"
#include "autopar/device/group.h"
#include "autopar/spec/parse.h"
#include "kernels/attention.h"
#include "src/device/cuda/cuda_device.h"

namespace autopar::device {
namespace {

constexpr int kWarmup = 3;
constexpr int kRepetitions = 10;

// cudaEvents around `run` on the device's compute stream: the median of kRepetitions after
// kWarmup calls, in seconds. `calls` back-to-back calls make one repetition.
StatusOr<double> TimeOnStream(
    CudaDevice& dev, int calls, const std::function<Status()>& run,
    const std::function<void()>& before_each = [] {}) {
  for (int i = 0; i < kWarmup; ++i) AUTOPAR_RETURN_IF_ERROR(run());
  AUTOPAR_RETURN_IF_ERROR(dev.Synchronize());
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    return Status(Outcome::kDeviceError, "gpu_bench: cudaEventCreate failed");
  }
  std::vector<double> seconds;
  Status status;
  for (int r = 0; r < kRepetitions && status.ok(); ++r) {
    before_each();
    cudaEventRecord(start, dev.stream());
    for (int c = 0; c < calls && status.ok(); ++c) status = run();
    cudaEventRecord(stop, dev.stream());
    if (status.ok()) status = dev.Synchronize();
    float ms = 0;
    if (status.ok() && cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
      status = Status(Outcome::kDeviceError, "gpu_bench: cudaEventElapsedTime failed");
    }
    seconds.push_back(ms * 1e-3 / calls);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  AUTOPAR_RETURN_IF_ERROR(status);
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

StatusOr<Buffer> Random(Device& dev, std::int64_t numel, std::uint64_t seed, float scale) {
  AUTOPAR_ASSIGN_OR_RETURN(Buffer b, dev.Allocate(numel, DType::kBF16));
  HashFill fill;
  fill.seed = seed;
  fill.scale = scale;
  AUTOPAR_RETURN_IF_ERROR(dev.FillHash(b.tensor(), fill));
  return b;
}

AttentionDesc GqaDesc(std::int64_t seq, std::int64_t batch) {
  AttentionDesc d;
  d.batch = batch;
  d.heads_q = 32;
  d.heads_kv = 4;
  d.head_dim = 128;
  d.seq_q = d.seq_kv = seq;
  d.causal = true;
  return d;
}

double AttentionForwardFlops(const AttentionDesc& d) {
  return 4.0 * d.batch * static_cast<double>(d.seq_q) * d.seq_kv * d.heads_q * d.head_dim /
         (d.causal ? 2.0 : 1.0);
}

// One attention shape forward and backward: {"seq", "batch", "forward_tflops", ...}.
StatusOr<std::string> BenchAttention(CudaDevice& dev, std::int64_t seq) {
  // Same tokens per call at 4k and 8k (16k), as FlashAttention's benchmarks; one sequence at 32k.
  const AttentionDesc d = GqaDesc(seq, std::max<std::int64_t>(1, 16384 / seq));
  const std::int64_t nq = d.seq_q * d.batch * d.heads_q * d.head_dim;
  const std::int64_t nkv = d.seq_kv * d.batch * d.heads_kv * d.head_dim;
  AUTOPAR_ASSIGN_OR_RETURN(Buffer q, Random(dev, nq, 1, 1.0f));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer k, Random(dev, nkv, 2, 1.0f));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer v, Random(dev, nkv, 3, 1.0f));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer dout, Random(dev, nq, 4, 1.0f));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer out, dev.Allocate(nq, DType::kBF16));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer lse, dev.Allocate(nq / d.head_dim, DType::kF32));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer dq, dev.Allocate(nq, DType::kBF16));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer dk, dev.Allocate(nkv, DType::kBF16));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer dv, dev.Allocate(nkv, DType::kBF16));
  AUTOPAR_ASSIGN_OR_RETURN(double fwd_s, TimeOnStream(dev, 1, [&] {
                             return dev.AttentionForward(d, q.tensor(), k.tensor(), v.tensor(),
                                                         out.tensor(), lse.tensor());
                           }));
  AUTOPAR_ASSIGN_OR_RETURN(double bwd_s, TimeOnStream(dev, 1, [&] {
                             return dev.AttentionBackward(
                                 d, q.tensor(), k.tensor(), v.tensor(), out.tensor(), dout.tensor(),
                                 lse.tensor(), dq.tensor(), dk.tensor(), dv.tensor(), false);
                           }));
  const double fwd_flops = AttentionForwardFlops(d);
  std::ostringstream j;
  j << "{\"seq\": " << seq << ", \"batch\": " << d.batch << ", \"heads_q\": " << d.heads_q
    << ", \"heads_kv\": " << d.heads_kv << ", \"head_dim\": " << d.head_dim
    << ", \"forward_s\": " << fwd_s << ", \"backward_s\": " << bwd_s
    << ", \"forward_tflops\": " << fwd_flops / fwd_s / 1e12
    << ", \"backward_tflops\": " << 2.5 * fwd_flops / bwd_s / 1e12 << "}";
  return j.str();
}

StatusOr<std::string> BenchGemm(CudaDevice& dev) {
  constexpr std::int64_t n = 8192;
  AUTOPAR_ASSIGN_OR_RETURN(Buffer a, Random(dev, n * n, 5, 1.0f));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer b, Random(dev, n * n, 6, 1.0f));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer c, dev.Allocate(n * n, DType::kBF16));
  GemmDesc g;
  g.m = g.n = g.k = n;
  AUTOPAR_ASSIGN_OR_RETURN(double s, TimeOnStream(dev, 5, [&] {
                             return dev.Gemm(g, a.tensor(), b.tensor(), c.tensor());
                           }));
  std::ostringstream j;
  j << "{\"m\": " << n << ", \"n\": " << n << ", \"k\": " << n << ", \"dtype\": \"bf16\""
    << ", \"seconds\": " << s << ", \"tflops\": " << 2.0 * n * n * n / s / 1e12 << "}";
  return j.str();
}

StatusOr<std::vector<double>> ToHost(Device& dev, Tensor t) {
  std::vector<double> host(static_cast<std::size_t>(t.numel));
  if (t.dtype == DType::kBF16) {
    std::vector<std::uint16_t> bits(host.size());
    AUTOPAR_RETURN_IF_ERROR(dev.CopyToHost(bits.data(), t, bits.size() * 2));
    for (std::size_t i = 0; i < host.size(); ++i) {
      const std::uint32_t word = std::uint32_t{bits[i]} << 16;
      float value = 0;
      std::memcpy(&value, &word, sizeof value);
      host[i] = value;
    }
  } else {
    std::vector<float> f(host.size());
    AUTOPAR_RETURN_IF_ERROR(dev.CopyToHost(f.data(), t, f.size() * sizeof(float)));
    host.assign(f.begin(), f.end());
  }
  return host;
}

// max |actual - expected| / max |expected|: one number per tensor, comparable across sizes.
double RelativeMaxError(const std::vector<double>& actual, const std::vector<double>& expected) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    err = std::max(err, std::abs(actual[i] - expected[i]));
    scale = std::max(scale, std::abs(expected[i]));
  }
  return scale > 0 ? err / scale : err;
}

// The device attention (whichever path the device takes for bf16, e.g. cuDNN) against the
// double-precision host reference on the bf16-rounded inputs: forward out and lse, then the
// backward's gradients given the device's own out and lse.
StatusOr<std::string> BenchAccuracy(CudaDevice& dev) {
  AttentionDesc d = GqaDesc(1024, 1);
  d.heads_q = 8;
  d.heads_kv = 1;
  const std::int64_t nq = d.seq_q * d.heads_q * d.head_dim,
                     nkv = d.seq_kv * d.heads_kv * d.head_dim;
  AUTOPAR_ASSIGN_OR_RETURN(Buffer q, Random(dev, nq, 11, 2.0f));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer k, Random(dev, nkv, 12, 2.0f));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer v, Random(dev, nkv, 13, 1.0f));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer dout, Random(dev, nq, 14, 1.0f));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer out, dev.Allocate(nq, DType::kBF16));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer lse, dev.Allocate(nq / d.head_dim, DType::kF32));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer dq, dev.Allocate(nq, DType::kBF16));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer dk, dev.Allocate(nkv, DType::kBF16));
  AUTOPAR_ASSIGN_OR_RETURN(Buffer dv, dev.Allocate(nkv, DType::kBF16));
  AUTOPAR_RETURN_IF_ERROR(
      dev.AttentionForward(d, q.tensor(), k.tensor(), v.tensor(), out.tensor(), lse.tensor()));
  AUTOPAR_RETURN_IF_ERROR(dev.AttentionBackward(d, q.tensor(), k.tensor(), v.tensor(), out.tensor(),
                                                dout.tensor(), lse.tensor(), dq.tensor(),
                                                dk.tensor(), dv.tensor(), false));
  AUTOPAR_RETURN_IF_ERROR(dev.Synchronize());
  std::vector<std::vector<double>> h;
  for (Tensor t : {q.tensor(), k.tensor(), v.tensor(), dout.tensor(), out.tensor(), lse.tensor(),
                   dq.tensor(), dk.tensor(), dv.tensor()}) {
    AUTOPAR_ASSIGN_OR_RETURN(std::vector<double> x, ToHost(dev, t));
    h.push_back(std::move(x));
  }
  const auto& [hq, hk, hv, hdout, hout, hlse, hdq, hdk, hdv] =
      std::tie(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8]);
  kernels::ref::AttentionShape s;
  s.batch = d.batch;
  s.heads_q = d.heads_q;
  s.heads_kv = d.heads_kv;
  s.head_dim = d.head_dim;
  s.seq_q = d.seq_q;
  s.seq_kv = d.seq_kv;
  s.causal = d.causal;
  std::vector<double> out_ref(hout.size()), lse_ref(hlse.size());
  kernels::ref::AttentionForward(s, hq.data(), hk.data(), hv.data(), out_ref.data(),
                                 lse_ref.data());
  std::vector<double> dq_ref(hdq.size()), dk_ref(hdk.size()), dv_ref(hdv.size());
  kernels::ref::AttentionBackward(s, hq.data(), hk.data(), hv.data(), hout.data(), hdout.data(),
                                  hlse.data(), dq_ref.data(), dk_ref.data(), dv_ref.data());
  double lse_err = 0;
  for (std::size_t i = 0; i < hlse.size(); ++i) {
    lse_err = std::max(lse_err, std::abs(hlse[i] - lse_ref[i]));
  }
  std::ostringstream j;
  j << "{\"seq\": " << d.seq_q << ", \"heads_q\": " << d.heads_q << ", \"heads_kv\": " << d.heads_kv
    << ", \"head_dim\": " << d.head_dim << ", \"dtype\": \"bf16\""
    << ", \"out\": " << RelativeMaxError(hout, out_ref) << ", \"lse_abs\": " << lse_err
    << ", \"dq\": " << RelativeMaxError(hdq, dq_ref)
    << ", \"dk\": " << RelativeMaxError(hdk, dk_ref)
    << ", \"dv\": " << RelativeMaxError(hdv, dv_ref) << "}";
  return j.str();
}

// NCCL all-reduce (sum, bf16) of several sizes over the world: the slowest rank's median time.
StatusOr<std::string> BenchAllReduce(Platform& platform, CudaDevice& dev, const Group& world) {
  AUTOPAR_ASSIGN_OR_RETURN(std::unique_ptr<Collectives> comm, platform.Connect(world));
  const int n = world.size();
  std::ostringstream j;
  j << "[";
  bool first = true;
  for (std::int64_t bytes :
       {std::int64_t{16} << 20, std::int64_t{256} << 20, std::int64_t{1} << 30}) {
    // Out of place, as nccl-tests times it by default.
    AUTOPAR_ASSIGN_OR_RETURN(Buffer send, Random(dev, bytes / 2, 7, 1.0f));
    AUTOPAR_ASSIGN_OR_RETURN(Buffer recv, dev.Allocate(bytes / 2, DType::kBF16));
    AUTOPAR_ASSIGN_OR_RETURN(
        double mine,
        TimeOnStream(
            dev, 5, [&] { return comm->AllReduce(send.tensor(), recv.tensor(), ReduceOp::kSum); },
            [&] { MPI_Barrier(world.comm()); }));
    double slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, world.comm());
    const double algbw = static_cast<double>(bytes) / slowest;
    j << (first ? "" : ", ") << "{\"bytes\": " << bytes << ", \"seconds\": " << slowest
      << ", \"algbw_gbps\": " << algbw / 1e9
      << ", \"busbw_gbps\": " << 2.0 * (n - 1) / n * algbw / 1e9 << "}";
    first = false;
  }
  j << "]";
  comm.reset();  // before the platform's device
  return j.str();
}

// True on every rank iff every rank has a GPU of its own (ranks share the node's devices).
bool AllRanksHaveAGpu() {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local_size = 1;
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  int mine = CudaDeviceCount() >= local_size ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

std::string PresetJson() {
  const char* name = std::getenv("AUTOPAR_GPU");
  if (!name || !HasGpuPreset(name)) return "null";
  const GpuSpec g = GpuPreset(name);
  std::ostringstream j;
  j << "{\"name\": \"" << g.name << "\", \"peak_flops_bf16\": " << g.peak_flops_bf16
    << ", \"intra_node_bandwidth\": " << g.intra_node_bandwidth << "}";
  return j.str();
}

std::string Quoted(const std::string& text) {
  std::string q = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') q += '\\';
    q += (c == '\n' || c == '\t') ? ' ' : c;
  }
  return q + "\"";
}

// A part's JSON, or {"error": "..."} when it failed (and `failed` is set): one failed op must not
// hide the other figures.
std::string Part(StatusOr<std::string> part, bool& failed) {
  if (part.ok()) return *part;
  failed = true;
  std::fprintf(stderr, "gpu_bench: %s\n", part.status().ToString().c_str());
  return "{\"error\": " + Quoted(part.status().ToString()) + "}";
}

// Runs this rank's parts; the JSON object (rank 0 prints it), `failed` when any part failed.
StatusOr<std::string> Run(const Group& world, bool& failed) {
  CudaPlatformOptions options;  // the device of the node-local rank
  options.timeout_s = 120;
  AUTOPAR_ASSIGN_OR_RETURN(std::unique_ptr<Platform> platform, MakeCudaPlatform(options));
  auto* dev = dynamic_cast<CudaDevice*>(&platform->device());
  if (!dev) return Status(Outcome::kInvalid, "gpu_bench: the CUDA platform has no CudaDevice");
  const char* engine = std::getenv("AUTOPAR_ATTENTION");
  std::ostringstream j;
  j << "{\"ranks\": " << world.size() << ", \"device\": " << Quoted(std::string(dev->name()))
    << ", \"AUTOPAR_ATTENTION\": " << Quoted(engine ? engine : "")
    << ", \"gpus_visible\": " << CudaDeviceCount() << ", \"preset\": " << PresetJson();
  if (world.size() == 1) {
    j << ", \"attention\": [";
    const bool kernel_only = engine != nullptr && std::string(engine) == "kernel";
    for (std::int64_t seq : {4096, 8192, 32768}) {
      if (seq == 32768 && kernel_only) continue;
      j << (seq == 4096 ? "" : ", ") << Part(BenchAttention(*dev, seq), failed);
    }
    j << "], \"gemm\": " << Part(BenchGemm(*dev), failed)
      << ", \"attention_error\": " << Part(BenchAccuracy(*dev), failed);
  } else {
    j << ", \"allreduce\": " << Part(BenchAllReduce(*platform, *dev, world), failed);
  }
  j << "}";
  return j.str();
}

void Emit(const std::string& name, const std::string& json) {
  std::printf("%s\n", json.c_str());
  if (const char* dir = std::getenv("AUTOPAR_GPU_BENCH_DIR")) {
    const std::string path = std::string(dir) + "/" + name + ".json";
    if (std::FILE* f = std::fopen(path.c_str(), "w")) {
      std::fprintf(f, "%s\n", json.c_str());
      std::fclose(f);
    } else {
      std::fprintf(stderr, "gpu_bench: cannot write %s\n", path.c_str());
    }
  }
}

}  // namespace
}  // namespace autopar::device

int main(int argc, char** argv) {
  namespace device = autopar::device;
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) return 1;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string name = "gpu_bench_np" + std::to_string(size);
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--name") name = argv[i + 1];
  }
  int rc = 0;
  if (!device::AllRanksHaveAGpu()) {
    if (rank == 0) {
      std::printf("gpu_bench: skipped: no GPU (needs one CUDA device per rank, %d ranks)\n", size);
      device::Emit(name, "{\"ranks\": " + std::to_string(size) + ", \"skipped\": \"no GPU\"}");
    }
  } else {
    bool failed = false;
    device::StatusOr<device::Group> world = device::Group::World();
    device::StatusOr<std::string> json =
        world.ok() ? device::Run(*world, failed) : device::StatusOr<std::string>(world.status());
    if (!json.ok()) {
      std::fprintf(stderr, "[rank %d] gpu_bench: %s\n", rank, json.status().ToString().c_str());
      if (rank == 0)
        device::Emit(name, "{\"error\": " + device::Quoted(json.status().ToString()) + "}");
    } else if (rank == 0) {
      device::Emit(name, *json);
    }
    rc = failed || !json.ok() ? 1 : 0;
  }
  int any = rc;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
