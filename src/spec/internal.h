// Helpers shared by the spec parsers (private to src/spec).
//
// All of them turn malformed text into InputError naming the field, so the parsers can read
// values without repeating checks.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "autopar/common/errors.h"
#include "autopar/spec/bounds.h"
#include "autopar/spec/model.h"

namespace autopar::spec_internal {

// The text of src/spec/gpu_presets.yaml, compiled in by CMakeLists.txt (gpu_presets_data.cc in
// the build tree), so that the presets need no file at run time.
extern const char kGpuPresetsYaml[];

std::string Lower(std::string_view text);
std::string Join(const std::vector<std::string>& items, std::string_view separator);

// Strict number parsing: the whole text must be the number (no "4096.5", no "32k").
int64_t ParseInt(std::string_view text, const std::string& field);
double ParseDouble(std::string_view text, const std::string& field);

// Throws InputError naming `field` when `value` is past `bound` (include/autopar/spec/bounds.h).
void RequireAtMost(int64_t value, int64_t bound, const char* field);
using bounds::kMaxBatch;
using bounds::kMaxDocumentBytes;
using bounds::kMaxExperts;
using bounds::kMaxFfn;
using bounds::kMaxGpus;
using bounds::kMaxLayers;
using bounds::kMaxSequence;
using bounds::kMaxTokensPerStep;
using bounds::kMaxVocabulary;
using bounds::kMaxWidth;

// The same message under another field name, for errors raised by a callee that names a flag
// (`--gpu`) where the user wrote a key (`gpu`).
InputError Rename(const InputError& error, std::string field);

// Parses a YAML (or JSON) document that must be a mapping. `kind` names the document in errors
// ("model YAML", "config.json"), with the parser's 1-based line and column.
YAML::Node LoadMapping(const std::string& text, const std::string& kind);

// Scalar readers; `field` is what an error names.
int64_t NodeInt(const YAML::Node& node, const std::string& field);
double NodeDouble(const YAML::Node& node, const std::string& field);
bool NodeBool(const YAML::Node& node, const std::string& field);
std::string NodeString(const YAML::Node& node, const std::string& field);

// Enum spellings, case-insensitive; the error lists the accepted values. The canonical spellings
// are those ToString prints (Megatron-LM's where it has one).
Activation ParseActivation(std::string_view text, const std::string& field);
NormKind ParseNorm(std::string_view text, const std::string& field);
PositionEmbedding ParsePositionEmbedding(std::string_view text, const std::string& field);

}  // namespace autopar::spec_internal
