#include "io/posix_file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

namespace asyncckpt::io {
namespace {

bool IsRetryable(int error_number) { return error_number == EINTR || error_number == EAGAIN; }

int RetryOnEintr(int (*call)(int), int fd) {
  int rc;
  do {
    rc = call(fd);
  } while (rc != 0 && errno == EINTR);
  return rc;
}

// Owns a descriptor for the length of one directory operation.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }
  // Hands the descriptor to an owner such as fdopendir().
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

struct DirCloser {
  void operator()(DIR* dir) const { ::closedir(dir); }
};
using ScopedDir = std::unique_ptr<DIR, DirCloser>;

std::string JoinPath(const std::string& dir, const char* name) {
  std::string joined = dir;
  if (joined.empty() || joined.back() != '/') joined.push_back('/');
  return joined.append(name);
}

// Reads every name of an open directory (not "." or ".."). Takes ownership of dir_fd.
IoStatus ReadNames(int dir_fd, const std::string& path, std::vector<std::string>* names) {
  ScopedDir dir(::fdopendir(dir_fd));
  if (dir == nullptr) {
    int error_number = errno;
    ::close(dir_fd);
    return IoStatus::FromErrno(error_number, "list directory", path);
  }
  names->clear();
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(dir.get());
    if (entry == nullptr) {
      if (errno != 0) return IoStatus::FromErrno(errno, "list directory", path);
      return IoStatus::Ok();
    }
    std::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    names->emplace_back(name);
  }
}

// Empties the directory open as dir_fd (borrowed), descending into subdirectories through
// openat(O_NOFOLLOW) so that a symlink is removed as a link, never followed.
IoStatus RemoveContents(int dir_fd, const std::string& path) {
  int list_fd = ::dup(dir_fd);
  if (list_fd < 0) return IoStatus::FromErrno(errno, "remove tree", path);
  // The names are read before anything is removed: readdir() while entries vanish is
  // allowed to skip some.
  std::vector<std::string> names;
  if (IoStatus s = ReadNames(list_fd, path, &names); !s.ok()) return s;
  for (const std::string& name : names) {
    std::string child_path = JoinPath(path, name.c_str());
    ScopedFd child(::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (child.get() >= 0) {
      if (IoStatus s = RemoveContents(child.get(), child_path); !s.ok()) return s;
      if (::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
        return IoStatus::FromErrno(errno, "remove directory", child_path);
      }
      continue;
    }
    int open_error = errno;
    if (open_error == ENOENT) continue;
    // ENOTDIR: a file; ELOOP: a symlink (to anything), removed as a link.
    if (open_error != ENOTDIR && open_error != ELOOP) {
      return IoStatus::FromErrno(open_error, "open directory", child_path);
    }
    if (::unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
      return IoStatus::FromErrno(errno, "remove file", child_path);
    }
  }
  return IoStatus::Ok();
}

template <typename Op, typename Call>
IoStatus RunBatch(std::span<const Op> ops, const char* batch_name, Call call) {
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].file == nullptr) {
      return IoStatus(EINVAL,
                      std::string(batch_name) + ": op " + std::to_string(i) + " has no file");
    }
    if (IoStatus s = call(ops[i]); !s.ok()) return s;
  }
  return IoStatus::Ok();
}

}  // namespace

std::string DescribeOffset(const std::string& path, uint64_t offset) {
  return path + " at offset " + std::to_string(offset);
}

IoStatus UnexpectedEndOfFile(const std::string& path, uint64_t offset, size_t got, size_t want) {
  return IoStatus(EIO, "read " + DescribeOffset(path, offset) + ": unexpected end of file (got " +
                           std::to_string(got) + " of " + std::to_string(want) + " bytes)");
}

PosixFile::PosixFile(std::string path, int fd, bool direct)
    : path_(std::move(path)), fd_(fd), direct_(direct) {}

