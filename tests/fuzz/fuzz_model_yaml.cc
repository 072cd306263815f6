// Fuzz target: the YAML readers of src/spec (--model FILE.yaml, --cluster, --gpu FILE.yaml).
// Clean ends: a spec, or an InputError naming the field. Anything else escaping is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "autopar/common/errors.h"
#include "autopar/spec/parse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    autopar::ModelSpec model = autopar::ModelFromYaml(text);
    (void)model;
  } catch (const autopar::InputError&) {
  }
  try {
    (void)autopar::GpuFromYaml(text);
  } catch (const autopar::InputError&) {
  }
  try {
    (void)autopar::ClusterFromYaml(text);
  } catch (const autopar::InputError&) {
  }
  return 0;
}
