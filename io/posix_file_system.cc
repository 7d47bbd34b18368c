#include "io/posix_file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
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

// pwrite() until all n bytes are written at offset.
IoStatus WriteFully(int fd, const std::string& path, uint64_t offset, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t rc = ::pwrite(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (rc < 0) {
      if (IsRetryable(errno)) continue;
      return IoStatus::FromErrno(errno, "write", DescribeOffset(path, offset + done));
    }
    // pwrite() never returns 0 for a regular file with bytes left; retrying would spin.
    if (rc == 0) return IoStatus::FromErrno(EIO, "write", DescribeOffset(path, offset + done));
    done += static_cast<size_t>(rc);
  }
  return IoStatus::Ok();
}

// What `mode` says a path is, for messages: "a FIFO", "a directory", ...
const char* FileKind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a special file";
}

IoStatus NotARegularFile(const std::string& path, mode_t mode) {
  return IoStatus(S_ISDIR(mode) ? EISDIR : EINVAL,
                  path + " is " + FileKind(mode) + ", not a regular file");
}

// The failure of `op` on `path` after the kernel said ENOTDIR: names the first component of
// `path` that exists but is not a directory, and what it is.
IoStatus NotADirectory(std::string_view op, const std::string& path) {
  for (size_t end = 1; end <= path.size(); ++end) {
    if (end < path.size() && path[end] != '/') continue;
    const std::string prefix = path.substr(0, end);
    struct stat st;
    if (::stat(prefix.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) continue;
    // The path itself, where a directory was wanted (list_dir, sync_dir, create_dirs).
    std::string reason = prefix + " is " + FileKind(st.st_mode) + ", not a directory";
    if (end == path.size()) return IoStatus(ENOTDIR, std::move(reason));
    return IoStatus(ENOTDIR, std::string(op) + " " + path + ": " + reason);
  }
  return IoStatus::FromErrno(ENOTDIR, op, path);
}

// The failure of `op` on `path` for errno `error_number`, with ENOTDIR explained.
IoStatus OpenFailure(int error_number, std::string_view op, const std::string& path) {
  if (error_number == ENOTDIR) return NotADirectory(op, path);
  return IoStatus::FromErrno(error_number, op, path);
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Fails unless `fd`, opened with O_NONBLOCK, is a regular file, and then clears O_NONBLOCK:
// on a regular file io_uring would otherwise answer -EAGAIN where it should wait for the disk.
IoStatus RequireRegularFile(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return IoStatus::FromErrno(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) return NotARegularFile(path, st.st_mode);
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return IoStatus::FromErrno(errno, "clear O_NONBLOCK on", path);
  }
  return IoStatus::Ok();
}

// open(2) with O_NONBLOCK, so that a FIFO or a device at `path` cannot make it wait for a
// writer or a carrier; RequireRegularFile() then rejects those. Returns the descriptor or -1
// with errno set.
int OpenNonBlocking(const std::string& path, int flags) {
  bool nonblock = true;
  for (;;) {
    int fd = ::open(path.c_str(), flags | (nonblock ? O_NONBLOCK : 0), 0666);
    if (fd >= 0) return fd;
    if (errno == EINTR) continue;
    // A regular file under a lease (an NFS or Samba server's) answers EWOULDBLOCK to
    // O_NONBLOCK instead of waiting until the lease holder lets go (at most
    // /proc/sys/fs/lease-break-time): that wait is bounded, so take it.
    if (errno == EWOULDBLOCK && nonblock && IsRegularFile(path)) {
      nonblock = false;
      continue;
    }
    if (errno == ENXIO) {
      // A socket, or a device without a driver: reported as what it is by the caller.
      const int error_number = errno;
      struct stat st;
      const bool special = ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
      errno = special ? EINVAL : error_number;
    }
    return -1;
  }
}

// The holder a lock file names ("pid 1234 on host h"), read from its open descriptor.
std::string DescribeLockHolder(int fd) {
  char buffer[256];
  const ssize_t got = ::pread(fd, buffer, sizeof(buffer) - 1, 0);
  const std::string_view text(buffer, got > 0 ? static_cast<size_t>(got) : 0);
  const std::string_view line = text.substr(0, text.find('\n'));
  constexpr std::string_view kPid = "pid=", kHost = " host=";
  const size_t host_at = line.find(kHost);
  if (line.substr(0, kPid.size()) == kPid && host_at != std::string_view::npos) {
    const std::string_view pid = line.substr(kPid.size(), host_at - kPid.size());
    const std::string_view host = line.substr(host_at + kHost.size());
    const bool digits = !pid.empty() && pid.size() <= 20 &&
                        pid.find_first_not_of("0123456789") == std::string_view::npos;
    if (digits && !host.empty() && host.size() <= 255) {
      std::string printable(host);
      for (char& c : printable) {
        if (c < '!' || c > '~') c = '?';
      }
      return "pid " + std::string(pid) + " on host " + printable;
    }
  }
  return "another process (the file does not name it)";
}

// "pid=<pid> host=<host name>\n", what a lock holder writes into its lock file.
std::string LockHolderLine() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    std::snprintf(host, sizeof(host), "unknown");
  }
  return "pid=" + std::to_string(::getpid()) + " host=" + host + "\n";
}

