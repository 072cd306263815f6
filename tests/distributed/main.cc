// Entry point of the distributed tests (run under mpirun, every rank runs every test in order).
//
// Only rank 0 prints GoogleTest's report; other ranks print just their failed assertions, tagged
// with the rank, so a failure on any rank is visible without four interleaved reports. The exit
// code is agreed over all ranks, so mpirun and ctest fail if any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "tests/distributed/mpi_env.h"

namespace autopar::device::testing {
namespace {

std::optional<Group> g_world;
std::unique_ptr<Platform> g_platform;
CpuPlatformOptions g_options;

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
};

}  // namespace

Group& World() { return *g_world; }
Platform& TestPlatform() { return *g_platform; }
CpuPlatformOptions TestPlatformOptions() { return g_options; }

}  // namespace autopar::device::testing

int main(int argc, char** argv) {
  namespace bt = autopar::device::testing;
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
    std::fprintf(stderr, "MPI_Init failed\n");
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  if (MPI_Comm_rank(MPI_COMM_WORLD, &rank) != MPI_SUCCESS) {
    std::fprintf(stderr, "MPI_Comm_rank failed\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new bt::FailurePrinter(rank));
  }

  // What GoogleTest left of the command line: --p2p-semantics mpi|nccl.
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string value = arg == "--p2p-semantics" && i + 1 < argc ? argv[++i]
                              : arg.rfind("--p2p-semantics=", 0) == 0 ? arg.substr(16)
                                                                     : "";
    autopar::device::StatusOr<autopar::device::P2PSemantics> semantics =
        autopar::device::ParseP2PSemantics(value);
    if (!semantics.ok()) {
      std::fprintf(stderr, "distributed_test: unknown argument '%s' (%s)\n", arg.c_str(),
                   semantics.status().ToString().c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    bt::g_options.p2p_semantics = *semantics;
  }
  if (rank == 0) {
    std::printf(
        "p2p semantics: %s\n",
        std::string(autopar::device::P2PSemanticsName(bt::g_options.p2p_semantics)).c_str());
  }
  autopar::device::StatusOr<autopar::device::Group> world = autopar::device::Group::World();
  autopar::device::StatusOr<std::unique_ptr<autopar::device::Platform>> platform =
      autopar::device::MakeCpuPlatform(bt::g_options);
  if (!world.ok() || !platform.ok()) {
    std::fprintf(stderr, "[rank %d] setup failed: %s %s\n", rank, world.status().ToString().c_str(),
                 platform.status().ToString().c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  bt::g_world.emplace(std::move(world).value());
  bt::g_platform = std::move(platform).value();

  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = failed;
  if (MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS) {
    any_failed = 1;
  }
  if (rank == 0 && any_failed && !failed) {
    std::printf("FAILED on another rank: see the [rank N] lines above\n");
  }
  bt::g_platform.reset();
  bt::g_world.reset();  // frees the communicator while MPI is still up
  if (MPI_Finalize() != MPI_SUCCESS) return 1;
  return any_failed;
}
