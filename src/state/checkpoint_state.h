#pragma once

// CheckpointManager: keeps the `checkpoint` state file and the retained checkpoints of one saver
// (TensorFlow Saver's retention rules, pins, crash-safe deletion), and cleans up at start-up.
// It ties together the pieces of src/state, whose headers it includes for its callers:
// checkpoint_names.h (names and paths), state_file.h (the state file), durable_directory.h
// (CommitDirectory, RemoveDirectoryDurably) and checkpoint_validator.h (what is complete).
//
// Internal to the library: the public face is include/asyncckpt/state.h. Every file access goes
// through an io::FileSystem so that tests can put faults in its way.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"
#include "asyncckpt/status.h"
#include "asyncckpt/timer.h"
#include "src/state/checkpoint_names.h"
#include "src/state/checkpoint_validator.h"
#include "src/state/durable_directory.h"
#include "src/state/state_file.h"

namespace asyncckpt {

/// Another saver's checkpoints in the same directory that retention keeps in step with this
/// one's: the model's and the input pipeline's checkpoints of one job.
struct CheckpointPartner {
  /// Its checkpoints are "<basename>-<step>"; empty: no partner.
  std::string basename;
  /// Its state file, in the same checkpoint directory.
  std::string state_file_name;
};

/// How a CheckpointManager keeps one (checkpoint_dir, basename, state file).
struct CheckpointManagerOptions {
  /// Holds the checkpoints and the state file.
  std::string checkpoint_dir;
  /// The manager's checkpoints are exactly "<basename>-<step>" (format::CheckpointDirName).
  std::string basename;
  /// The state file's name in checkpoint_dir.
  std::string state_file_name = kCheckpointStateFileName;
  /// Newest checkpoints retained; <= 0 keeps everything.
  int max_to_keep = 5;
  /// Of those that fall out of max_to_keep, keep one every N hours on disk; <= 0 keeps none.
  double keep_checkpoint_every_n_hours = 0;
  /// A checkpoint whose step % keep_period == 0 is never dropped, and stays listed (Orbax's
  /// keep_period); <= 0 protects none.
  int keep_period = 0;
  /// What max_to_keep keeps: the newest (kNone), or the best by each checkpoint's score
  /// (RecordCommitted's, or its metadata's at start-up); unscored ones are then never dropped.
  BestMode best_mode = BestMode::kNone;
  /// Decides what is complete (Start, CommittedSteps); null: IndexFileExists.
  CheckpointValidator validator = nullptr;
  /// Retention never deletes a checkpoint of a pair with the partner's (see CheckpointManager).
  CheckpointPartner partner = {};
};

/// What CheckpointManager::Start found and did. Every item was also logged.
struct StartupReport {
  /// Entries removed: temporaries, ".deleting-" leftovers, and complete "<basename>-<step>"
  /// directories older than the retained window. Sorted.
  std::vector<std::string> removed;
  /// Complete but unlisted checkpoints listed again (e.g. a commit whose state-file update
  /// failed). In step order.
  std::vector<std::string> relisted;
  /// Names of this basename the state file listed that are no longer listed: missing, damaged
  /// (then quarantined), or not a directory (never touched on disk). Entries of other basenames
  /// are kept in the state file as they were.
  std::vector<std::string> dropped;
  /// Complete unlisted checkpoints older than the window, left on disk because
  /// keep_checkpoint_every_n_hours may have preserved them.
  std::vector<std::string> kept_unlisted;
  /// Quarantined checkpoints of this basename now in checkpoint_dir, by this start or an
  /// earlier one: "<basename>-<step>.corrupt-<hex>" directories. Sorted. Start logs a warning
  /// with their count and bytes.
  std::vector<std::string> quarantined;
  /// Bytes of the files in the quarantined directories.
  uint64_t quarantined_bytes = 0;
  /// Empty when the state file was usable; else why the list was rebuilt from the directory.
  std::string rebuilt_because;
  /// What could not be done (a removal, the state file's rewrite); retried at the next start.
  std::vector<std::string> failures;
};

/// Whether the retention pass of a RecordCommitted may drop the checkpoint it records.
enum class OwnDrop {
  /// Yes: under a best_mode a new checkpoint that ranks below max_to_keep others goes at once.
  kNow,
  /// Not before the next RecordCommitted: the other ranks of a sharded commit must still find it
  /// committed (sharded_commit.h); it stays listed until then.
  kAtNextCommit,
};

/// Quarantine for a process that holds the lock of `state_file_name` but runs no manager over it
/// (a restore before any save): drops `name` from the state file when it lists it, rewrites it,
/// then renames `dir`/`name` to QuarantineDirName(name) and logs an error naming `why`. The
/// caller holds the state file's lock. Returns the quarantined name, or the rename's error.
Result<std::string> QuarantineListedCheckpoint(io::FileSystem& fs, const std::string& dir,
                                               const std::string& state_file_name,
                                               const std::string& name, const std::string& why);

/// Keeps the state file and the retained checkpoints of one (checkpoint_dir, basename, state
/// file) with TensorFlow Saver's retention rules, defers deleting a checkpoint that is in use,
/// and cleans up at start-up after a crash. docs/durability.md describes the rules.
///
/// Ownership. The manager deletes only what this library wrote: a real directory (never a
/// symlink, which is not followed) named exactly "<basename>-<step>" in checkpoint_dir, and by
/// retention only one that holds an "index" file. Every deletion goes through
/// RemoveDirectoryDurably: the directory leaves the committed namespace atomically before any
/// of its files is removed, and each removal is logged.
///
/// Retention (RecordCommitted): a re-committed name moves to the end; when more than
/// max_to_keep (> 0) are listed, the newest max_to_keep stay, and so do those protected by the
/// partner (below) and those whose step is a multiple of keep_period (> 0); the others are
/// dropped from the list oldest first and, unless due for keep_checkpoint_every_n_hours
/// preservation, deleted. With a best_mode the max_to_keep that stay are instead those with the
/// best scores (kMax: highest, kMin: lowest; of equal scores the later listed ranks better, as
/// Orbax's stable sort), beside every unscored one, so the newest may be dropped at once (as
/// Orbax does). These are Orbax's rules: the count of listed checkpoints, keep_period's and
/// unscored ones included, is what max_to_keep is compared with. Preservation: a dropped checkpoint
/// whose timestamp >= next_preserve_time stays on disk unlisted; next_preserve_time starts at
/// clock() at construction + hours * 3600 and advances by hours * 3600 each time. max_to_keep <= 0
/// keeps everything; keep_checkpoint_every_n_hours <= 0 preserves nothing. A deletion that
/// fails is logged and counted (retention_failures), never returned: the save that triggered it
/// is committed.
///
/// Pairing. With a partner, each retention pass reads the partner's state file (missing: no
/// entries yet; unreadable or corrupt: the steps it held at the last good read) and also keeps
/// every listed checkpoint whose step is among the newest max_to_keep steps that both lists
/// hold: the newest complete pairs. When both sides save the same steps the list stays at
/// max_to_keep (+1 while the partner lags one save); when one side keeps failing the other keeps
/// its partners of the last good pairs, so at most 2 * max_to_keep. In one process the passes
/// of all paired managers (reading the partner's state file, writing one's own) are serialized,
/// so the newest complete pair is never deleted; managers in different processes are not (see
/// docs/durability.md for that window).
///
/// Durability order: the state file is rewritten before anything is deleted, so a crash never
/// leaves it naming a deleted checkpoint.
///
/// Thread-safe: every method takes an internal mutex. Deletions run under it, so Pin may wait
/// for a retention deletion in progress (and then the caller finds the directory gone rather
/// than half deleted). The file system must outlive the manager.
///
/// Defined in two files: startup_pass.cc (Start) and checkpoint_state.cc (everything else).
class CheckpointManager {
 public:
  /// `fs` is not owned. `clock` is read here only, when keep_checkpoint_every_n_hours is set.
  /// No I/O happens until a method is called.
  CheckpointManager(io::FileSystem* fs, CheckpointManagerOptions options, Clock clock);