// A flock() on an open descriptor. The lock belongs to the open file description, which a
// child forked without exec shares (O_CLOEXEC covers exec): the explicit LOCK_UN releases it
// even while such a child still holds a copy of the descriptor.
class PosixFileLock final : public FileLock {
 public:
  PosixFileLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixFileLock() override {
    // Emptied first, so a file that still names a holder is one whose lock is (or was, when
    // the holder died) held; a failure only leaves a stale name behind.
    (void)::ftruncate(fd_, 0);
    (void)::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  PosixFileLock(const PosixFileLock&) = delete;
  PosixFileLock& operator=(const PosixFileLock&) = delete;
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_;
};

}  // namespace

std::string DescribeOffset(const std::string& path, uint64_t offset) {
  return path + " at offset " + std::to_string(offset);
}

IoStatus UnexpectedEndOfFile(const std::string& path, uint64_t offset, size_t got, size_t want) {
  return IoStatus(EIO, "read " + DescribeOffset(path, offset) + ": unexpected end of file (got " +
                           std::to_string(got) + " of " + std::to_string(want) + " bytes)");
}

PosixFile::PosixFile(std::string path, int fd, bool direct, bool in_memory)
    : path_(std::move(path)), fd_(fd), direct_(direct), in_memory_(in_memory) {}

PosixFile::~PosixFile() {
  // A close() failure cannot be reported from here; durability comes from sync().
  if (fd_ >= 0) ::close(fd_);
}

