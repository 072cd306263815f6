// The numerical-equivalence test on the CUDA platform (bf16 compute, NCCL): the same layouts as
// the CPU test must give the single-GPU loss and updated weights within bf16 tolerance. Skipped
// cleanly where there is no GPU (every rank decides alike: no CUDA build or no device).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>

#include "autopar/device/platform.h"
#include "autopar/spec/parse.h"
#include "autopar/trial/trial.h"
#include "mpi_env.h"
#include "trial_setup.h"

#if defined(AUTOPAR_HAVE_CUDA) && AUTOPAR_HAVE_CUDA
#include "autopar/device/cuda_platform.h"
#endif

namespace autopar::trial {
namespace {

using device::Outcome;
using device::testing::World;

#if defined(AUTOPAR_HAVE_CUDA) && AUTOPAR_HAVE_CUDA
// NCCL needs a device per rank; the ranks of this test share one host.
bool HaveGpu() { return device::CudaDeviceCount() >= World().size(); }
std::unique_ptr<device::Platform> Gpu() {
  auto b = device::MakeCudaPlatform({});
  return b.ok() ? std::move(*b) : nullptr;
}
#else
bool HaveGpu() { return false; }
std::unique_ptr<device::Platform> Gpu() { return nullptr; }
#endif

TrainSpec Bf16Train() { return testing::SmallTrain(Precision::kBF16); }
using testing::NumericOptions;

// A case is SPEC, or MODEL:SPEC for another model than tiny; MODEL+qk is the preset with
// Megatron-core's --qk-layernorm.
class CudaEquivalence : public ::testing::TestWithParam<const char*> {};

ModelSpec ModelNamed(const std::string& name) {
  const bool qk = name.ends_with("+qk");
  ModelSpec m = ModelPreset(qk ? name.substr(0, name.size() - 3) : name);
  m.qk_layernorm = qk;
  return m;
}

std::pair<std::string, std::string> ModelAndSpec(const std::string& param) {
  const size_t colon = param.find(':');
  if (colon == std::string::npos) return {"tiny", param};
  return {param.substr(0, colon), param.substr(colon + 1)};
}

TEST_P(CudaEquivalence, LossAndUpdatedWeightsMatchOneGpu) {
  if (!HaveGpu()) GTEST_SKIP() << "needs one CUDA device per rank";
  std::unique_ptr<device::Platform> gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  const auto [model_name, spec] = ModelAndSpec(GetParam());
  const ModelSpec model = ModelNamed(model_name);
  auto self = World().Split(World().rank(), 0);
  ASSERT_TRUE(self.ok());
  ParallelConfig one;
  one.dp = 1;
  const TrialMeasurement ref = RunTrial(*gpu, *self, model, Bf16Train(), one, NumericOptions());
  ASSERT_EQ(ref.outcome, Outcome::kOk) << ref.message;
  const ParallelConfig c = Complete(ParseSpec(spec), World().size());
  const TrialMeasurement got = RunTrial(*gpu, World(), model, Bf16Train(), c, NumericOptions());
  ASSERT_EQ(got.outcome, Outcome::kOk) << got.message;
  // bf16 activations and reductions in another order: a few parts in a thousand.
  EXPECT_NEAR(got.loss, ref.loss, 1e-2 * std::abs(ref.loss));
  EXPECT_NEAR(got.weight_sum, ref.weight_sum, 1e-3 * std::max(1.0, std::abs(ref.weight_sum)));
  EXPECT_NEAR(got.weight_projection, ref.weight_projection,
              1e-3 * std::max(1.0, std::abs(ref.weight_projection)));
}

INSTANTIATE_TEST_SUITE_P(Trial, CudaEquivalence,
                         ::testing::Values("tp=2,dp=2", "tp=2,dp=2,sp=on", "pp=2,dp=2",
                                           "pp=2,dp=2,vpp=2", "tp=2,dp=2,dist_opt=on",
                                           "tp=2,pp=2,sp=on,recompute=full",
                                           "tp=2,pp=2,recompute=selective",
                                           "tp=2,pp=2,sp=on,recompute=selective,"
                                           "recompute_modules=layernorm+mlp",
                                           "pp=2,dp=2,pp_first=1",
                                           // The sequence splits: the ring (its chunk pairs
                                           // on cuDNN's two masks), the ring by all-gathered
                                           // K and V (prefix calls merged), Ulysses.
                                           "cp=2,dp=2", "cp=2,dp=2,cp_comm=allgather", "up=2,dp=2",
                                           // Chunks of one layer: the first the embedding
                                           // alone, the last the loss alone.
                                           "pp=2,dp=2,vpp=3,split_embedding=on,split_loss=on",
                                           // Dropless MoE: all-to-all and flex dispatch, with
                                           // etp < tp and etp > 1 (rows all-gathered).
                                           "tiny-moe:tp=2,dp=2,ep=2,sp=on",
                                           "tiny-moe:tp=2,dp=2,ep=4,sp=on,etp=1,dispatcher=flex",
                                           "tiny-moe:dp=4,ep=2,etp=2,dispatcher=flex",
                                           // qk-layernorm: the strided norms over the heads
                                           // in the fused QKV buffer, RMSNorm and LayerNorm.
                                           "tiny+qk:tp=2,dp=2", "tiny-gpt+qk:tp=2,pp=2,sp=on"));

}  // namespace
}  // namespace autopar::trial
