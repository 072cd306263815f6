// Fuzz target: a pasted Megatron-LM command line or launch script (--megatron-args,
// --megatron-args-file): split into words as bash would (SplitCommandLine), then read as model
// and train flags (ApplyMegatronFlags). Clean ends: the specs, or an InputError naming the flag.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "autopar/common/errors.h"
#include "autopar/spec/parse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  autopar::ShellVariables variables;
  variables.overrides["PP"] = "4";
  variables.environment["HOME"] = "/home/fuzz";
  try {
    const std::vector<std::string> words = autopar::SplitCommandLine(text, variables);
    autopar::TrainSpec train;
    train.global_batch_size = 0;
    (void)autopar::ApplyMegatronFlags(words, autopar::ModelSpec{}, train);
  } catch (const autopar::InputError&) {
  }
  return 0;
}