PosixFile::~PosixFile() {
  // A close() failure cannot be reported from here; durability comes from sync().
  if (fd_ >= 0) ::close(fd_);
}

IoStatus PosixFile::write_at(uint64_t offset, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t rc = ::pwrite(fd_, p + done, n - done, static_cast<off_t>(offset + done));
    if (rc < 0) {
      if (IsRetryable(errno)) continue;
      return IoStatus::FromErrno(errno, "write", DescribeOffset(path_, offset + done));
    }
    // pwrite() never returns 0 for a regular file with bytes left; retrying would spin.
    if (rc == 0) return IoStatus::FromErrno(EIO, "write", DescribeOffset(path_, offset + done));
    done += static_cast<size_t>(rc);
  }
  return IoStatus::Ok();
}

IoStatus PosixFile::read_at(uint64_t offset, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t rc = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
    if (rc < 0) {
      if (IsRetryable(errno)) continue;
      return IoStatus::FromErrno(errno, "read", DescribeOffset(path_, offset + done));
    }
    if (rc == 0) return UnexpectedEndOfFile(path_, offset, done, n);
    done += static_cast<size_t>(rc);
  }
  return IoStatus::Ok();
}

IoStatus PosixFile::sync() {
  if (RetryOnEintr(::fdatasync, fd_) != 0) return IoStatus::FromErrno(errno, "sync", path_);
  return IoStatus::Ok();
}

IoStatus PosixFile::size(uint64_t* bytes) {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return IoStatus::FromErrno(errno, "stat", path_);
  *bytes = static_cast<uint64_t>(st.st_size);
  return IoStatus::Ok();
}

IoStatus PosixFile::truncate(uint64_t bytes) {
  int rc;
  do {
    rc = ::ftruncate(fd_, static_cast<off_t>(bytes));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    return IoStatus::FromErrno(errno, "truncate",
                               path_ + " to " + std::to_string(bytes) + " bytes");
  }
  return IoStatus::Ok();
}

IoStatus OpenPosixFile(const std::string& path, const OpenOptions& options,
                       std::unique_ptr<File>* file) {
  int flags = O_CLOEXEC | (options.write ? O_RDWR : O_RDONLY);
  if (options.write && options.create) flags |= O_CREAT;
  if (options.write && options.truncate) flags |= O_TRUNC;
  bool direct = options.direct;
  int fd;
  for (;;) {
    fd = ::open(path.c_str(), flags | (direct ? O_DIRECT : 0), 0666);
    if (fd >= 0) break;
    if (errno == EINTR) continue;
    // Some file systems (older tmpfs, some FUSE) refuse O_DIRECT: go buffered instead.
    if (errno == EINVAL && direct) {
      direct = false;
      continue;
    }
    return IoStatus::FromErrno(errno, "open", path);
  }
  *file = std::make_unique<PosixFile>(path, fd, direct);
  return IoStatus::Ok();
}

IoStatus PosixFileSystem::open(const std::string& path, const OpenOptions& options,
                               std::unique_ptr<File>* file) {
  return OpenPosixFile(path, options, file);
}

IoStatus PosixFileSystem::write_batch(std::span<const WriteOp> ops) {
  return RunBatch(ops, "write_batch", [](const WriteOp& op) {
    return op.file->write_at(op.offset, op.data, op.length);
  });
}

IoStatus PosixFileSystem::read_batch(std::span<const ReadOp> ops) {
  return RunBatch(ops, "read_batch",
                  [](const ReadOp& op) { return op.file->read_at(op.offset, op.data, op.length); });
}

IoStatus PosixFileSystem::create_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0777) != 0) return IoStatus::FromErrno(errno, "create directory", path);
  return IoStatus::Ok();
}

