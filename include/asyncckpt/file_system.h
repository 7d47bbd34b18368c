#pragma once

// The one seam between asyncckpt and the operating system's files (leveldb's Env). Everything
// in the library that touches a file goes through a FileSystem, and every component takes one
// in its options (SaverOptions, InputPipelineOptions, ReaderOptions, the state-file functions):
// null picks the default backend, anything else is borrowed, so a user can wrap the default
// (FileSystemWrapper) to count, throttle or inject faults.
//
// The backends live in io/ and include only this header (and the limits it includes), the
// standard library and liburing:
// failures are reported with IoStatus (an errno and a message naming the operation and the
// path), which the library turns into an asyncckpt::Status in one place.

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "asyncckpt/limits.h"

namespace asyncckpt::io {

/// The outcome of an I/O call: errno 0 on success, else the errno and a message such as
/// "write /ckpt/x/data-00000-of-00002 at offset 4096: No space left on device".
class [[nodiscard]] IoStatus {
 public:
  /// Success.
  IoStatus() = default;
  /// A failure with an errno value and a full message.
  IoStatus(int error_number, std::string message)
      : errno_(error_number), message_(std::move(message)) {}
  /// Success.
  static IoStatus Ok() { return IoStatus(); }
  /// A failure of `op` on `path`, message built from strerror(error_number).
  static IoStatus FromErrno(int error_number, std::string_view op, std::string_view path);
  /// True on success.
  bool ok() const { return errno_ == 0; }
  /// The errno value; 0 on success.
  int error_number() const { return errno_; }
  /// The message; empty on success.
  const std::string& message() const { return message_; }