  /// The same, unpaired, with the validator IndexFileExists.
  CheckpointManager(io::FileSystem* fs, std::string checkpoint_dir, std::string basename,
                    int max_to_keep, double keep_checkpoint_every_n_hours, Clock clock,
                    std::string state_file_name = kCheckpointStateFileName);

  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  /// Start-up recovery and garbage collection, before the first RecordCommitted (it would
  /// delete the temporary directory of a save in progress). First the refusals, which change
  /// nothing: FailedPrecondition when another state file of checkpoint_dir lists checkpoints of
  /// basename (CheckBasenameUnclaimed), or when a "<basename>-<step>" directory was written by a
  /// newer release (the validator's FailedPrecondition), naming each. Then, in order:
  ///  1. removes every "<basename>-<digits>.tmp-<hex>" and "<basename>-<digits>.deleting-<hex>"
  ///     directory and every "<state_file_name>.tmp-<hex>" file (half-written saves, old copies,
  ///     interrupted deletions);
  ///  2. loads the state file (TensorFlow Saver's recover_last_checkpoints), keeping its
  ///     last_preserved_timestamp and the entries of other basenames (a state file may be
  ///     shared: they are written back untouched), and drops each "<basename>-<step>" name that
  ///     is not a directory or whose checkpoint is damaged (the validator says NotFound or
  ///     Corruption, or its metadata names another step);
  ///  3. for each unlisted "<basename>-<step>" directory: damaged -> quarantined (renamed to
  ///     QuarantineDirName, the directory synced, logged as an error; never removed by the
  ///     library); complete and in
  ///     the retained window (newer than the oldest listed checkpoint, or while fewer than
  ///     max_to_keep are listed, newest first, or protected by the partner or by keep_period,
  ///     or any under a best_mode, whose ranking the next save applies) -> listed again,
  ///     with the timestamp of its metadata; complete and older -> removed, or left on disk when
  ///     keep_checkpoint_every_n_hours > 0 (preserved checkpoints are kept unlisted, as
  ///     TensorFlow does);
  ///  4. rewrites the state file when the list changed, then quarantines what step 2 dropped
  ///     as damaged (a rename loses nothing, so also when the rewrite failed). Relisting is
  ///     logged. "<basename>-<step>.corrupt-<hex>" directories are reported, never touched, and
  ///     a warning names them with their count and bytes.
  /// A missing, empty or unparsable state file therefore yields the newest complete
  /// checkpoints on disk, logged loudly; a fresh directory yields an empty list, silently.
  /// Failures to remove or rewrite are logged and reported, not returned. An error only when
  /// checkpoint_dir cannot be listed or the state file exists but cannot be read (IOError).
  Result<StartupReport> Start();

