// Fuzz target: the replay table reader of src/coord (--replay-table). Clean ends: a table, or an
// InputError naming the line and column. A table that parses must survive its own canonical CSV
// (ToCsv, what make-replay-table writes): the same rows back, or the target aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "autopar/common/errors.h"
#include "autopar/coord/replay.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto table = autopar::coord::ReplayTable::Parse(text, "fuzz.csv");
    (void)table.Best();
    const std::string csv = table.ToCsv();
    const auto again = autopar::coord::ReplayTable::Parse(csv, "fuzz-again.csv");
    if (again.rows().size() != table.rows().size() || again.ToCsv() != csv) {
      std::fprintf(stderr, "replay table does not round-trip through ToCsv:\n%s---\n%s",
                   csv.c_str(), again.ToCsv().c_str());
      std::abort();
    }
  } catch (const autopar::InputError&) {
  }
  return 0;
}
