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

#include "autopar/common/status.h"
#include "autopar/spec/model.h"

namespace autopar::spec_internal {

std::string Lower(std::string_view text);
std::string Join(const std::vector<std::string>& items, std::string_view separator);

// Strict number parsing: the whole text must be the number (no "4096.5", no "32k").
int64_t ParseInt(std::string_view text, const std::string& field);
double ParseDouble(std::string_view text, const std::string& field);

// The input bounds (docs/models.md §1): sizes beyond them describe no model or cluster anyone
// trains, and the products the models form from them (tokens × hidden × layers, bytes per GPU)
// must stay far inside 64-bit integers and finite doubles. Throws InputError naming `field`.
void RequireAtMost(int64_t value, int64_t bound, const char* field);
inline constexpr int64_t kMaxLayers = 100'000;
inline constexpr int64_t kMaxWidth = 1'000'000;  // hidden, heads, head dims
inline constexpr int64_t kMaxFfn = 10'000'000;   // an MLP's (or expert's) hidden size
inline constexpr int64_t kMaxVocabulary = 100'000'000;
inline constexpr int64_t kMaxSequence = int64_t{1} << 24;  // tokens per sequence, positions
inline constexpr int64_t kMaxExperts = int64_t{1} << 16;
inline constexpr int64_t kMaxGpus = int64_t{1} << 24;   // nodes × GPUs per node
inline constexpr int64_t kMaxBatch = int64_t{1} << 24;  // sequences per step
inline constexpr int64_t kMaxTokensPerStep = int64_t{1} << 40;

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