  /// Records that checkpoint `name` ("<basename>-<step>") was committed at `timestamp` (seconds
  /// since the epoch), rewrites the state file, then deletes what retention dropped (pinned
  /// ones when unpinned). InvalidArgument for a name of another form. When the state file
  /// cannot be written that error is returned, the in-memory list is updated anyway, nothing is
  /// deleted, and the next successful write catches up. A deletion that fails is logged and
  /// counted in retention_failures(), and OK is returned: the checkpoint is committed.
  /// `score` ranks it under a best_mode (nullopt: unscored, never dropped); `own` says whether
  /// this pass may drop `name` itself.
  Status RecordCommitted(const std::string& name, double timestamp,
                         std::optional<double> score = std::nullopt, OwnDrop own = OwnDrop::kNow);
  /// RecordCommitted up to the crash-safe step of its deletions: each dropped checkpoint is
  /// renamed to its ".deleting-" name (durably) but its files stay until RemoveRenamed. Lets the
  /// engine report a save durable without waiting for the removal of an older one.
  Status RecordCommittedLeavingRemovals(const std::string& name, double timestamp,
                                        std::optional<double> score = std::nullopt,
                                        OwnDrop own = OwnDrop::kNow);
  /// Removes the trees that RecordCommittedLeavingRemovals renamed, outside the manager's lock
  /// (a commit may record meanwhile). A failure is logged and counted in retention_failures();
  /// the next Start removes what is left. True when there was anything to remove. `keep`, when
  /// given, is offered each renamed tree's path first; a tree it returns true for is its own
  /// (the engine's spare data files, src/engine/spare_files.h) and is not removed here.
  bool RemoveRenamed(const std::function<bool(const std::string& path)>& keep = {});
  /// Whether RecordCommittedLeavingRemovals left trees for RemoveRenamed.
  bool HasRenamed() const;
  /// Removes what RecordCommittedLeavingRemovals left (RemoveRenamed).
  ~CheckpointManager();

