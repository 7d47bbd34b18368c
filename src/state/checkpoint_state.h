#pragma once

// The `checkpoint` state file, the atomic commit of a checkpoint directory, and retention.
//
// Internal to the library: the public face is include/asyncckpt/state.h. Every file access goes
// through an io::FileSystem so that tests can put faults in its way.
//
// Names are data, never paths: a checkpoint name ("model.ckpt-1000") is a single entry of the
// checkpoint directory. A name that is empty, contains '/', contains "..", or holds a byte that
// would need quoting in the text form ('"', '\\', control bytes) is refused everywhere.

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"
#include "asyncckpt/status.h"
#include "asyncckpt/timer.h"

namespace asyncckpt {

/// The largest state file that is read; a larger one is Corruption (a hostile or wrong file).
inline constexpr uint64_t kMaxCheckpointStateFileBytes = uint64_t{16} << 20;

/// OK when `name` may name an entry of a checkpoint directory, else InvalidArgument saying why.
Status ValidateCheckpointName(std::string_view name);

/// `dir` + "/" + `name` (no doubled separator; just `name` when dir is empty).
std::string JoinCheckpointPath(const std::string& dir, const std::string& name);

/// The text form of `state` (TensorFlow's CheckpointState text proto), fields in proto order,
/// timestamps with enough digits to round-trip. The state must pass ValidateCheckpointState.
std::string SerializeCheckpointState(const CheckpointState& state);

/// OK when `state` can be written and read back: valid names, no duplicates, the model path last
/// in the list (or the list empty), timestamps empty or one per path, all finite.
/// InvalidArgument otherwise.
Status ValidateCheckpointState(const CheckpointState& state);

/// Parses the text form. Tolerates any field order and blank lines; anything else that is not
/// well formed (unknown or repeated field, bad quoting, a non-numeric timestamp, a bad name, a
/// duplicate, timestamps not one per path, the model path not last) is Corruption with a message
/// "<source>:<line>: <what>". A list with no timestamps gets timestamps of 0 (as TensorFlow); an
/// empty list with a model path set becomes [model path].
Result<CheckpointState> ParseCheckpointState(std::string_view text, const std::string& source);

/// Reads and parses `dir`/`state_file_name`. NotFound when it does not exist, Corruption when it
/// is larger than kMaxCheckpointStateFileBytes or does not parse, IOError when it cannot be read.
Result<CheckpointState> ReadCheckpointState(io::FileSystem& fs, const std::string& dir,
                                            const std::string& state_file_name);

/// Replaces `dir`/`state_file_name` atomically: writes "<state_file_name>.tmp-<random>", syncs
/// it, renames it over the state file, syncs `dir`. After a failure the previous state file is
/// intact (the temporary is removed when possible; RemoveStaleTemporaries removes what a crash
/// leaves). InvalidArgument when the state fails ValidateCheckpointState.
Status WriteCheckpointState(io::FileSystem& fs, const std::string& dir,
                            const CheckpointState& state,
                            const std::string& state_file_name = kCheckpointStateFileName);

/// "<final_name>.tmp-<16 random hex digits>": where a checkpoint is written before its commit.
std::string TempDirName(const std::string& final_name);

/// Makes `parent`/`tmp_name` (a fully written and synced checkpoint directory) visible as
/// `parent`/`final_name`, durably.
///
/// Crash consistency. The contract is: at every instant, `final_name` is either absent, the old
/// complete checkpoint, or the new complete checkpoint, and once this returns OK the new one
/// survives a crash. It rests on three facts: rename(2) and renameat2(RENAME_EXCHANGE) are
/// atomic with respect to crashes for the names they touch; a directory's entries are durable
/// only after fsync of that directory; and the data files inside the new checkpoint were already
/// synced by the writer. The steps:
///
///  1. sync_dir(tmp): the entries of the new directory (its data files and index) are durable,
///     so after the rename below nobody can see the name with missing files.
///  2a. `final_name` absent (the normal case): rename(tmp, final). A crash before it leaves only
///      the temporary, which RemoveStaleTemporaries deletes at the next start; a crash after it
///      leaves the complete new checkpoint (or, before step 3, possibly the temporary again).
///  2b. `final_name` present (a re-save of the same step after a resume): exchange(tmp, final)
///      swaps the two names in one atomic step, so `final_name` is never missing. The old copy
///      is now at the temporary name.
///  2c. exchange unsupported (ENOSYS, EINVAL, EOPNOTSUPP: old kernel, or a file system without
///      RENAME_EXCHANGE): rename(final, TempDirName(final)), then rename(tmp, final). Between the
///      two renames `final_name` is missing; a crash there leaves two temporaries (deleted at the
///      next start) and a state file naming a missing directory, which Recover drops and
///      LatestCheckpoint reports as NotFound. Earlier checkpoints are untouched. If the second
///      rename fails the old copy is renamed back.
///  3. sync_dir(parent): the new name is durable. Only then is the old copy (2b, 2c) removed:
///     removing its files before the swap is durable could, after a crash, leave `final_name`
///     pointing at the old directory with its files already gone.
///  4. remove_tree(old copy). A failure here is logged, not returned: the new checkpoint is
///     committed, and the leftover is a temporary that RemoveStaleTemporaries deletes later.
///
/// InvalidArgument for a bad name; otherwise the first failing step's error (with the paths).
Status CommitDirectory(io::FileSystem& fs, const std::string& parent, const std::string& tmp_name,
                       const std::string& final_name);

/// Keeps the state file and the retained checkpoints of one (checkpoint_dir, basename, state
/// file) with TensorFlow Saver's retention rules, and defers deleting a checkpoint that is in use.
///
/// Retention (RecordCommitted): a re-committed name moves to the end; while more than
/// max_to_keep (> 0) are listed, the oldest is dropped from the list and, unless it is due for
/// keep_checkpoint_every_n_hours preservation, its directory is deleted. Preservation: a dropped
/// checkpoint whose timestamp >= next_preserve_time stays on disk unlisted; next_preserve_time
/// starts at clock() at construction + hours * 3600 and advances by hours * 3600 each time.
/// max_to_keep <= 0 keeps everything; keep_checkpoint_every_n_hours <= 0 preserves nothing.
///
/// Durability order: the state file is rewritten before anything is deleted, so a crash never
/// leaves it naming a deleted checkpoint.
///
/// Thread-safe: every method takes an internal mutex. Deletions run under it, so Pin may wait
/// for a retention deletion in progress (and then the caller finds the directory gone rather
/// than half deleted). The file system must outlive the manager.
class CheckpointManager {
 public:
  /// `fs` is not owned. `clock` is read here only, when keep_checkpoint_every_n_hours is set.
  /// No I/O happens until a method is called.
  CheckpointManager(io::FileSystem* fs, std::string checkpoint_dir, std::string basename,
                    int max_to_keep, double keep_checkpoint_every_n_hours, Clock clock,
                    std::string state_file_name = kCheckpointStateFileName);

  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  /// Loads the state file, if any, as the retained list (TensorFlow Saver's
  /// recover_last_checkpoints), keeping its last_preserved_timestamp. Entries whose directory
  /// is missing are dropped, and only then is the state file rewritten. No state file: an empty
  /// list, OK. A corrupt state file is Corruption and nothing changes, in memory or on disk.
  /// Meant for start-up, before the first RecordCommitted.
  Status Recover();