IoStatus PosixFile::write_at(uint64_t offset, const void* data, size_t n) {
  return WriteFully(fd_, path_, offset, data, n);
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

IoStatus PosixFile::allocate(uint64_t offset, uint64_t n) {
  if (n == 0) return IoStatus::Ok();
  int rc;
  do {
    rc = ::fallocate(fd_, 0, static_cast<off_t>(offset), static_cast<off_t>(n));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return IoStatus::Ok();
  const int error = errno == ENOSYS ? ENOTSUP : errno;
  return IoStatus::FromErrno(
      error, "allocate",
      path_ + " at offset " + std::to_string(offset) + ", " + std::to_string(n) + " bytes");
}

// tmpfs and ramfs: their page cache is the file, so O_DIRECT (which tmpfs accepts since Linux
// 6.6) saves no copy. It only cost: the engine preallocates direct files, and fallocate there
// zeroes every page of the file on the caller's thread before the first write (0.4-1.2 s per
// GiB on the training thread in issue 17's tmpfs runs).
bool MemoryBacked(int fd) {
  constexpr decltype(statfs::f_type) kTmpfsMagic = 0x01021994;
  constexpr decltype(statfs::f_type) kRamfsMagic =
      static_cast<decltype(statfs::f_type)>(0x858458f6);
  struct statfs fs;
  return ::fstatfs(fd, &fs) == 0 && (fs.f_type == kTmpfsMagic || fs.f_type == kRamfsMagic);
}

// Clears O_DIRECT (on a memory-backed file); false when it cannot.
bool DropDirect(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags & ~O_DIRECT) == 0;
}

IoStatus OpenPosixFile(const std::string& path, const OpenOptions& options,
                       std::unique_ptr<File>* file) {
  int flags = O_CLOEXEC | (options.write ? O_RDWR : O_RDONLY);
  if (options.write && options.create) flags |= O_CREAT;
  if (options.write && options.truncate) flags |= O_TRUNC;
  bool direct = options.direct;
  int fd;
  for (;;) {
    fd = OpenNonBlocking(path, flags | (direct ? O_DIRECT : 0));
    if (fd >= 0) break;
    // Some file systems (older tmpfs, some FUSE) refuse O_DIRECT: go buffered instead.
    if (errno == EINVAL && direct) {
      direct = false;
      continue;
    }
    int error_number = errno;
    struct stat st;
    if (error_number == EINVAL && ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      return NotARegularFile(path, st.st_mode);
    }
    return OpenFailure(error_number, "open", path);
  }
  ScopedFd owned(fd);
  if (IoStatus s = RequireRegularFile(owned.get(), path); !s.ok()) return s;
  const bool in_memory = MemoryBacked(owned.get());
  if (direct && in_memory && DropDirect(owned.get())) direct = false;
  *file = std::make_unique<PosixFile>(path, owned.release(), direct, in_memory);
  return IoStatus::Ok();
}

IoStatus PosixFileSystem::open(const std::string& path, const OpenOptions& options,
                               std::unique_ptr<File>* file) {
  return OpenPosixFile(path, options, file);
}

IoStatus PosixFileSystem::lock_file(const std::string& path, std::unique_ptr<FileLock>* lock) {
  // flock(), not fcntl() byte-range locks: it belongs to the open file description, so two
  // lock_file() calls of one process conflict as two processes do, and closing some other
  // descriptor of the file never drops it (a classic fcntl lock dies with any close()).
  // O_NOFOLLOW: a symlink planted at `path` must not make us truncate the file it names.
  const int fd = OpenNonBlocking(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    const int error_number = errno;
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      return NotARegularFile(path, st.st_mode);
    }
    return OpenFailure(error_number, "open lock file", path);
  }
  ScopedFd owned(fd);
  if (IoStatus s = RequireRegularFile(owned.get(), path); !s.ok()) return s;
  int rc;
  do {
    rc = ::flock(owned.get(), LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    if (errno == EWOULDBLOCK) {
      return IoStatus(EWOULDBLOCK, path + " is held by " + DescribeLockHolder(owned.get()));
    }
    return IoStatus::FromErrno(errno, "lock", path);
  }
  const std::string holder = LockHolderLine();
  if (::ftruncate(owned.get(), 0) != 0) {
    return IoStatus::FromErrno(errno, "truncate lock file", path);
  }
  if (IoStatus s = WriteFully(owned.get(), path, 0, holder.data(), holder.size()); !s.ok()) {
    // The flock is the lock; the line only names the holder to a refused job. A full disk, a
    // quota or a file-size limit must not stop a resume: keep the lock, the file left empty.
    const int e = s.error_number();
    if (e != ENOSPC && e != EDQUOT && e != EFBIG) return s;
    (void)::ftruncate(owned.get(), 0);
  }
  *lock = std::make_unique<PosixFileLock>(path, owned.release());
  return IoStatus::Ok();
}

IoStatus PosixFileSystem::create_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0777) != 0) return OpenFailure(errno, "create directory", path);
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
      return IoStatus(ENOTDIR, prefix + " is " + FileKind(st.st_mode) + ", not a directory");
    }
    return OpenFailure(error_number, "create directory", prefix);
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
  if (fd < 0) return OpenFailure(errno, "list directory", path);
  return ReadNames(fd, path, names);
}

IoStatus PosixFileSystem::sync_dir(const std::string& path) {
  ScopedFd dir(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) return OpenFailure(errno, "open directory", path);
  if (RetryOnEintr(::fsync, dir.get()) != 0) {
    return IoStatus::FromErrno(errno, "sync directory", path);
  }
  return IoStatus::Ok();
}

IoStatus PosixFileSystem::file_size(const std::string& path, uint64_t* bytes) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return IoStatus::FromErrno(errno, "stat", path);
  *bytes = static_cast<uint64_t>(st.st_size);
  return IoStatus::Ok();
}

IoStatus PosixFileSystem::entry_type(const std::string& path, EntryType* type, Symlinks symlinks) {
  *type = EntryType::kNone;
  struct stat st;
  const bool follow = symlinks == Symlinks::kFollow;
  if ((follow ? ::stat(path.c_str(), &st) : ::lstat(path.c_str(), &st)) != 0) {
    // ENOTDIR: a parent is a file, so the path cannot exist either.
    if (errno == ENOENT || errno == ENOTDIR) return IoStatus::Ok();
    return IoStatus::FromErrno(errno, follow ? "stat" : "lstat", path);
  }
  if (S_ISREG(st.st_mode)) {
    *type = EntryType::kFile;
  } else if (S_ISDIR(st.st_mode)) {
    *type = EntryType::kDirectory;
  } else if (S_ISLNK(st.st_mode)) {
    *type = EntryType::kSymlink;
  } else if (S_ISFIFO(st.st_mode)) {
    *type = EntryType::kFifo;
  } else if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
    *type = EntryType::kDevice;
  } else if (S_ISSOCK(st.st_mode)) {
    *type = EntryType::kSocket;
  } else {
    *type = EntryType::kOther;
  }
  return IoStatus::Ok();
}

std::unique_ptr<FileSystem> NewPosixFileSystem() { return std::make_unique<PosixFileSystem>(); }

}  // namespace asyncckpt::io
