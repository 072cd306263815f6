#include "autopar/coord/journal.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace autopar::coord {
namespace {

constexpr char kMagic[4] = {'A', 'P', 'T', 'J'};
constexpr size_t kLegacyFrameHeaderBytes = 8;
constexpr size_t kNone = std::string_view::npos;
// A length field beyond this is corruption, not a record (records are a few hundred bytes).
constexpr uint32_t kMaxRecordBytes = 64u << 20;

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

uint64_t GetU64(const char* p) { return GetU32(p) | static_cast<uint64_t>(GetU32(p + 4)) << 32; }

// AUTOPAR_TEST_CRASH_AT_APPEND=N:BYTES → (N, BYTES); (-1, 0) when unset.
std::pair<int64_t, int64_t> CrashHook() {
  const char* v = std::getenv("AUTOPAR_TEST_CRASH_AT_APPEND");
  if (v == nullptr || *v == '\0') return {-1, 0};
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (end == v || *end != ':') {
    throw IoError("AUTOPAR_TEST_CRASH_AT_APPEND", v, "expected N:BYTES");
  }
  const char* bytes_text = end + 1;
  const long long bytes = std::strtoll(bytes_text, &end, 10);
  if (end == bytes_text || *end != '\0' || n < 0 || bytes < 0) {
    throw IoError("AUTOPAR_TEST_CRASH_AT_APPEND", v, "expected N:BYTES");
  }
  return {n, bytes};
}

// ---- reading (docs/journal.md §5) ----

struct FrameHeader {
  uint32_t length = 0;
  uint32_t sequence = 0;
  uint32_t payload_crc = 0;
};

// The format-2 frame header at `offset`, when its checksum holds.
std::optional<FrameHeader> HeaderAt(std::string_view b, size_t offset) {
  if (b.size() - offset < kFrameHeaderBytes) return std::nullopt;
  const char* p = b.data() + offset;
  const uint32_t length = GetU32(p);
  if (length > kMaxRecordBytes || Crc32c(p, 12) != GetU32(p + 12)) return std::nullopt;
  return FrameHeader{length, GetU32(p + 4), GetU32(p + 8)};
}

// The first offset at or after `from` where a format-2 frame header checks: where reading goes on
// after damage. A header is 16 bytes, so this is linear in the file.
size_t NextHeader(std::string_view b, size_t from) {
  for (size_t p = from; p + kFrameHeaderBytes <= b.size(); ++p) {
    if (HeaderAt(b, p)) return p;
  }
  return kNone;
}

// A format-1 payload is one JournalRecord with its one field set: a tag byte (fields 1–5,
// length-delimited), a varint length, and that many bytes, exactly filling the frame. Checked
// before the CRC while looking for the next frame after damage, so the search stays linear.
bool LooksLikeRecord(const char* p, uint32_t length) {
  if (length < 2) return false;
  const unsigned char tag = static_cast<unsigned char>(p[0]);
  if (tag < 0x0A || tag > 0x2A || (tag & 7) != 2) return false;
  uint64_t n = 0;
  uint32_t i = 1;
  for (int shift = 0; i < length && shift < 35; shift += 7, ++i) {
    const unsigned char c = static_cast<unsigned char>(p[i]);
    n |= static_cast<uint64_t>(c & 0x7f) << shift;
    if ((c & 0x80) == 0) return static_cast<uint64_t>(i) + 1 + n == length;
  }
  return false;
}

// The payload length of the format-1 frame at `offset`, when it is whole and its CRC holds.
std::optional<uint32_t> LegacyFrameAt(std::string_view b, size_t offset, bool shape) {
  if (b.size() - offset < kLegacyFrameHeaderBytes) return std::nullopt;
  const char* p = b.data() + offset;
  const uint32_t length = GetU32(p);
  if (length > kMaxRecordBytes || b.size() - offset - kLegacyFrameHeaderBytes < length) {
    return std::nullopt;
  }
  if (shape && !LooksLikeRecord(p + kLegacyFrameHeaderBytes, length)) return std::nullopt;
  if (Crc32c(p + kLegacyFrameHeaderBytes, length) != GetU32(p + 4)) return std::nullopt;
  return length;
}

// Damage is corruption once a valid record follows it; until then it may be a torn tail.
class ScanCursor {
 public:
  explicit ScanCursor(JournalScan* scan) : scan_(scan) {}
  void Damage(int64_t record, size_t offset, std::string what) {
    if (pending_record_ >= 0) return;  // the first damage of a run is the one to report
    pending_record_ = record;
    pending_offset_ = static_cast<int64_t>(offset);
    pending_what_ = std::move(what);
  }
  void Valid(pb::JournalRecord record, size_t end) {
    if (pending_record_ >= 0 && !scan_->corrupt()) {
      scan_->corrupt_record = pending_record_;
      scan_->corrupt_offset = pending_offset_;
      scan_->corruption = std::move(pending_what_);
      scan_->intact_records = scan_->records.size();
    }
    pending_record_ = -1;
    if (scan_->corrupt()) ++scan_->valid_after;
    scan_->records.push_back(std::move(record));
    scan_->valid_bytes = end;
  }
  JournalScan& scan() { return *scan_; }

