// Fuzz target: the Hugging Face config.json reader of src/spec (--model config.json).
// Clean ends: a spec, or an InputError naming the key. Anything else escaping is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "autopar/common/errors.h"
#include "autopar/spec/parse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)autopar::ModelFromHfConfig(text);
  } catch (const autopar::InputError&) {
  }
  return 0;
}
