// The study journal (docs/journal.md §3–§5, §9): an append-only file of pb::JournalRecord.
//
// Format 3 (this build writes it): a file header, then one frame per record,
//
//   header: "APTJ" | u32 format (3) | u64 checked_records | u64 study fingerprint |
//           u32 CRC-32C of the 24 bytes before
//   frame:  u32 length | u32 sequence | u32 CRC-32C of the payload | u32 CRC-32C of the 12 bytes
//           before | payload = pb::JournalRecord
//
// (integers little-endian). The sequence number is the record's number in the journal, from 0,
// so a frame lost whole is a gap; the header's own checksum lets a reader find the next frame
// after a damaged one. Each Append() is fsync'ed before it returns: a record reported written
// survives a crash.
//
// Opening never discards a valid record. Damage (a frame that fails a checksum, a gap or a
// repeat in the sequence numbers, a damaged file header) with no valid frame after it is a torn
// tail, left by a crash inside an append: it is cut and the study continues from the records
// before it. Damage with a valid frame after it is corruption: Open refuses it (JournalCorrupt,
// naming the record number and byte offset) and leaves the file as it is, unless it is asked
// to salvage: then it copies the file aside (`<path>.corrupt-<n>`) and rewrites it with every
// valid record (RepairRecords). A frame whose checksums hold but whose payload does not parse is
// neither: another version wrote it, or the file was edited, and opening refuses it (StudyError).
//
// The study fingerprint (JournalFingerprint, study.h) names the study the journal belongs to:
// opening or reading it for another study is refused (JournalForeign), so no study replays
// another's trials. 0 is "none recorded" (never checked).
//
// Format 2 (the header without the fingerprint, 20 bytes, CRC of the 16 before) and format 1
// (before sequence numbers; no header, frames `u32 length | u32 CRC-32C | payload`) are read with
// the same rules, and rewritten in format 3 with the study's fingerprint when opened for
// appending.
//
// Test hook: with AUTOPAR_TEST_CRASH_AT_APPEND=N:BYTES in the environment, the append of record N
// (0-based, counted over the whole journal) writes the first BYTES bytes of its frame and then
// raises SIGKILL, so fault tests can kill the coordinator inside an append (BYTES = 0: before
// writing; BYTES ≥ frame size: after writing, before fsync).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "autopar/coord/files.h"
#include "proto/autopar.pb.h"

namespace autopar::coord {

constexpr uint32_t kJournalFormat = 3;
constexpr size_t kJournalHeaderBytes = 28;
constexpr size_t kJournalHeaderBytesV2 = 20;
constexpr size_t kFrameHeaderBytes = 16;
// The header's checked_records when every record replays with all of Tuner::Replay's checks.
constexpr uint64_t kEveryRecordChecked = std::numeric_limits<uint64_t>::max();

class JournalSink {
 public:
  virtual ~JournalSink() = default;
  // Durable when it returns. Throws IoError.
  virtual void Append(const pb::JournalRecord& record) = 0;
  virtual int64_t records() const = 0;
};

// For tests and benchmarks: keeps the records in memory.
class MemoryJournal : public JournalSink {
 public:
  void Append(const pb::JournalRecord& record) override { records_.push_back(record); }
  int64_t records() const override { return static_cast<int64_t>(records_.size()); }
  const std::vector<pb::JournalRecord>& all() const { return records_; }

 private:
  std::vector<pb::JournalRecord> records_;
};

// What a journal's bytes hold. Never throws: every input, however damaged, is described.
struct JournalScan {
  uint32_t format = kJournalFormat;  // 1: written before sequence numbers (no header)
  uint32_t unknown_format = 0;       // a header that checks names a format this build lacks
  bool header_damaged = false;       // a header was there, but fails its checksum
  uint64_t checked_records = kEveryRecordChecked;
  uint64_t fingerprint = 0;                // the header's study fingerprint (format 3; 0: none)
  std::vector<pb::JournalRecord> records;  // every valid record, in file order
  size_t valid_bytes = 0;  // the end of the last valid frame (of the header when none)
  size_t file_bytes = 0;
  // The first damage that has a valid record after it (corruption; none: corrupt_record < 0):
  // the number of the first record it lost, its byte offset, what it is, how many valid records
  // follow it, and how many came before it (the index into `records` of the first that follows).
  int64_t corrupt_record = -1;
  int64_t corrupt_offset = -1;
  std::string corruption;
  int64_t valid_after = 0;
  size_t intact_records = 0;
  int64_t bad_payload_at = -1;  // a frame whose checksums hold but that does not parse