 private:
  JournalScan* scan_;
  int64_t pending_record_ = -1;
  int64_t pending_offset_ = -1;
  std::string pending_what_;
};

std::string Records(uint64_t first, uint64_t last) {
  return first == last ? "record " + std::to_string(first)
                       : "records " + std::to_string(first) + " to " + std::to_string(last);
}

// Format-2 frames from `offset` to the end.
void ScanFrames(std::string_view b, size_t offset, ScanCursor& c) {
  uint64_t expect = 0;  // the next sequence number
  while (offset < b.size()) {
    const std::optional<FrameHeader> h = HeaderAt(b, offset);
    if (!h || b.size() - offset - kFrameHeaderBytes < h->length) {
      c.Damage(static_cast<int64_t>(expect), offset,
               h ? "a frame cut short" : "a frame header fails its checksum");
      offset = NextHeader(b, offset + 1);
      if (offset == kNone) return;  // nothing valid after: a torn tail
      continue;
    }
    const char* payload = b.data() + offset + kFrameHeaderBytes;
    const size_t end = offset + kFrameHeaderBytes + h->length;
    const uint64_t sequence = h->sequence;
    if (Crc32c(payload, h->length) != h->payload_crc) {
      c.Damage(static_cast<int64_t>(std::min(expect, sequence)), offset,
               "its payload fails its checksum");
      expect = std::max(expect, sequence + 1);
      offset = end;
      continue;
    }
    pb::JournalRecord record;
    if (!record.ParseFromArray(payload, static_cast<int>(h->length))) {
      c.scan().bad_payload_at = static_cast<int64_t>(offset);
      return;
    }
    if (sequence < expect) {  // a frame written twice: nothing new in it
      c.Damage(static_cast<int64_t>(expect), offset,
               "record " + std::to_string(sequence) + " again where " + std::to_string(expect) +
                   " was due");
      offset = end;
      continue;
    }
    if (sequence > expect) {
      c.Damage(static_cast<int64_t>(expect), offset,
               Records(expect, sequence - 1) + " missing: a gap in the sequence numbers");
    }
    c.Valid(std::move(record), end);
    expect = sequence + 1;
    offset = end;
  }
}

// Format-1 frames (no header, no sequence numbers) from the start.
void ScanLegacyFrames(std::string_view b, ScanCursor& c) {
  size_t offset = 0;
  while (offset < b.size()) {
    std::optional<uint32_t> length = LegacyFrameAt(b, offset, /*shape=*/false);
    if (!length) {
      c.Damage(static_cast<int64_t>(c.scan().records.size()), offset, "a frame fails its checksum");
      size_t next = offset + 1;
      while (next < b.size() && !LegacyFrameAt(b, next, /*shape=*/true)) ++next;
      if (next >= b.size()) return;
      offset = next;
      continue;
    }
    const char* payload = b.data() + offset + kLegacyFrameHeaderBytes;
    pb::JournalRecord record;
    if (!record.ParseFromArray(payload, static_cast<int>(*length))) {
      c.scan().bad_payload_at = static_cast<int64_t>(offset);
      return;
    }
    offset += kLegacyFrameHeaderBytes + *length;
    c.Valid(std::move(record), offset);
  }
}

}  // namespace

