#include "src/cli/flag_values.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "autopar/common/errors.h"

namespace autopar::cli {

bool IsFlag(const std::string& s) { return s.size() > 2 && s[0] == '-' && s[1] == '-'; }

void RefuseUnsetVariable(const std::string& flag, const std::string& text) {
  if (text.empty() || text[0] != '$') return;
  throw InputError(flag, "'" + text +
                             "' is a shell variable nothing sets: give its value with "
                             "--megatron-env NAME=VALUE (or in the environment)");
}

int64_t ToInt(const std::string& flag, const std::string& text, int64_t min_value,
              int64_t max_value) {
  RefuseUnsetVariable(flag, text);
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end || v < min_value || v > max_value) {
    throw InputError(flag, "expected an integer from " + std::to_string(min_value) + " to " +
                               std::to_string(max_value) + ", got '" + text + "'");
  }
  return v;
}

double ToDouble(const std::string& flag, const std::string& text, double max_value) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used != text.size() || !(v >= 0) || !(v <= max_value)) throw std::invalid_argument(text);
    return v;
  } catch (const std::exception&) {
    std::ostringstream bound;
    bound << max_value;
    throw InputError(flag, "expected a number from 0 to " + bound.str() + ", got '" + text + "'");
  }
}

uint64_t ToUnsigned(const std::string& flag, const std::string& text) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) {
    throw InputError(flag,
                     "expected an integer from 0 to 18446744073709551615, got '" + text + "'");
  }
  return v;
}

double ParseDuration(const std::string& flag, const std::string& text) {
  double scale = 1;
  std::string number = text;
  if (!number.empty() && (number.back() == 's' || number.back() == 'm' || number.back() == 'h')) {
    scale = number.back() == 'h' ? 3600 : number.back() == 'm' ? 60 : 1;
    number.pop_back();
  }
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  // At most ~31 years: a deadline past it would overflow the clocks it is added to.
  constexpr double kMaxSeconds = 1e9;
  if (number.empty() || *end != '\0' || !std::isfinite(v) || v < 0 || v * scale > kMaxSeconds) {
    throw InputError(flag,
                     "expected seconds (at most 1e9) or a duration such as 90s, 30m, 8h; "
                     "got '" +
                         text + "'");
  }
  return v * scale;
}

}  // namespace autopar::cli
