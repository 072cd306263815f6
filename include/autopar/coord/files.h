// Checked file-system helpers of the study directory, and the errors the coordinator raises.
//
// Every call is checked; a failure raises IoError naming the operation and the path (exit code 1
// at the CLI). A study that is locked by another coordinator, or that does not match the flags it
// is resumed with, raises StudyError (exit code 4, docs/cli.md §10).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace autopar::coord {

class IoError : public std::runtime_error {
 public:
  // `what` reads "<operation> '<path>': <strerror(errno_value)>".
  IoError(const std::string& operation, const std::string& path, int errno_value);
  IoError(const std::string& operation, const std::string& path, const std::string& reason);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class StudyError : public std::runtime_error {
 public:
  explicit StudyError(const std::string& message) : std::runtime_error(message) {}
};

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as iSCSI and LevelDB use: it frames
// journal records and fingerprints replay tables. `crc` continues a previous value.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

// Whole-file read. Throws IoError.
std::string ReadFile(const std::string& path);
bool FileExists(const std::string& path);
// mkdir -p: makes the missing parents too. Throws IoError unless it exists afterwards.
void MakeDirectory(const std::string& path);
// Writes `path` atomically: a temporary file in the same directory, fsync, rename over `path`,
// fsync of the directory. A reader sees the old or the new contents, never a mix.
void WriteFileAtomic(const std::string& path, std::string_view contents);
// The directory part of `path` ("." when it has none).
std::string ParentDirectory(const std::string& path);
// fsync of a directory, so a created or renamed entry survives a crash.
void SyncDirectory(const std::string& dir);
// write(2) until done, retrying EINTR and short writes. Throws IoError naming `path`.
void WriteAll(int fd, const char* data, size_t n, const std::string& path);

// An exclusive advisory lock (flock) on DIR/lock, held for the object's lifetime. Throws
// StudyError when another process holds it.
class DirectoryLock {
 public:
  explicit DirectoryLock(const std::string& dir);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace autopar::coord
