// fp8 runs only where there are fp8 GEMMs: the CPU backend refuses --fp8-format up front.
#include <gtest/gtest.h>

#include <string>

#include "autopar/cli/inputs.h"
#include "autopar/common/errors.h"

namespace autopar::cli {
namespace {

TEST(CpuBackendFp8, RefusesTheFlagNamingItAndWhereFp8Runs) {
  Inputs in;
  in.train.precision = Precision::kFP8;
  try {
    ApplyCpuBackend("cpu", in);
    FAIL() << "an fp8 run on the cpu backend was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--fp8-format");
    EXPECT_NE(std::string(e.what()).find("--backend cuda"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("8.9"), std::string::npos) << e.what();
  }
}

TEST(CpuBackendFp8, OtherPrecisionsBecomeFp32AndOtherBackendsKeepFp8) {
  Inputs in;
  in.train.precision = Precision::kBF16;
  ApplyCpuBackend("cpu", in);
  EXPECT_EQ(in.train.precision, Precision::kFP32);
  in.train.precision = Precision::kFP8;
  ApplyCpuBackend("cuda", in);
  EXPECT_EQ(in.train.precision, Precision::kFP8);
}

}  // namespace
}  // namespace autopar::cli