namespace {

// Whether the `bytes`-long header at the start of `b` checks (its CRC-32C is its last 4 bytes).
bool HeaderChecks(std::string_view b, size_t bytes) {
  return b.size() >= bytes && Crc32c(b.data(), bytes - 4) == GetU32(b.data() + bytes - 4);
}

}  // namespace

JournalScan ScanJournal(std::string_view b) {
  JournalScan scan;
  scan.file_bytes = b.size();
  ScanCursor c(&scan);
  const bool magic = b.size() >= sizeof kMagic && std::memcmp(b.data(), kMagic, 4) == 0;
  if (b.empty()) return scan;
  if (!magic && NextHeader(b, 0) == kNone) {  // written before sequence numbers
    scan.format = 1;
    ScanLegacyFrames(b, c);
    return scan;
  }
  // The format field says which header to check; the checksum covers it, so a damaged field
  // fails the check rather than choosing another layout.
  const uint32_t format = b.size() >= 8 ? GetU32(b.data() + 4) : 0;
  const bool v3 = magic && format == kJournalFormat && HeaderChecks(b, kJournalHeaderBytes);
  const bool v2 = magic && format == 2 && HeaderChecks(b, kJournalHeaderBytesV2);
  if (magic && format > kJournalFormat &&
      (HeaderChecks(b, kJournalHeaderBytes) || HeaderChecks(b, kJournalHeaderBytesV2))) {
    scan.unknown_format = format;  // a newer build's: not ours to read
    return scan;
  }
  if (v3 || v2) {
    scan.format = format;
    scan.checked_records = GetU64(b.data() + 8);
    if (v3) scan.fingerprint = GetU64(b.data() + 16);
    scan.valid_bytes = v3 ? kJournalHeaderBytes : kJournalHeaderBytesV2;
  } else {
    // What the header said is lost: a salvage replays every record without the full checks.
    scan.header_damaged = true;
    scan.checked_records = 0;
    c.Damage(0, 0, "the file header is damaged");
  }
  // After a damaged header the first frame is found by its own checksum, wherever it starts.
  ScanFrames(b, std::min(b.size(), scan.valid_bytes > 0 ? scan.valid_bytes : kJournalHeaderBytesV2),
             c);
  return scan;
}

JournalForeign::JournalForeign(const std::string& path, uint64_t found, uint64_t expected)
    : StudyError([&] {
        char text[160];
        std::snprintf(text, sizeof text, "fingerprint %016llx, this study's (study.pb) %016llx",
                      static_cast<unsigned long long>(found),
                      static_cast<unsigned long long>(expected));
        return "journal '" + path + "' belongs to another study (" + text +
               "): its trials were measured for another model, cluster, space or search; it is "
               "left as it is (move it away, or give --study the directory it came from)";
      }()) {}

JournalCorrupt::JournalCorrupt(const std::string& path, const JournalScan& scan)
    : StudyError("journal '" + path + "': corrupt at record " +
                 std::to_string(scan.corrupt_record) + ", offset " +
                 std::to_string(scan.corrupt_offset) + " (" + scan.corruption + "); " +
                 std::to_string(scan.valid_after) + " valid record" +
                 (scan.valid_after == 1 ? " follows" : "s follow") +
                 "; `tune --resume --salvage` keeps them (the journal is left as it is)"),
      record_(scan.corrupt_record),
      offset_(scan.corrupt_offset),
      valid_after_(scan.valid_after) {}

// ---- repairing what a salvage keeps ----

