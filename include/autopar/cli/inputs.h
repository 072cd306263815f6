// Command-line inputs shared by every subcommand: the model, the training job, the cluster, the
// user's restrictions of the space and the output format (docs/cli.md §2–§5).
#pragma once

#include <initializer_list>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "autopar/cli/help.h"
#include "autopar/device/p2p_semantics.h"
#include "autopar/perf/constants.h"
#include "autopar/space/config.h"
#include "autopar/space/space.h"
#include "autopar/spec/bounds.h"
#include "autopar/spec/cluster.h"
#include "autopar/spec/model.h"
#include "autopar/spec/train.h"

namespace autopar::cli {

enum class Format { kTable, kJson, kCsv, kMegatron, kYaml, kBridge };

// argv after the subcommand, split into `--flag value` / `--flag=value` / `--switch` items, read
// by the subcommand through its flag table (help.h): a flag the command's table does not list is
// not taken (Finish(), or the Megatron flag parsers after Remaining(), call it unknown), and a
// value is checked as the table says (a choice's allowed values, an integer's range), the
// InputError naming the flag. Reading a flag no command's table lists, or as another type than
// its row's, is a bug: std::logic_error.
class Args {
 public:
  // `command`: a name of Commands().
  Args(const std::vector<std::string>& argv, const std::string& command);

  // A kText, kChoice, kInt, kUnsigned, kNumber or kDuration flag's text; consumes it.
  std::optional<std::string> Value(const std::string& flag);
  bool Switch(const std::string& flag);                       // kSwitch; consumes it
  int64_t Int(const std::string& flag, int64_t fallback);     // kInt, in the row's range
  std::optional<uint64_t> Unsigned(const std::string& flag);  // kUnsigned
  double Double(const std::string& flag, double fallback);    // kNumber, from 0 to its max
  double Duration(const std::string& flag, const std::string& fallback);  // kDuration, seconds
  // `text` (a Value() read earlier) as kInt / kNumber flag `flag`'s row allows.
  int64_t IntOf(const std::string& flag, const std::string& text) const;
  double DoubleOf(const std::string& flag, const std::string& text) const;
  // Leftover flags, in order, as argv items (for the Megatron flag parser).
  std::vector<std::string> Remaining() const;
  // Throws InputError naming the first flag nobody consumed.
  void Finish() const;
  // Marks every flag consumed (after handing Remaining() to another parser).
  void ConsumeAll() {
    for (Item& item : items_) item.used = true;
  }

 private:
  struct Item {
    std::string flag;
    std::optional<std::string> value;
    // The further values of a Megatron-LM flag that takes several (argparse's nargs: its row's
    // value has more than one word, `UP CP`, `MODULE ...`), up to the next flag.
    std::vector<std::string> more;
    bool used = false;
  };
  Item* Find(const std::string& flag);
  // The command's row of `flag`, nullptr when the command does not take it; throws
  // std::logic_error when no command takes it or its row's type is not one of `types`.
  const FlagHelp* Row(const std::string& flag, std::initializer_list<FlagType> types) const;
  const CommandHelp* command_;
  std::vector<Item> items_;
};

struct Inputs {
  ModelSpec model;
  TrainSpec train;
  ClusterSpec cluster;
  SpaceOptions space;
  PerfConstants constants;
  Format format = Format::kTable;
  // Megatron-LM parallel flags on the command line (`--tensor-model-parallel-size 8`, ...): pins
  // in the space, and the configuration `predict` evaluates when no --config is given.
  std::optional<ParallelConfig> megatron_config;
  // The flag that made megatron_config's pipeline stages uneven ("" when they are even): `plan`
  // cannot pin such stages, its space splits the layers evenly.
  std::string megatron_uneven_flag;
  // The configuration of a pasted script (--megatron-args, --megatron-args-file): `plan`
  // searches around it and says where it ranks; `predict` evaluates it when nothing else is given.
  std::optional<ParallelConfig> script_config;
  // The words of --megatron-args / --megatron-args-file as the shell would split them: what
  // `tune --backend megatron` passes on to the training command (its parallel flags replaced).
  std::vector<std::string> megatron_words;
  // What the inputs assumed or ignored, one line each, for the user (stderr).
  std::vector<std::string> notes;
  // --host-cores: the cores the ranks of a `cpu`-device job share (they all run on one host).
  std::optional<int64_t> host_cores;
  // Neither --gpu nor --cluster named the GPU: the plan is for kAssumedGpu (WriteNotes says
  // so; --backend cuda refuses it, ApplyBackend).
  bool gpu_assumed = false;
};

// The GPU a plan assumes when no flag names one.
inline constexpr const char* kAssumedGpu = "a100-80gb";

// Reads the inputs every planning command takes, consuming every flag: the subcommand reads its
// own flags (`--top`, `--config`) before calling this.
Inputs ReadInputs(Args& args);

Format ParseFormat(const std::string& text);

// On `err`: the GPU the command plans for when no flag named it (in.gpu_assumed), then
// Inputs::notes, one "autopar-tune COMMAND: note: ..." line each.
void WriteNotes(std::ostream& err, const std::string& command, const Inputs& in);

// The CPU backend's device is a host core: unless --gpu or --cluster says otherwise, commands
// that will run on it plan with the `cpu` preset...
std::vector<std::string> WithCpuBackendDefaults(const std::vector<std::string>& argv);
// ...and predict fp32 training with nothing but the trial's tensors in the budget, on the share
// of this host's cores each rank gets (unless --host-cores said how many).
void ApplyCpuBackend(const std::string& backend, Inputs& in);
// What the trial backend needs of the inputs: --backend cuda times the GPU it runs on, so --gpu
// (or --cluster) must name it (an assumed GPU is refused, naming --gpu); then ApplyCpuBackend.
void ApplyBackend(const std::string& backend, Inputs& in);

// `--p2p-semantics mpi|nccl` of the MPI commands: how the CPU backend's collectives run (see
// device::P2PSemantics). The CUDA backend runs NCCL itself (only "nccl" is accepted there), and
// the replay backend runs no collectives (the flag is refused). Default: "mpi" on the CPU.
device::P2PSemantics ReadP2PSemantics(Args& args, const std::string& backend);

// The `cpu` device is one core per rank; when `host_cores` cores carry all the job's ranks, each
// rank computes and streams memory at host_cores / ranks of that (never more than one core).
void ShareHostCores(int64_t host_cores, ClusterSpec& cluster);

// Whole-file read with a checked error (InputError naming `flag`). A file larger than
// `max_bytes` is refused before it is read, naming the bound.
std::string ReadTextFile(const std::string& flag, const std::string& path,
                         int64_t max_bytes = bounds::kMaxDocumentBytes);

}  // namespace autopar::cli
