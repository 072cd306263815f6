// The study journal (docs/journal.md §3–§5): an append-only file of pb::JournalRecord, each framed as
//
//   u32 length (little-endian) | u32 CRC-32C of the payload (little-endian) | payload
//
// and fsync'ed before Append() returns, so a record that was reported written survives a crash.
// Opening reads every valid record and cuts the file after the last one: a record torn by a crash
// (short, or failing its checksum) and anything after it are removed, and the study continues from
// the state the valid records describe. A record whose checksum holds but whose payload does not
// parse is not a torn write; opening refuses it (StudyError) rather than dropping data.
//
// Test hook: with AUTOPAR_TEST_CRASH_AT_APPEND=N:BYTES in the environment, the append of record N
// (0-based, counted over the whole journal) writes the first BYTES bytes of its frame and then
// raises SIGKILL, so fault tests can kill the coordinator inside an append (BYTES = 0: before
// writing; BYTES ≥ frame size: after writing, before fsync).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "proto/autopar.pb.h"

namespace autopar::coord {

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

class FileJournal : public JournalSink {
 public:
  struct Opened {
    std::unique_ptr<FileJournal> journal;
    std::vector<pb::JournalRecord> records;  // the valid records, in order
    int64_t cut_bytes = 0;                   // bytes of torn tail removed
  };
  // Opens (creating if needed) the journal at `path`. Throws IoError, or StudyError on a record
  // that passes its checksum but does not parse.
  static Opened Open(const std::string& path);
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

// The frame of one record (length, checksum, payload).
std::string FrameRecord(const pb::JournalRecord& record);
// Parses frames from the start of `bytes` into `records`; returns the offset just after the last
// valid frame. `bad_payload_at` gets the offset of a checksummed frame that does not parse, or -1.
size_t ParseFrames(std::string_view bytes, std::vector<pb::JournalRecord>* records,
                   int64_t* bad_payload_at);

}  // namespace autopar::coord