  bool corrupt() const { return corrupt_record >= 0; }
  bool torn() const { return !corrupt() && valid_bytes < file_bytes; }
};
JournalScan ScanJournal(std::string_view bytes);

// Corruption (JournalScan::corrupt()): what, where, and that `tune --resume --salvage` keeps the
// valid records. Exit code 4 at the CLI, as every StudyError.
class JournalCorrupt : public StudyError {
 public:
  JournalCorrupt(const std::string& path, const JournalScan& scan);
  int64_t record() const { return record_; }
  int64_t offset() const { return offset_; }
  int64_t valid_after() const { return valid_after_; }

 private:
  int64_t record_, offset_, valid_after_;
};

// A journal whose header names another study than the one opening or reading it. Exit code 4.
class JournalForeign : public StudyError {
 public:
  JournalForeign(const std::string& path, uint64_t found, uint64_t expected);
};

// The records a salvage keeps, made into a journal that Tuner::Replay accepts: a trial whose
// result was lost is dropped from where it was and started again at the end (so Run() runs it
// again); a result whose start was lost gets its start back; a second probe record is dropped;
// trials are renumbered so their indices run 0, 1, 2, … The first `intact` records are the ones
// before the damage. `*checked` gets how many leading records are unchanged from before the
// damage: those replay with every check, the rest without the proposal and digest checks.
std::vector<pb::JournalRecord> RepairRecords(const std::vector<pb::JournalRecord>& records,
                                             size_t intact, size_t* checked);

enum class JournalRecovery {
  kRefuseCorrupt,  // corruption: JournalCorrupt, the file unchanged
  kSalvage,        // corruption: copy aside, keep every valid record
};

class FileJournal : public JournalSink {
 public:
  struct Opened {
    std::unique_ptr<FileJournal> journal;
    std::vector<pb::JournalRecord> records;  // the valid records, in order
    int64_t cut_bytes = 0;                   // bytes of torn tail removed
    // Pass to Tuner::Replay: records before this index replay with every check.
    size_t checked_records = std::numeric_limits<size_t>::max();
    bool upgraded = false;       // a format-1 or -2 journal, rewritten in format 3
    std::string salvaged_copy;   // a salvage: where the damaged file was copied; else empty
    std::string salvage_report;  // a salvage: what was damaged and what was kept
  };
  // Opens (creating if needed, with `fingerprint` in its header) the journal at `path`. Throws
  // IoError, JournalForeign when the header names another study (both fingerprints non-zero and
  // different; the file unchanged), JournalCorrupt (unless `recovery` is kSalvage), or
  // StudyError on a frame that passes its checksums but does not parse or on a format this build
  // does not read. A format-1 or -2 journal is rewritten in format 3 with `fingerprint`.
  static Opened Open(const std::string& path,
                     JournalRecovery recovery = JournalRecovery::kRefuseCorrupt,
                     uint64_t fingerprint = 0);
  ~FileJournal() override;

  void Append(const pb::JournalRecord& record) override;
  int64_t records() const override { return records_; }
  const std::string& path() const { return path_; }

 private:
  FileJournal(std::string path, int fd, int64_t records);

  std::string path_;
  int fd_;
  int64_t records_;
  int64_t crash_at_record_ = -1;  // the test hook
  int64_t crash_after_bytes_ = 0;
};

// The file header, and the frame of one record with its sequence number.
std::string JournalHeader(uint64_t checked_records, uint64_t fingerprint = 0);
std::string FrameRecord(const pb::JournalRecord& record, uint32_t sequence);
// For readers of a whole journal file (`report`): appends its valid records to `records` and
// returns JournalScan::valid_bytes. Throws JournalForeign when the header's fingerprint and
// `fingerprint` are both non-zero and differ, JournalCorrupt on corruption, and StudyError on a
// format this build does not read or on a checksummed frame that does not parse (then
// `bad_payload_at` gets its offset first).
size_t ParseFrames(std::string_view bytes, std::vector<pb::JournalRecord>* records,
                   int64_t* bad_payload_at, const std::string& path = "journal",
                   uint64_t fingerprint = 0);

}  // namespace autopar::coord
