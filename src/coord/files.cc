#include "autopar/coord/files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

namespace autopar::coord {
namespace {

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

}  // namespace

std::string ParentDirectory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

IoError::IoError(const std::string& operation, const std::string& path, int errno_value)
    : IoError(operation, path, std::string(std::strerror(errno_value))) {}

IoError::IoError(const std::string& operation, const std::string& path, const std::string& reason)
    : std::runtime_error(operation + " '" + path + "': " + reason), path_(path) {}

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

std::string ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError("open", path, errno);
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      throw IoError("read", path, e);
    }
    if (got == 0) break;
    out.append(buffer, static_cast<size_t>(got));
  }
  if (::close(fd) != 0) throw IoError("close", path, errno);
  return out;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void MakeDirectory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) {
    SyncDirectory(ParentDirectory(path));
    return;
  }
  if (errno == ENOENT) {  // a missing parent: make it first (runs/llama70b on a fresh checkout)
    const std::string parent = ParentDirectory(path);
    if (parent == path || parent == "." || parent == "/") throw IoError("mkdir", path, errno);
    MakeDirectory(parent);
    if (::mkdir(path.c_str(), 0755) == 0) {
      SyncDirectory(parent);
      return;
    }
  }
  if (errno != EEXIST) throw IoError("mkdir", path, errno);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw IoError("stat", path, errno);
  if (!S_ISDIR(st.st_mode)) throw IoError("mkdir", path, "exists and is not a directory");
}

void WriteAll(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t put = ::write(fd, data, n);
    if (put < 0) {
      if (errno == EINTR) continue;
      throw IoError("write", path, errno);
    }
    data += put;
    n -= static_cast<size_t>(put);
  }
}

void SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw IoError("open", dir, errno);
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    throw IoError("fsync", dir, e);
  }
  if (::close(fd) != 0) throw IoError("close", dir, errno);
}

void WriteFileAtomic(const std::string& path, std::string_view contents) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError("create", tmp, errno);
  try {
    WriteAll(fd, contents.data(), contents.size(), tmp);
    if (::fsync(fd) != 0) throw IoError("fsync", tmp, errno);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) throw IoError("close", tmp, errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw IoError("rename to '" + path + "'", tmp, e);
  }
  SyncDirectory(ParentDirectory(path));
}

DirectoryLock::DirectoryLock(const std::string& dir) {
  const std::string path = dir + "/lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError("open", path, errno);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::close(fd_);
    fd_ = -1;
    if (e == EWOULDBLOCK) {
      throw StudyError("study '" + dir + "' is locked by another coordinator (" + path +
                       "); wait for it to finish or stop it first");
    }
    throw IoError("flock", path, e);
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

}  // namespace autopar::coord
