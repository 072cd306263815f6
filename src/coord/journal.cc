#include "autopar/coord/journal.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "autopar/coord/files.h"

namespace autopar::coord {
namespace {

constexpr size_t kHeaderBytes = 8;
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

}  // namespace

std::string FrameRecord(const pb::JournalRecord& record) {
  std::string payload;
  if (!record.SerializeToString(&payload)) {
    throw std::runtime_error("journal record does not serialize");
  }
  std::string frame;
  frame.reserve(kHeaderBytes + payload.size());
  PutU32(&frame, static_cast<uint32_t>(payload.size()));
  PutU32(&frame, Crc32c(payload.data(), payload.size()));
  frame += payload;
  return frame;
}

size_t ParseFrames(std::string_view bytes, std::vector<pb::JournalRecord>* records,
                   int64_t* bad_payload_at) {
  *bad_payload_at = -1;
  size_t offset = 0;
  while (bytes.size() - offset >= kHeaderBytes) {
    const uint32_t length = GetU32(bytes.data() + offset);
    const uint32_t crc = GetU32(bytes.data() + offset + 4);
    if (length > kMaxRecordBytes || bytes.size() - offset - kHeaderBytes < length) break;
    const char* payload = bytes.data() + offset + kHeaderBytes;
    if (Crc32c(payload, length) != crc) break;
    pb::JournalRecord record;
    if (!record.ParseFromArray(payload, static_cast<int>(length))) {
      *bad_payload_at = static_cast<int64_t>(offset);
      break;
    }
    records->push_back(std::move(record));
    offset += kHeaderBytes + length;
  }
  return offset;
}

FileJournal::Opened FileJournal::Open(const std::string& path) {
  const bool existed = FileExists(path);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError("open", path, errno);
  Opened opened;
  try {
    if (!existed) SyncDirectory(ParentDirectory(path));
    const std::string bytes = ReadFile(path);
    int64_t bad_payload_at = -1;
    const size_t valid = ParseFrames(bytes, &opened.records, &bad_payload_at);
    if (bad_payload_at >= 0) {
      throw StudyError("journal '" + path + "': the record at byte " +
                       std::to_string(bad_payload_at) +
                       " passes its checksum but does not parse; it was written by another "
                       "version of autopar-tune or the file was edited");
    }
    if (valid < bytes.size()) {
      // A torn tail: the crash came inside an append. Cut it so the next record follows the
      // last valid one.
      if (::ftruncate(fd, static_cast<off_t>(valid)) != 0) throw IoError("ftruncate", path, errno);
      if (::fsync(fd) != 0) throw IoError("fsync", path, errno);
      opened.cut_bytes = static_cast<int64_t>(bytes.size() - valid);
    }
  } catch (...) {
    ::close(fd);
    throw;
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
  const std::string frame = FrameRecord(record);
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
