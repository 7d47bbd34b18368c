#pragma once

// The POSIX backend: open/pread/pwrite/fdatasync on plain descriptors. The io_uring backend
// reuses its files and its directory operations and replaces only new_io_queue().
//
// Internal to io/ and its users in src/: callers normally reach it through
// NewPosixFileSystem() or NewDefaultFileSystem().

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "asyncckpt/file_system.h"

namespace asyncckpt::io {

/// "<path> at offset <offset>", the subject of an I/O failure message.
std::string DescribeOffset(const std::string& path, uint64_t offset);

/// EIO for a read that reached the end of `path` after `got` of `want` bytes at `offset`;
/// the message contains "unexpected end of file".
IoStatus UnexpectedEndOfFile(const std::string& path, uint64_t offset, size_t got, size_t want);

/// A file on an open descriptor, closed by the destructor. Thread-safe: only positional I/O.
class PosixFile final : public File {
 public:
  /// Takes ownership of fd.
  PosixFile(std::string path, int fd, bool direct, bool in_memory = false);
  ~PosixFile() override;
  PosixFile(const PosixFile&) = delete;
  PosixFile& operator=(const PosixFile&) = delete;

  const std::string& path() const override { return path_; }
  bool is_direct() const override { return direct_; }
  IoStatus write_at(uint64_t offset, const void* data, size_t n) override;
  IoStatus read_at(uint64_t offset, void* data, size_t n) override;
  IoStatus sync() override;
  IoStatus size(uint64_t* bytes) override;
  IoStatus truncate(uint64_t bytes) override;
  /// fallocate(2) mode 0; ENOTSUP also where the kernel lacks the call (ENOSYS).
  IoStatus allocate(uint64_t offset, uint64_t n) override;
  int fd() const override { return fd_; }
  bool in_memory() const override { return in_memory_; }

 private:
  std::string path_;
  int fd_;
  bool direct_;
  bool in_memory_;
};

/// Opens `path` with O_CLOEXEC; options.direct adds O_DIRECT, dropped again (is_direct()
/// false) when the file system answers EINVAL or keeps files in memory (tmpfs, ramfs), which
/// in_memory() reports. New files
/// get mode 0666 less the umask. Opened with O_NONBLOCK and checked with fstat() at once: anything
/// but a regular file is refused (see FileSystem) before it is read, and O_NONBLOCK is cleared on a
/// regular file.
IoStatus OpenPosixFile(const std::string& path, const OpenOptions& options,
                       std::unique_ptr<File>* file);

/// The POSIX file system. Thread-safe and stateless.
///
/// remove_tree() also removes a plain file or a symlink given as `path` (like `rm -rf`),
/// never follows a symlink below it, and reports ENOENT when `path` does not exist.
class PosixFileSystem : public FileSystem {
 public:
  std::string name() const override { return "posix"; }
  IoStatus open(const std::string& path, const OpenOptions& options,
                std::unique_ptr<File>* file) override;
  /// flock(LOCK_EX | LOCK_NB) on a descriptor opened O_NOFOLLOW | O_CLOEXEC.
  IoStatus lock_file(const std::string& path, std::unique_ptr<FileLock>* lock) override;
  IoStatus create_dir(const std::string& path) override;
  IoStatus create_dirs(const std::string& path) override;
  IoStatus remove_file(const std::string& path) override;
  IoStatus remove_tree(const std::string& path) override;
  IoStatus rename(const std::string& from, const std::string& to) override;
  IoStatus exchange(const std::string& a, const std::string& b) override;
  IoStatus list_dir(const std::string& path, std::vector<std::string>* names) override;
  IoStatus sync_dir(const std::string& path) override;
  IoStatus file_size(const std::string& path, uint64_t* bytes) override;
  IoStatus entry_type(const std::string& path, EntryType* type,
                      Symlinks symlinks = Symlinks::kReport) override;
};

}  // namespace asyncckpt::io