 private:
  int errno_ = 0;
  std::string message_;
};

/// How to open a file.
struct OpenOptions {
  /// Open for writing (else read-only).
  bool write = false;
  /// Create the file when missing (needs write).
  bool create = false;
  /// Truncate to zero on open (needs write).
  bool truncate = false;
  /// Ask for O_DIRECT. When the file system refuses it, or keeps files in memory (tmpfs,
  /// ramfs: nothing to bypass), the file is opened buffered and File::is_direct() says so. Direct
  /// files need 4096-aligned buffers, offsets and lengths.
  bool direct = false;
};

/// An open file. Closed by the destructor. Calls on one File may come from several threads
/// (positional I/O only, no shared cursor).
class File {
 public:
  virtual ~File() = default;
  /// The path it was opened with.
  virtual const std::string& path() const = 0;
  /// True when opened with O_DIRECT.
  virtual bool is_direct() const = 0;
  /// Writes all n bytes at offset (short writes are continued; EINTR/EAGAIN retried).
  virtual IoStatus write_at(uint64_t offset, const void* data, size_t n) = 0;
  /// Reads exactly n bytes at offset; reading past the end is an error (EIO, "unexpected end of
  /// file").
  virtual IoStatus read_at(uint64_t offset, void* data, size_t n) = 0;
  /// Makes written data durable (fdatasync).
  virtual IoStatus sync() = 0;
  /// The current size in bytes.
  virtual IoStatus size(uint64_t* bytes) = 0;
  /// Sets the size (used to trim padding written for O_DIRECT).
  virtual IoStatus truncate(uint64_t bytes) = 0;
  /// Reserves disk blocks for [offset, offset + n) and, where that reaches past the end, sets
  /// the size to offset + n (fallocate(2) mode 0; the new bytes read as zeros). Writes there
  /// then neither allocate nor extend the file, so a file system such as ext4 can run O_DIRECT
  /// writes concurrently under a shared inode lock (and io_uring inline, without punting them
  /// to worker threads). ENOTSUP (the default) where the backend or the file system cannot;
  /// ENOSPC when the space is not there (part of the range may be reserved then).
  virtual IoStatus allocate(uint64_t offset, uint64_t n) {
    (void)offset;
    (void)n;
    return IoStatus(ENOTSUP, "allocate " + path() + ": not supported by this file");
  }
  /// The raw descriptor, for backends that submit I/O themselves; -1 if there is none.
  virtual int fd() const = 0;
  /// True when the file lives in memory (tmpfs, ramfs): a write is the kernel copying into its
  /// pages on the writing CPU, not a transfer a device does, so an IoQueue writes it from a
  /// thread of its own rather than through a ring (io/per_file_io_queue.h says why).
  virtual bool in_memory() const { return false; }
};

/// An exclusive advisory lock on a file (FileSystem::lock_file), held until destroyed.
class FileLock {
 public:
  /// Releases the lock.
  virtual ~FileLock() = default;
  /// The lock file's path, as given to lock_file().
  virtual const std::string& path() const = 0;
};

/// One positional write for an IoQueue. The buffer and the file stay alive until it completes.
struct WriteOp {
  File* file = nullptr;
  uint64_t offset = 0;
  const void* data = nullptr;
  size_t length = 0;
};

/// One positional read for an IoQueue. The buffer and the file stay alive until it completes.
struct ReadOp {
  File* file = nullptr;
  uint64_t offset = 0;
  void* data = nullptr;
  size_t length = 0;
};

/// What a directory entry is, as lstat(2) sees it: a symlink is reported as one, not followed.
enum class EntryType {
  /// Nothing by that name.
  kNone,
  /// A regular file.
  kFile,
  /// A directory.
  kDirectory,
  /// A symbolic link (whatever it points at, if anything).
  kSymlink,
  /// A FIFO (named pipe): opening it for reading blocks until a writer comes.
  kFifo,
  /// A character or block device.
  kDevice,
  /// A Unix domain socket.
  kSocket,
  /// Anything else.
  kOther,
};
/// Whether FileSystem::entry_type reports a final symlink as one or looks through it.
enum class Symlinks {
  /// lstat: a symlink is kSymlink, whatever it points at.
  kReport,
  /// stat: the type of what the link points at.
  kFollow,
};

/// A buffer that a backend may register with the kernel for zero-copy I/O (io_uring's fixed
/// buffers). Not owned.
struct IoBuffer {
  /// First byte.
  void* data = nullptr;
  /// Bytes.
  size_t length = 0;
};

/// Called once for every request of an IoQueue with the request's tag and its outcome.
using IoCallback = std::function<void(uint64_t tag, IoStatus status)>;

/// Most threads of the default (thread-pool) IoQueue: enough to keep a local SSD's queue busy
/// with O_DIRECT requests, few enough not to crowd the training job's cores.
inline constexpr unsigned kMaxPoolQueueThreads = 16;

/// Options of an IoQueue.
struct IoQueueOptions {
  /// Most requests in flight at once; requests beyond it wait in the queue, in order.
  unsigned depth = kDefaultQueueDepth;
  /// Called once per request, on one of the queue's own threads (never the submitter's),
  /// possibly concurrently for different requests. It may submit more requests; it must not
  /// call drain() or destroy the queue, and should return quickly: while it runs, that thread
  /// completes nothing else.
  IoCallback on_complete;
};

/// Asynchronous positional reads and writes, for pipelines that must keep the device busy
/// without a thread blocked per request (the engine's write stage, the reader's restore).
///
/// A request is submitted with a tag and never waits for I/O: it goes to the device at once
/// when fewer than depth() are in flight, else it waits its turn in the queue. Each request
/// completes exactly once, through options.on_complete, with the same contract as the
/// synchronous calls: a write writes all its bytes (short writes continued, EINTR/EAGAIN
/// retried), a read reads exactly its length (EIO "unexpected end of file" past the end). The
/// buffer and the File stay alive and the buffer unchanged (write) or untouched (read) until
/// the request's callback has been called. Requests run concurrently and in no particular
/// order; requests that overlap in one file leave unspecified bytes there.
///
/// Thread-safe: submit from any thread. The destructor drains, then stops the queue's threads.
class IoQueue {
 public:
  virtual ~IoQueue() = default;
  /// Queues the write `op`; its outcome comes to on_complete with `tag`.
  virtual void submit_write(const WriteOp& op, uint64_t tag) = 0;
  /// Queues the read `op`; its outcome comes to on_complete with `tag`.
  virtual void submit_read(const ReadOp& op, uint64_t tag) = 0;
  /// Blocks until every request submitted so far (by any thread, callbacks included) has
  /// completed and its callback has returned. Not from a callback.
  virtual void drain() = 0;
  /// Most requests in flight at once.
  virtual unsigned depth() const = 0;
  /// "io_uring", "thread_pool", or a wrapper's name.
  virtual std::string name() const = 0;
};

/// Files and directories. Implementations are thread-safe.
///
/// No call blocks on a special file: open() and lock_file() fail (EISDIR for a directory,
/// EINVAL for anything else, message "<path> is a FIFO, not a regular file") when the path is
/// not a regular file, and the directory calls fail with ENOTDIR ("<path> is a FIFO, not a
/// directory") when a path they need as a directory is something else.
class FileSystem {
 public:
  virtual ~FileSystem() = default;
  /// "posix", "io_uring", or a wrapper's name.
  virtual std::string name() const = 0;
  /// Opens (and maybe creates) a regular file.
  virtual IoStatus open(const std::string& path, const OpenOptions& options,
                        std::unique_ptr<File>* file) = 0;
  /// Takes an exclusive advisory lock on the regular file `path` (created, mode 0666 less the
  /// umask, when missing; a symlink is refused) without waiting. On success *lock holds it
  /// and the file reads "pid=<pid> host=<host name>\n"; destroying *lock empties the file and
  /// releases the lock, and the file stays. The lock belongs to the returned object, not to
  /// the process: a second lock_file() of the same file fails while *lock lives, from this
  /// process as from any other, with EWOULDBLOCK and the message "<path> is held by pid
  /// <pid> on host <host>" (as the file names its holder). Advisory: only lock_file() callers
  /// respect it.
  virtual IoStatus lock_file(const std::string& path, std::unique_ptr<FileLock>* lock) = 0;
  /// Creates one directory; EEXIST is a failure.
  virtual IoStatus create_dir(const std::string& path) = 0;
  /// Creates a directory and its missing parents; existing ones are fine.
  virtual IoStatus create_dirs(const std::string& path) = 0;
  /// Removes a file.
  virtual IoStatus remove_file(const std::string& path) = 0;
  /// Removes a directory and everything below it (no symlinks followed).
  virtual IoStatus remove_tree(const std::string& path) = 0;
  /// Renames; replaces `to` if it is a file or an empty directory.
  virtual IoStatus rename(const std::string& from, const std::string& to) = 0;
  /// Atomically swaps two existing paths (renameat2 RENAME_EXCHANGE); ENOSYS/EINVAL where the
  /// kernel or file system cannot.
  virtual IoStatus exchange(const std::string& a, const std::string& b) = 0;
  /// The names in a directory (no "." or ".."), unsorted.
  virtual IoStatus list_dir(const std::string& path, std::vector<std::string>* names) = 0;
  /// Makes a directory's entries durable (fsync on the directory).
  virtual IoStatus sync_dir(const std::string& path) = 0;
  /// The size of a file.
  virtual IoStatus file_size(const std::string& path, uint64_t* bytes) = 0;
  /// What is at `path`; ENOENT and ENOTDIR are not errors (kNone). By default a final symlink
  /// is reported as one (lstat), so that a caller can refuse to follow a link out of a
  /// directory; Symlinks::kFollow looks through it (stat), as for a checkpoint_dir that is a
  /// link to a directory (a dangling link is then kNone).
  virtual IoStatus entry_type(const std::string& path, EntryType* type,
                              Symlinks symlinks = Symlinks::kReport) = 0;
  /// A new asynchronous queue for files opened through this file system. The default runs
  /// each request through File::write_at / File::read_at on a pool of up to
  /// min(depth, kMaxPoolQueueThreads) threads, so it works for any backend and for wrappers
  /// whose Files add behaviour; the io_uring backend keeps `depth` requests in flight from one
  /// thread that owns a ring. EINVAL when options.on_complete is empty or depth is 0.
  virtual IoStatus new_io_queue(const IoQueueOptions& options, std::unique_ptr<IoQueue>* queue);
  /// Lets the backend register `buffers` with the kernel for zero-copy I/O (replacing earlier
  /// ones); requests lying wholly inside one of them may then use it. The memory must stay
  /// mapped until unregister_buffers() or the next register_buffers() returns, or the file
  /// system is destroyed. ENOTSUP (the default) where the backend has no use for it; other
  /// failures (ENOMEM under RLIMIT_MEMLOCK) only inform: I/O goes on without them.
  virtual IoStatus register_buffers(std::span<const IoBuffer> buffers) {
    (void)buffers;
    return IoStatus(ENOTSUP, "register_buffers: not supported by this file system");
  }
  /// Forgets the buffers registered by register_buffers().
  virtual void unregister_buffers() {}
};

/// Forwards every call to a target; decorators derive from it and override what they change.
class FileSystemWrapper : public FileSystem {
 public:
  /// Wraps target (not owned; must outlive the wrapper).
  explicit FileSystemWrapper(FileSystem* target) : target_(target) {}
  std::string name() const override { return target_->name(); }
  IoStatus open(const std::string& path, const OpenOptions& options,
                std::unique_ptr<File>* file) override {
    return target_->open(path, options, file);
  }
  IoStatus lock_file(const std::string& path, std::unique_ptr<FileLock>* lock) override {
    return target_->lock_file(path, lock);
  }
  IoStatus create_dir(const std::string& path) override { return target_->create_dir(path); }
  IoStatus create_dirs(const std::string& path) override { return target_->create_dirs(path); }
  IoStatus remove_file(const std::string& path) override { return target_->remove_file(path); }
  IoStatus remove_tree(const std::string& path) override { return target_->remove_tree(path); }
  IoStatus rename(const std::string& from, const std::string& to) override {
    return target_->rename(from, to);
  }
  IoStatus exchange(const std::string& a, const std::string& b) override {
    return target_->exchange(a, b);
  }
  IoStatus list_dir(const std::string& path, std::vector<std::string>* names) override {
    return target_->list_dir(path, names);
  }
  IoStatus sync_dir(const std::string& path) override { return target_->sync_dir(path); }
  IoStatus file_size(const std::string& path, uint64_t* bytes) override {
    return target_->file_size(path, bytes);
  }
  IoStatus entry_type(const std::string& path, EntryType* type,
                      Symlinks symlinks = Symlinks::kReport) override {
    return target_->entry_type(path, type, symlinks);
  }
  /// Forwards: the target's queue runs requests on the target's Files. A wrapper whose Files
  /// add behaviour (faults, accounting) overrides it, e.g. with FileSystem::new_io_queue, the
  /// thread pool over its own Files.
  IoStatus new_io_queue(const IoQueueOptions& options, std::unique_ptr<IoQueue>* queue) override {
    return target_->new_io_queue(options, queue);
  }
  IoStatus register_buffers(std::span<const IoBuffer> buffers) override {
    return target_->register_buffers(buffers);
  }
  void unregister_buffers() override { target_->unregister_buffers(); }

 protected:
  FileSystem* target() const { return target_; }

 private:
  FileSystem* target_;
};

/// Options for choosing and tuning a backend.
struct IoOptions {
  /// Skip io_uring and use the POSIX backend.
  bool force_posix_io = false;
};

/// The plain POSIX backend (pread/pwrite loops).
std::unique_ptr<FileSystem> NewPosixFileSystem();

/// The io_uring backend, or null with *why set when a ring cannot be set up here.
std::unique_ptr<FileSystem> NewUringFileSystem(const IoOptions& options, std::string* why);

/// io_uring when a ring can be set up, else POSIX; *fallback_reason says why when it fell back
/// (empty otherwise), so the caller can log one line.
std::unique_ptr<FileSystem> NewDefaultFileSystem(const IoOptions& options,
                                                 std::string* fallback_reason);

}  // namespace asyncckpt::io
