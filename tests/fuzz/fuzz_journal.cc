// Fuzz target: the study journal readers of src/coord (tune --resume, report): ScanJournal, which
// never throws, the salvage's RepairRecords on what it kept, and ParseFrames, whose clean ends are
// the records or a StudyError (JournalCorrupt among them).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "autopar/coord/files.h"
#include "autopar/coord/journal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const autopar::coord::JournalScan scan = autopar::coord::ScanJournal(bytes);
  if (scan.valid_bytes > scan.file_bytes || scan.intact_records > scan.records.size()) {
    std::fprintf(stderr, "ScanJournal: valid_bytes %zu of %zu, intact %zu of %zu records\n",
                 scan.valid_bytes, scan.file_bytes, scan.intact_records, scan.records.size());
    std::abort();
  }
  size_t checked = 0;
  (void)autopar::coord::RepairRecords(scan.records, scan.intact_records, &checked);
  std::vector<autopar::pb::JournalRecord> records;
  int64_t bad_payload_at = -1;
  try {
    (void)autopar::coord::ParseFrames(bytes, &records, &bad_payload_at, "fuzz-journal");
  } catch (const autopar::coord::StudyError&) {
  }
  return 0;
}