  /// Quarantines checkpoint `name`, found damaged after start-up (a chunk that fails its
  /// checksum at restore), as start-up quarantines one: drops it from the list, rewrites the
  /// state file, renames the directory to QuarantineDirName(name) (also when the rewrite failed:
  /// a rename loses nothing) and logs an error naming it and `why`. Returns the quarantined name;
  /// InvalidArgument for a name of another form; the rename's error when it failed (the name is
  /// then dropped from the list all the same, so that no resume picks it).
  Result<std::string> Quarantine(const std::string& name, const std::string& why);

  /// Protects checkpoint `name` from deletion until a matching Unpin (counted).
  void Pin(const std::string& name);

  /// Releases one Pin; the last release deletes the checkpoint if retention dropped it
  /// meanwhile (a failure is logged and counted). An Unpin without a Pin is logged and ignored.
  void Unpin(const std::string& name);

  /// A copy of the state as last recorded (what the state file holds after a successful write).
  CheckpointState state() const;

  /// The retained checkpoint names, oldest first.
  std::vector<std::string> retained() const;

  /// Checkpoints retention dropped but could not delete, so far (each was logged).
  int64_t retention_failures() const;

  /// The checkpoint directory.
  const std::string& checkpoint_dir() const { return dir_; }

 private:
  struct Entry {
    std::string name;
    double timestamp = 0;
    std::optional<double> score =
        std::nullopt;  // for best_mode_; from the checkpoint's metadata at start-up
  };

  CheckpointState StateLocked() const;
  // "step <N> (<dir>/<name>)" for a log line: retention is read in steps.
  std::string Describe(const std::string& name) const;
  // The partner's steps from its state file; on a read failure, the last ones read.
  std::set<int64_t> PartnerStepsLocked();
  // Drops what retention drops, never `kept_name` (empty: none); returns those to delete.
  std::vector<std::string> ApplyRetentionLocked(const std::set<int64_t>& partner_steps,
                                                const std::string& kept_name = {});
  // Which entries max_to_keep keeps (entries_ holds more than max_to_keep_): the newest, or
  // under a best mode the best scored and every unscored one.
  std::vector<bool> KeptByRankLocked() const;
  // Deletes (or defers, when pinned) every name in unwritten_deletions_; with `leave_removals`
  // only renames them, for RemoveRenamed.
  void DeleteDroppedLocked(bool leave_removals = false);
  // Deletes one dropped checkpoint if it is ours to delete; a failure is logged and counted.
  // With `leave_removals` the renamed tree is queued in renamed_ instead of removed.
  void DeleteCheckpointLocked(const std::string& name, bool leave_removals = false);

  io::FileSystem* const fs_;
  const std::string dir_;
  const std::string basename_;
  const int max_to_keep_;
  const double keep_every_n_hours_;
  const int keep_period_;
  const BestMode best_mode_;
  const std::string state_file_name_;
  const CheckpointValidator validator_;
  const CheckpointPartner partner_;

  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // oldest first
  std::vector<Entry> foreign_;  // other basenames' entries of a shared state file, kept as read
  double last_preserved_timestamp_ = 0;
  double next_preserve_time_ = 0;
  std::map<std::string, int> pins_;
  // Dropped by retention, but the state file on disk may still name them: not deleted yet.
  std::vector<std::string> unwritten_deletions_;
  // Dropped and no longer named by the state file, but pinned: deleted by the last Unpin.
  std::set<std::string> deferred_deletions_;
  // ".deleting-" paths renamed durably, their trees not removed yet (RemoveRenamed).
  // Checkpoints renamed out of the committed names, to remove: (name, path renamed to).
  std::vector<std::pair<std::string, std::string>> renamed_;
  std::set<int64_t> partner_steps_;             // at the last good read of the partner's state file
  std::atomic<int64_t> retention_failures_{0};  // read without mu_: a deletion may hold it long
};
}  // namespace asyncckpt
