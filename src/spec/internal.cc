#include "internal.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <system_error>
#include <utility>

#include "autopar/common/errors.h"

namespace autopar::spec_internal {

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string Join(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  return out;
}

int64_t ParseInt(std::string_view text, const std::string& field) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  // from_chars rejects a leading '+', which YAML and shells both allow.
  const char* begin = (!text.empty() && text[0] == '+') ? text.data() + 1 : text.data();
  const auto [ptr, ec] = std::from_chars(begin, end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    if (ec == std::errc::result_out_of_range) {
      throw InputError(field, "integer '" + std::string(text) + "' is out of range");
    }
    throw InputError(field, "expected an integer, got '" + std::string(text) + "'");
  }
  return value;
}

double ParseDouble(std::string_view text, const std::string& field) {
  double value = 0;
  const char* end = text.data() + text.size();
  const char* begin = (!text.empty() && text[0] == '+') ? text.data() + 1 : text.data();
  const auto [ptr, ec] = std::from_chars(begin, end, value);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value)) {
    throw InputError(field, "expected a finite number, got '" + std::string(text) + "'");
  }
  return value;
}

InputError Rename(const InputError& error, std::string field) {
  // what() is "<field>: <message>"; keep the message.
  const std::string what = error.what();
  const size_t prefix = error.field().size() + 2;
  return InputError(std::move(field), what.size() >= prefix ? what.substr(prefix) : what);
}

YAML::Node LoadMapping(const std::string& text, const std::string& kind) {
  if (static_cast<int64_t>(text.size()) > kMaxDocumentBytes) {
    throw InputError(kind, "the " + kind + " is " + std::to_string(text.size()) +
                               " bytes; at most " + std::to_string(kMaxDocumentBytes >> 20) +
                               " MiB is read");
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    // yaml-cpp counts lines and columns from 0; editors count from 1.
    throw InputError(kind, "malformed " + kind + " at line " + std::to_string(e.mark.line + 1) +
                               ", column " + std::to_string(e.mark.column + 1) + ": " + e.msg);
  } catch (const YAML::Exception& e) {
    throw InputError(kind, "malformed " + kind + ": " + e.what());
  }
  if (!root.IsMap()) {
    throw InputError(kind, kind + " must be a mapping of keys to values");
  }
  return root;
}

std::string NodeString(const YAML::Node& node, const std::string& field) {
  if (!node.IsScalar()) throw InputError(field, "expected a single value, not a list or a map");
  return node.Scalar();
}

int64_t NodeInt(const YAML::Node& node, const std::string& field) {
  return ParseInt(NodeString(node, field), field);
}

double NodeDouble(const YAML::Node& node, const std::string& field) {
  return ParseDouble(NodeString(node, field), field);
}

bool NodeBool(const YAML::Node& node, const std::string& field) {
  const std::string text = Lower(NodeString(node, field));
  if (text == "true" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "no" || text == "off") return false;
  throw InputError(field, "expected true or false, got '" + node.Scalar() + "'");
}

void RequireAtMost(int64_t value, int64_t bound, const char* field) {
  if (value > bound) {
    throw InputError(field,
                     "must be at most " + std::to_string(bound) + ", got " + std::to_string(value));
  }
}

}  // namespace autopar::spec_internal
