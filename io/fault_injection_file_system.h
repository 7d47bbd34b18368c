#pragma once

// A FileSystemWrapper for tests: fails chosen operations with a chosen errno, and simulates a
// crash by forgetting file data that was never synced, so crash tests run in-process.
// In the spirit of leveldb's fault-injection env and RocksDB's FaultInjectionTestFS.

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "asyncckpt/file_system.h"

namespace asyncckpt::io {

/// The kinds of operation a fault can target; combine with `|`.
enum class FaultOp : uint32_t {
  kOpen = 1u << 0,        ///< FileSystem::open
  kWrite = 1u << 1,       ///< File::write_at and each queued write
  kRead = 1u << 2,        ///< File::read_at and each queued read
  kSync = 1u << 3,        ///< File::sync
  kTruncate = 1u << 4,    ///< File::truncate
  kCreateDir = 1u << 5,   ///< create_dir, create_dirs
  kRemove = 1u << 6,      ///< remove_file, remove_tree
  kRename = 1u << 7,      ///< rename, exchange (either path may match)
  kSyncDir = 1u << 8,     ///< sync_dir
  kLock = 1u << 9,        ///< lock_file
  kAllocate = 1u << 10,   ///< File::allocate
  kAll = (1u << 11) - 1,  ///< every counted operation
};

/// The union of two sets of operation kinds.
constexpr FaultOp operator|(FaultOp a, FaultOp b) {
  return static_cast<FaultOp>(static_cast<uint32_t>(a) | static_cast<uint32_t>(b));
}

/// What an operation hit by a fault does before it fails.
enum class FaultMode : uint8_t {
  /// Nothing: it fails with the errno and touches nothing underneath.
  kFail,
  /// A write or a read transfers its first half (n / 2 bytes; on a direct file rounded down
  /// to a multiple of 4096), as a disk that fills up mid-write does, then fails with the
  /// errno. Any other operation behaves as with kFail.
  kShortTransfer,
};

/// Injects faults into the operations it forwards to its target.
///
/// Counted operations are the ones FaultOp lists; list_dir, stat, file_size and File::size
/// pass through uncounted and never fail by injection. An injected failure reads "<op>
/// <path>[ at offset N]: <strerror> (injected fault)", or "... (injected fault after K of N
/// bytes)" for a short transfer, and performs nothing underneath except a short transfer's
/// first half. The lock file a lock_file() writes is
/// the target's business: it is neither tracked nor rolled back.
///
/// Crash simulation: the wrapper tracks, per file opened for writing through it, whether it
/// was written (or truncated) since its last File::sync() and how long it was then.
/// drop_unsynced_data() truncates each such file back to that length, or removes it when it
/// was never synced. Limitations: creates, renames, removals and directory syncs are never
/// rolled back (tracking follows renames and forgets removed paths); bytes overwritten inside
/// the synced length are not restored; paths are compared as spelled, so use one spelling.
///
/// Queues (new_io_queue) wrap the target's queue: each request is counted, in submission
/// order, as one write_at/read_at would be, when it is submitted; a request hit by a fault
/// goes to the target's queue cut to its short transfer's share (or to nothing), and its
/// callback gets the injected failure once that share is done. Requests on this wrapper's
/// Files reach the target's queue on the target's Files, so the io_uring queue keeps them in
/// its ring. A queue must not outlive the wrapper.
///
/// Thread-safe. Files it opens wrap the target's File, report fd() == -1 (so that a backend's
/// queue given one goes through write_at/read_at and the faults apply), and must not outlive
/// the wrapper.
class FaultInjectionFileSystem final : public FileSystemWrapper {
 public:
  /// Wraps target (not owned; must outlive the wrapper).
  explicit FaultInjectionFileSystem(FileSystem* target);
  ~FaultInjectionFileSystem() override;

