// The CPU platform: a CpuDevice plus MPI collectives.
#include <cblas.h>

#include <memory>
#include <string>

#include "autopar/device/platform.h"
#include "src/device/cpu/cpu_device.h"
#include "src/device/cpu/mpi_collectives.h"

namespace autopar::device {
namespace {

class CpuPlatform final : public Platform {
 public:
  explicit CpuPlatform(const CpuPlatformOptions& options)
      : device_(options), p2p_semantics_(options.p2p_semantics) {}

  std::string_view name() const override { return "cpu"; }
  Device& device() override { return device_; }
  StatusOr<std::unique_ptr<Collectives>> Connect(const Group& group) override {
    return MakeMpiCollectives(group, p2p_semantics_);
  }

 private:
  CpuDevice device_;
  P2PSemantics p2p_semantics_;
};

}  // namespace

StatusOr<std::unique_ptr<Platform>> MakeCpuPlatform(const CpuPlatformOptions& options) {
  AUTOPAR_CHECK_ARG(options.blas_threads >= 1, "blas_threads must be at least 1");
  AUTOPAR_CHECK_ARG(options.attention_block_q >= 1 && options.attention_block_kv >= 1,
                    "attention blocks must be at least 1");
#ifdef OPENBLAS_VERSION
  // Ranks sharing a host each get their share of cores; OpenBLAS would otherwise spawn one thread
  // per core in every rank.
  openblas_set_num_threads(options.blas_threads);
#endif
  return std::unique_ptr<Platform>(std::make_unique<CpuPlatform>(options));
}

}  // namespace autopar::device