IoStatus PosixFileSystem::create_dirs(const std::string& path) {
  if (path.empty()) return IoStatus::FromErrno(ENOENT, "create directory", "\"\"");
  // Each prefix ending before a '/' (and the whole path) in turn, like `mkdir -p`.
  for (size_t end = 1; end <= path.size(); ++end) {
    if (end < path.size() && path[end] != '/') continue;
    if (path[end - 1] == '/') continue;
    std::string prefix = path.substr(0, end);
    if (::mkdir(prefix.c_str(), 0777) == 0) continue;
    int error_number = errno;
    struct stat st;
    if (error_number == EEXIST && ::stat(prefix.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) continue;
      error_number = ENOTDIR;
    }
    return IoStatus::FromErrno(error_number, "create directory", prefix);
  }
  return IoStatus::Ok();
}

IoStatus PosixFileSystem::remove_file(const std::string& path) {
  if (::unlink(path.c_str()) != 0) return IoStatus::FromErrno(errno, "remove file", path);
  return IoStatus::Ok();
}

IoStatus PosixFileSystem::remove_tree(const std::string& path) {
  ScopedFd dir(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dir.get() < 0) {
    int error_number = errno;
    if (error_number != ENOTDIR && error_number != ELOOP) {
      return IoStatus::FromErrno(error_number, "remove tree", path);
    }
    // A file or a symlink: remove the entry itself, like `rm -rf`.
    return remove_file(path);
  }
  if (IoStatus s = RemoveContents(dir.get(), path); !s.ok()) return s;
  if (::rmdir(path.c_str()) != 0) return IoStatus::FromErrno(errno, "remove directory", path);
  return IoStatus::Ok();
}

IoStatus PosixFileSystem::rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return IoStatus::FromErrno(errno, "rename", from + " to " + to);
  }
  return IoStatus::Ok();
}

IoStatus PosixFileSystem::exchange(const std::string& a, const std::string& b) {
  // Called through syscall(): older glibc has no renameat2() wrapper.
  if (::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0) {
    return IoStatus::FromErrno(errno, "exchange", a + " with " + b);
  }
  return IoStatus::Ok();
}

IoStatus PosixFileSystem::list_dir(const std::string& path, std::vector<std::string>* names) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IoStatus::FromErrno(errno, "list directory", path);
  return ReadNames(fd, path, names);
}

IoStatus PosixFileSystem::sync_dir(const std::string& path) {
  ScopedFd dir(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) return IoStatus::FromErrno(errno, "open directory", path);
  if (RetryOnEintr(::fsync, dir.get()) != 0) {
    return IoStatus::FromErrno(errno, "sync directory", path);
  }
  return IoStatus::Ok();
}

IoStatus PosixFileSystem::stat(const std::string& path, bool* exists, bool* is_dir) {
  *exists = false;
  *is_dir = false;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    // ENOTDIR: a parent is a file, so the path cannot exist either.
    if (errno == ENOENT || errno == ENOTDIR) return IoStatus::Ok();
    return IoStatus::FromErrno(errno, "stat", path);
  }
  *exists = true;
  *is_dir = S_ISDIR(st.st_mode);
  return IoStatus::Ok();
}

IoStatus PosixFileSystem::file_size(const std::string& path, uint64_t* bytes) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return IoStatus::FromErrno(errno, "stat", path);
  *bytes = static_cast<uint64_t>(st.st_size);
  return IoStatus::Ok();
}

IoStatus PosixFileSystem::entry_type(const std::string& path, EntryType* type) {
  *type = EntryType::kNone;
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return IoStatus::Ok();
    return IoStatus::FromErrno(errno, "lstat", path);
  }
  if (S_ISREG(st.st_mode)) {
    *type = EntryType::kFile;
  } else if (S_ISDIR(st.st_mode)) {
    *type = EntryType::kDirectory;
  } else if (S_ISLNK(st.st_mode)) {
    *type = EntryType::kSymlink;
  } else {
    *type = EntryType::kOther;
  }
  return IoStatus::Ok();
}

std::unique_ptr<FileSystem> NewPosixFileSystem() { return std::make_unique<PosixFileSystem>(); }

}  // namespace asyncckpt::io