namespace {

// Builds the repaired list; a dropped record leaves an empty slot until the end.
class Repair {
 public:
  explicit Repair(size_t intact) : intact_(intact) {}

  void Add(const pb::JournalRecord& r, size_t source) {
    switch (r.kind_case()) {
      case pb::JournalRecord::kProbe:
        // Replay builds the state at the first probe, or at the first trial without one.
        if (!probe_seen_ && !trials_seen_) Push(r, source);
        probe_seen_ = true;
        break;
      case pb::JournalRecord::kTrialStarted:
        Started(r.trial_started(), source);
        break;
      case pb::JournalRecord::kTrialFinished:
        Finished(r.trial_finished(), source);
        break;
      default:
        Push(r, source);
        break;
    }
  }

  std::vector<pb::JournalRecord> Done(size_t* checked) {
    if (!pending_on_ && orphan_) {  // run the trial whose result was lost again
      pb::JournalRecord r;
      *r.mutable_trial_started() = *orphan_;
      r.mutable_trial_started()->set_trial_index(next_);
      Push(r, kNone);
    }
    std::vector<pb::JournalRecord> records;
    *checked = 0;
    bool prefix = true;
    for (size_t i = 0; i < out_.size(); ++i) {
      if (!out_[i]) continue;
      prefix = prefix && source_[i] < intact_ && unchanged_[i];
      if (prefix) ++*checked;
      records.push_back(std::move(*out_[i]));
    }
    return records;
  }

 private:
  // The trial started and not yet finished.
  struct Pending {
    int64_t index = 0;  // as journaled
    int64_t candidate = 0;
    std::vector<size_t> slots;
  };

  void Push(const pb::JournalRecord& r, size_t source, bool unchanged = true) {
    out_.push_back(r);
    source_.push_back(source);
    unchanged_.push_back(unchanged);
  }

  void DropPending() {
    orphan_ = out_[pending_.slots.back()]->trial_started();
    for (size_t slot : pending_.slots) out_[slot].reset();
    pending_on_ = false;
  }

  void Started(const pb::TrialStarted& s, size_t source) {
    trials_seen_ = true;
    const bool retry =
        pending_on_ && pending_.index == s.trial_index() && pending_.candidate == s.candidate();
    if (!retry) {
      if (pending_on_) DropPending();
      pending_ = Pending{s.trial_index(), s.candidate(), {}};
      pending_on_ = true;
    }
    pb::JournalRecord r;
    *r.mutable_trial_started() = s;
    r.mutable_trial_started()->set_trial_index(next_);
    pending_.slots.push_back(out_.size());
    Push(r, source, s.trial_index() == next_);
  }

  void Finished(const pb::TrialFinished& f, size_t source) {
    trials_seen_ = true;
    const bool matches = pending_on_ && pending_.index == f.result().trial_index() &&
                         pending_.candidate == f.candidate();
    if (!matches) {
      if (pending_on_) DropPending();
      // The start was lost: the result says what it needs.
      pb::JournalRecord start;
      pb::TrialStarted* s = start.mutable_trial_started();
      s->set_trial_index(next_);
      s->set_attempt(std::max(1, f.result().attempt()));
      s->set_candidate(f.candidate());
      s->set_spec(f.result().spec());
      Push(start, source, false);
    }
    pb::JournalRecord r;
    *r.mutable_trial_finished() = f;
    r.mutable_trial_finished()->mutable_result()->set_trial_index(next_);
    Push(r, source, matches && f.result().trial_index() == next_);
    pending_on_ = false;
    ++next_;
  }

  size_t intact_;
  std::vector<std::optional<pb::JournalRecord>> out_;
  std::vector<size_t> source_;
  std::vector<bool> unchanged_;
  Pending pending_;
  bool pending_on_ = false;
  std::optional<pb::TrialStarted> orphan_;
  int64_t next_ = 0;
  bool probe_seen_ = false;
  bool trials_seen_ = false;
};

}  // namespace