  /// "fault_injection(<target's name>)".
  std::string name() const override;
  IoStatus open(const std::string& path, const OpenOptions& options,
                std::unique_ptr<File>* file) override;
  IoStatus lock_file(const std::string& path, std::unique_ptr<FileLock>* lock) override;
  /// The target's queue behind one that injects faults (see the class comment).
  IoStatus new_io_queue(const IoQueueOptions& options, std::unique_ptr<IoQueue>* queue) override;
  IoStatus create_dir(const std::string& path) override;
  IoStatus create_dirs(const std::string& path) override;
  IoStatus remove_file(const std::string& path) override;
  IoStatus remove_tree(const std::string& path) override;
  IoStatus rename(const std::string& from, const std::string& to) override;
  IoStatus exchange(const std::string& a, const std::string& b) override;
  IoStatus sync_dir(const std::string& path) override;

  /// The n-th counted operation from now (n = 1: the next one; 0 counts as 1) and every
  /// later one fail with errno_value as `mode` says, until clear_faults(): a disk that stays
  /// full or broken. Replaces an earlier fail_after() or fail_at().
  void fail_after(uint64_t n, int errno_value, FaultMode mode = FaultMode::kFail);
  /// Only the n-th counted operation from now (n as for fail_after()) fails, with errno_value
  /// as `mode` says; the ones after it run normally: a transient fault. Replaces an earlier
  /// fail_after() or fail_at().
  void fail_at(uint64_t n, int errno_value, FaultMode mode = FaultMode::kFail);
  /// Operations of a kind in `ops` whose path contains path_substring (empty: any path) fail
  /// with errno_value as `mode` says, until clear_faults(). Rules add up; the first match
  /// wins. fail_after() and fail_at() take precedence over rules.
  void fail_ops_matching(std::string path_substring, int errno_value, FaultOp ops = FaultOp::kAll,
                         FaultMode mode = FaultMode::kFail);
  /// Removes every fault; counting goes on.
  void clear_faults();
  /// Counted operations since construction, failed ones included.
  uint64_t operation_count() const;
  /// Operations failed by injection since construction (a sweep's check that its fault hit).
  uint64_t injected_count() const;
  /// Simulates a crash (see the class comment); call it once the code under test no longer
  /// uses its files. Returns the first failure to truncate or remove, after trying them all.
  IoStatus drop_unsynced_data();

 private:
  class FaultFile;
  class FaultQueue;
  struct FileState;
  struct Rule {
    std::string path_substring;
    int errno_value;
    FaultOp ops;
    FaultMode mode;
  };
  // The fault an operation drew: errno_value 0 for none.
  struct Injected {
    int errno_value = 0;
    FaultMode mode = FaultMode::kFail;
  };

  // Counts one operation and returns the fault it drew, if any; `paths` are what rules match
  // against.
  Injected Check(FaultOp op, std::initializer_list<std::string_view> paths);
  // Check() for an operation that transfers nothing: the injected failure as an IoStatus.
  // `subject` is what the message names ("<path>", "<from> to <to>").
  IoStatus CheckFail(FaultOp op, std::string_view verb, std::string_view subject,
                     std::initializer_list<std::string_view> paths);
  std::shared_ptr<FileState> TrackFile(const std::string& path, bool truncated);
  void MarkDirty(FileState& state);
  // Moves tracking of `from` (a file, or a directory and everything below) to `to`.
  void MovePathsLocked(const std::string& from, const std::string& to,
                       std::map<std::string, std::shared_ptr<FileState>>* moved);
  void ForgetPaths(const std::string& path);

  mutable std::mutex mu_;
  uint64_t count_ = 0;       // guarded by mu_
  uint64_t injected_ = 0;    // guarded by mu_
  uint64_t fail_at_ = 0;     // guarded by mu_; 0: no fail_after/fail_at fault
  bool fail_once_ = false;   // guarded by mu_; fail_at: only count_ == fail_at_ fails
  Injected positional_;      // guarded by mu_; what fail_after/fail_at inject
  std::vector<Rule> rules_;  // guarded by mu_
  std::map<std::string, std::shared_ptr<FileState>> files_;  // guarded by mu_; by current path
};

}  // namespace asyncckpt::io