  /// Removes every "<basename>-<digits>.tmp-<hex>" entry (a checkpoint left half written, or an
  /// old copy left by CommitDirectory) and every "<state_file_name>.tmp-<hex>" file in the
  /// checkpoint directory; returns the removed names, sorted. Touches nothing else. Tries every
  /// candidate and returns the first failure, if any. Only for start-up: it would delete the
  /// temporary directory of a save in progress.
  Result<std::vector<std::string>> RemoveStaleTemporaries();

  /// Records that checkpoint `name` was committed at `timestamp` (seconds since the epoch),
  /// rewrites the state file, then deletes what retention dropped (pinned ones when unpinned).
  /// InvalidArgument for a bad name. When the state file cannot be written the in-memory list
  /// is updated anyway, nothing is deleted, and the next successful write catches up. Deletion
  /// failures are returned (the state file is already right; the name is not retried).
  Status RecordCommitted(const std::string& name, double timestamp);

  /// Protects checkpoint `name` from deletion until a matching Unpin (counted).
  void Pin(const std::string& name);

  /// Releases one Pin; the last release deletes the checkpoint if retention dropped it
  /// meanwhile (a failure is logged). An Unpin without a Pin is logged and ignored.
  void Unpin(const std::string& name);

  /// A copy of the state as last recorded (what the state file holds after a successful write).
  CheckpointState state() const;

  /// The retained checkpoint names, oldest first.
  std::vector<std::string> retained() const;

  /// The checkpoint directory.
  const std::string& checkpoint_dir() const { return dir_; }

 private:
  struct Entry {
    std::string name;
    double timestamp = 0;
  };

  CheckpointState StateLocked() const;
  // Drops the oldest entries beyond max_to_keep; returns those to delete.
  std::vector<std::string> ApplyRetentionLocked();
  // Deletes (or defers, when pinned) every name in unwritten_deletions_; first failure returned.
  Status DeleteDroppedLocked();
  Status DeleteCheckpointLocked(const std::string& name);
  bool IsStaleTemporary(const std::string& name) const;

  io::FileSystem* const fs_;
  const std::string dir_;
  const std::string basename_;
  const int max_to_keep_;
  const double keep_every_n_hours_;
  const std::string state_file_name_;

  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // oldest first
  double last_preserved_timestamp_ = 0;
  double next_preserve_time_ = 0;
  std::map<std::string, int> pins_;
  // Dropped by retention, but the state file on disk may still name them: not deleted yet.
  std::vector<std::string> unwritten_deletions_;
  // Dropped and no longer named by the state file, but pinned: deleted by the last Unpin.
  std::set<std::string> deferred_deletions_;
};

}  // namespace asyncckpt