std::vector<pb::JournalRecord> RepairRecords(const std::vector<pb::JournalRecord>& records,
                                             size_t intact, size_t* checked) {
  Repair repair(intact);
  for (size_t i = 0; i < records.size(); ++i) repair.Add(records[i], i);
  return repair.Done(checked);
}

// ---- framing and the file ----

std::string JournalHeader(uint64_t checked_records, uint64_t fingerprint) {
  std::string header(kMagic, sizeof kMagic);
  PutU32(&header, kJournalFormat);
  PutU32(&header, static_cast<uint32_t>(checked_records));
  PutU32(&header, static_cast<uint32_t>(checked_records >> 32));
  PutU32(&header, static_cast<uint32_t>(fingerprint));
  PutU32(&header, static_cast<uint32_t>(fingerprint >> 32));
  PutU32(&header, Crc32c(header.data(), header.size()));
  return header;
}

std::string FrameRecord(const pb::JournalRecord& record, uint32_t sequence) {
  std::string payload;
  if (!record.SerializeToString(&payload)) {
    throw std::runtime_error("journal record does not serialize");
  }
  std::string frame;
  frame.reserve(kFrameHeaderBytes + payload.size());
  PutU32(&frame, static_cast<uint32_t>(payload.size()));
  PutU32(&frame, sequence);
  PutU32(&frame, Crc32c(payload.data(), payload.size()));
  PutU32(&frame, Crc32c(frame.data(), frame.size()));
  frame += payload;
  return frame;
}

namespace {

// Throws what makes a scanned journal unreadable: a newer format, another study's fingerprint
// (both known), a frame that does not parse; corruption too unless a salvage will take it.
void CheckReadable(const JournalScan& scan, const std::string& path, bool refuse_corrupt,
                   uint64_t fingerprint) {
  if (scan.unknown_format != 0) {
    throw StudyError("journal '" + path + "' is in format " + std::to_string(scan.unknown_format) +
                     "; this build reads formats 1 to 3 (a newer autopar-tune wrote it?)");
  }
  if (scan.fingerprint != 0 && fingerprint != 0 && scan.fingerprint != fingerprint) {
    throw JournalForeign(path, scan.fingerprint, fingerprint);
  }
  if (scan.bad_payload_at >= 0) {
    throw StudyError("journal '" + path + "': the record at byte " +
                     std::to_string(scan.bad_payload_at) +
                     " passes its checksums but does not parse; it was written by another "
                     "version of autopar-tune or the file was edited");
  }
  if (refuse_corrupt && scan.corrupt()) throw JournalCorrupt(path, scan);
}

}  // namespace

size_t ParseFrames(std::string_view bytes, std::vector<pb::JournalRecord>* records,
                   int64_t* bad_payload_at, const std::string& path, uint64_t fingerprint) {
  JournalScan scan = ScanJournal(bytes);
  *bad_payload_at = scan.bad_payload_at;
  CheckReadable(scan, path, /*refuse_corrupt=*/true, fingerprint);
  for (pb::JournalRecord& r : scan.records) records->push_back(std::move(r));
  return scan.valid_bytes;
}

namespace {

// The whole file for `records`. `checked` counts the leading records that replay with every
// check; all of them is written as "every record".
std::string Frames(const std::vector<pb::JournalRecord>& records, uint64_t checked,
                   uint64_t fingerprint) {
  std::string bytes =
      JournalHeader(checked >= records.size() ? kEveryRecordChecked : checked, fingerprint);
  for (size_t i = 0; i < records.size(); ++i) {
    bytes += FrameRecord(records[i], static_cast<uint32_t>(i));
  }
  return bytes;
}

// Copies the damaged journal to the first free `<path>.corrupt-<n>`, then rewrites it with the
// repaired records.
void Salvage(const std::string& path, const std::string& bytes, const JournalScan& scan,
             uint64_t fingerprint, FileJournal::Opened* opened) {
  std::string copy;
  for (int n = 1;; ++n) {
    copy = path + ".corrupt-" + std::to_string(n);
    if (!FileExists(copy)) break;
  }
  WriteFileAtomic(copy, bytes);
  size_t checked = 0;
  opened->records = RepairRecords(scan.records, scan.intact_records, &checked);
  checked = static_cast<size_t>(std::min<uint64_t>(checked, scan.checked_records));
  opened->checked_records =
      checked >= opened->records.size() ? std::numeric_limits<size_t>::max() : checked;
  WriteFileAtomic(path, Frames(opened->records, checked, fingerprint));
  opened->salvaged_copy = copy;
  opened->salvage_report = "corrupt at record " + std::to_string(scan.corrupt_record) +
                           ", offset " + std::to_string(scan.corrupt_offset) + " (" +
                           scan.corruption + "); kept its " + std::to_string(scan.records.size()) +
                           " valid records, the damaged file is '" + copy + "'";
}

}  // namespace

