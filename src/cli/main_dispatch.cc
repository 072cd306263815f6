#include <iostream>

#include "autopar/cli/commands.h"
#include "autopar/common/status.h"
#include "autopar/spec/parse.h"

namespace autopar::cli {
namespace {

constexpr const char* kUsage = R"(usage: autopar-tune [COMMAND] [FLAGS]

commands:
  plan       rank the feasible space with the analytic model (no trials); --top K, --breakdown
  predict    one configuration: --config SPEC (tp=8,pp=4,dp=2,cp=1,up=1,ep=1,vpp=1,mbs=1,
             sp=on,recompute=selective,dist_opt=on; omitted keys take defaults)

inputs:
  --model NAME|FILE.yaml|config.json   or Megatron flags (--num-layers --hidden-size ...)
  --megatron-args "TEXT" | --megatron-args-file FILE   a pasted Megatron-LM argument list
  --global-batch-size N --seq-length N [--bf16|--fp16|--fp8-format hybrid]
  --nnodes N --nproc-per-node N --gpu NAME|FILE.yaml --cluster FILE.yaml --device-memory-gib X
space:
  --tp/--pp/--dp/--cp/--up/--ep/--vpp/--mbs LIST   --recompute none,selective,full
  --fix KEY=VALUE,...   --tp-across-nodes   --sweep-recompute-layers   --max-mbs N
output:
  --format table|json|csv|megatron|yaml
exit codes: 0 ok, 2 bad input, 3 no feasible configuration, 4 study locked or mismatched
)";

}  // namespace

int Main(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h" || argv[0] == "help") {
    out << kUsage;
    return argv.empty() ? kExitBadInput : kExitOk;
  }
  const std::string command = argv[0];
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  try {
    if (command == "plan") return RunPlan(rest, out, err);
    if (command == "predict") return RunPredict(rest, out, err);
    if (command == "presets") {
      out << "models:";
      for (const auto& n : ModelPresetNames()) out << " " << n;
      out << "\ngpus:";
      for (const auto& n : GpuPresetNames()) out << " " << n;
      out << "\n";
      return kExitOk;
    }
    err << "autopar-tune: unknown command '" << command << "'; allowed: plan, predict, presets\n";
    return kExitBadInput;
  } catch (const InputError& e) {
    err << "autopar-tune " << command << ": " << e.what() << "\n";
    return kExitBadInput;
  }
}

}  // namespace autopar::cli