FileJournal::Opened FileJournal::Open(const std::string& path, JournalRecovery recovery,
                                      uint64_t fingerprint) {
  // A new journal is created whole with its header, so the header is never torn.
  if (!FileExists(path)) WriteFileAtomic(path, JournalHeader(kEveryRecordChecked, fingerprint));
  const std::string bytes = ReadFile(path);
  JournalScan scan = ScanJournal(bytes);
  CheckReadable(scan, path, recovery != JournalRecovery::kSalvage, fingerprint);
  Opened opened;
  bool rewritten = true;
  if (scan.corrupt()) {
    Salvage(path, bytes, scan, scan.fingerprint != 0 ? scan.fingerprint : fingerprint, &opened);
  } else {
    opened.records = std::move(scan.records);
    opened.checked_records = static_cast<size_t>(scan.checked_records);
    opened.cut_bytes = static_cast<int64_t>(bytes.size() - scan.valid_bytes);
    opened.upgraded = scan.format != kJournalFormat;
    if (scan.format != kJournalFormat || scan.header_damaged) {
      // An older format, or a header damaged with nothing after it: rewritten whole.
      WriteFileAtomic(path, Frames(opened.records, scan.checked_records,
                                   scan.fingerprint != 0 ? scan.fingerprint : fingerprint));
    } else {
      rewritten = false;
    }
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
  if (fd < 0) throw IoError("open", path, errno);
  if (!rewritten && opened.cut_bytes > 0) {
    // A torn tail: the crash came inside an append. Cut it so the next record follows the
    // last valid one.
    if (::ftruncate(fd, static_cast<off_t>(scan.valid_bytes)) != 0 || ::fsync(fd) != 0) {
      const int e = errno;
      ::close(fd);
      throw IoError("ftruncate", path, e);
    }
  }
  opened.journal.reset(new FileJournal(path, fd, static_cast<int64_t>(opened.records.size())));
  return opened;
}

FileJournal::FileJournal(std::string path, int fd, int64_t records)
    : path_(std::move(path)), fd_(fd), records_(records) {
  const auto [at, bytes] = CrashHook();
  crash_at_record_ = at;
  crash_after_bytes_ = bytes;
}

FileJournal::~FileJournal() {
  if (fd_ >= 0) ::close(fd_);
}

void FileJournal::Append(const pb::JournalRecord& record) {
  if (records_ >= static_cast<int64_t>(std::numeric_limits<uint32_t>::max())) {
    throw IoError("append", path_,
                  "the journal holds 2^32 - 1 records, its sequence numbers' limit");
  }
  const std::string frame = FrameRecord(record, static_cast<uint32_t>(records_));
  if (records_ == crash_at_record_) {
    const size_t n = std::min<size_t>(frame.size(), static_cast<size_t>(crash_after_bytes_));
    WriteAll(fd_, frame.data(), n, path_);
    ::raise(SIGKILL);
  }
  WriteAll(fd_, frame.data(), frame.size(), path_);
  if (::fsync(fd_) != 0) throw IoError("fsync", path_, errno);
  ++records_;
}

}  // namespace autopar::coord
