#pragma once

// The `checkpoint` state file, the atomic commit of a checkpoint directory, and retention.
//
// Internal to the library: the public face is include/asyncckpt/state.h. Every file access goes
// through an io::FileSystem so that tests can put faults in its way.
//
// Names are data, never paths: a checkpoint name ("model.ckpt-1000") is a single entry of the
// checkpoint directory. A name that is empty, contains '/', contains "..", or holds a byte that
// would need quoting in the text form ('"', '\\', control bytes) is refused everywhere.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
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

/// "a FIFO", "a directory", "missing", ...: what an entry is, for messages such as
/// "<path> is a FIFO, not a regular file".
std::string DescribeEntryType(io::EntryType type);

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
/// intact (the temporary is removed when possible; CheckpointManager::Start removes what a
/// crash leaves). InvalidArgument when the state fails ValidateCheckpointState.
Status WriteCheckpointState(io::FileSystem& fs, const std::string& dir,
                            const CheckpointState& state,
                            const std::string& state_file_name = kCheckpointStateFileName);

/// "<final_name>.tmp-<16 random hex digits>": where a checkpoint is written before its commit.
std::string TempDirName(const std::string& final_name);

/// "<name>.deleting-<16 random hex digits>": where a checkpoint directory is moved, out of the
/// committed namespace, before its files are removed.
std::string DeletingDirName(const std::string& name);

/// The step of `name` when it is exactly "<basename>-<step>" as format::CheckpointDirName
/// writes it (decimal digits, no sign, no leading zero, fits int64); nullopt otherwise.
std::optional<int64_t> CheckpointStep(std::string_view name, std::string_view basename);

/// Removes the directory `parent`/`name` so that a crash never leaves it half deleted under
/// `name`: renames it to DeletingDirName(name) (atomic), syncs `parent` (the new name is
/// durable), and only then removes the renamed tree. A crash at any point leaves `name` whole,
/// or a ".deleting-" directory that CheckpointManager::Start removes. The caller has checked
/// that `name` is a real directory it may delete. A failure to rename or sync leaves `name`
/// whole; a failure of the removal leaves the ".deleting-" name. Returns the first failure.
Status RemoveDirectoryDurably(io::FileSystem& fs, const std::string& parent,
                              const std::string& name);

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
///      the temporary, which CheckpointManager::Start deletes at the next start; a crash after
///      it leaves the complete new checkpoint (or, before step 3, possibly the temporary again).
///  2b. `final_name` present (a re-save of the same step after a resume): exchange(tmp, final)
///      swaps the two names in one atomic step, so `final_name` is never missing. The old copy
///      is now at the temporary name; it is renamed on to DeletingDirName(final) (a failure of
///      that rename leaves it at the temporary name, just as disposable).
///  2c. exchange unsupported (ENOSYS, EINVAL, EOPNOTSUPP: old kernel, or a file system without
///      RENAME_EXCHANGE): rename(final, DeletingDirName(final)), then rename(tmp, final).
///      Between the two renames `final_name` is missing; a crash there leaves a ".deleting-" and
///      a ".tmp-" directory (both deleted at the next start) and a state file naming a missing
///      directory, which CheckpointManager::Start drops and LatestCheckpoint reports as NotFound.
///      Earlier checkpoints are untouched. If the second rename fails the old copy is renamed
///      back.
///  3. sync_dir(parent): the new name is durable, and so is the old copy's ".deleting-" name.
///     Only then is the old copy (2b, 2c) removed: removing its files before the swap is durable
///     could, after a crash, leave `final_name` pointing at the old directory with its files
///     already gone.
///  4. remove_tree(old copy). A failure here is logged, not returned: the new checkpoint is
///     committed, and the leftover is out of the committed namespace; start-up deletes it.
///
/// InvalidArgument for a bad name; otherwise the first failing step's error (with the paths).
Status CommitDirectory(io::FileSystem& fs, const std::string& parent, const std::string& tmp_name,
                       const std::string& final_name);

/// What a complete checkpoint says about itself.
struct ValidCheckpoint {
  /// Its commit time (seconds since the epoch), from its metadata.
  double wall_time = 0;
};

/// Decides whether the directory at `checkpoint_path` is a complete checkpoint. OK with what it
/// holds; NotFound or Corruption when it is incomplete or damaged (start-up may remove it); any
/// other code when it cannot tell (an I/O error, another format version): such a directory is
/// never removed. Called with the manager's lock held, from the thread calling the manager.
using CheckpointValidator =
    std::function<Result<ValidCheckpoint>(const std::string& checkpoint_path)>;

/// The validator a manager uses when given none: complete when the directory holds a regular
/// file named "index" (wall time 0). The savers inject one that decodes the index and checks
/// every chunk against its data files (src/saver/saver_common.h).
Result<ValidCheckpoint> IndexFileExists(io::FileSystem& fs, const std::string& checkpoint_path);

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
  /// Decides what is complete (Start, CommittedSteps); null: IndexFileExists.
  CheckpointValidator validator = nullptr;
  /// Retention never deletes a checkpoint of a pair with the partner's (see CheckpointManager).
  CheckpointPartner partner = {};
};

/// What CheckpointManager::Start found and did. Every item was also logged.
struct StartupReport {
  /// Entries removed: temporaries, ".deleting-" leftovers, and "<basename>-<step>" directories
  /// that were incomplete or older than the retained window. Sorted.
  std::vector<std::string> removed;
  /// Complete but unlisted checkpoints listed again (e.g. a commit whose state-file update
  /// failed). In step order.
  std::vector<std::string> relisted;
  /// Names the state file listed that are no longer listed: missing, incomplete, not a
  /// directory, or not of the form "<basename>-<step>" (those are never touched on disk).
  std::vector<std::string> dropped;
  /// Complete unlisted checkpoints older than the window, left on disk because
  /// keep_checkpoint_every_n_hours may have preserved them.
  std::vector<std::string> kept_unlisted;
  /// Empty when the state file was usable; else why the list was rebuilt from the directory.
  std::string rebuilt_because;
  /// What could not be done (a removal, the state file's rewrite); retried at the next start.
  std::vector<std::string> failures;
};

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
/// partner (below); the others are dropped from the list oldest first and, unless due for
/// keep_checkpoint_every_n_hours preservation, deleted. Preservation: a dropped checkpoint whose
/// timestamp >= next_preserve_time stays on disk unlisted; next_preserve_time starts at clock()
/// at construction + hours * 3600 and advances by hours * 3600 each time. max_to_keep <= 0
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
  /// delete the temporary directory of a save in progress). In order:
  ///  1. removes every "<basename>-<digits>.tmp-<hex>" and "<basename>-<digits>.deleting-<hex>"
  ///     directory and every "<state_file_name>.tmp-<hex>" file (half-written saves, old copies,
  ///     interrupted deletions);
  ///  2. loads the state file (TensorFlow Saver's recover_last_checkpoints), keeping its
  ///     last_preserved_timestamp, and drops each listed name that is not a "<basename>-<step>"
  ///     directory or whose checkpoint is incomplete (the validator says so);
  ///  3. for each unlisted "<basename>-<step>" directory: incomplete -> removed; complete and in
  ///     the retained window (newer than the oldest listed checkpoint, or while fewer than
  ///     max_to_keep are listed, newest first, or protected by the partner) -> listed again,
  ///     with the timestamp of its metadata; complete and older -> removed, or left on disk when
  ///     keep_checkpoint_every_n_hours > 0 (preserved checkpoints are kept unlisted, as
  ///     TensorFlow does);
  ///  4. rewrites the state file when the list changed, then removes what step 2 dropped as
  ///     incomplete (not when the rewrite failed: the old state file still names it).
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
  Status RecordCommitted(const std::string& name, double timestamp);

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
  };

  CheckpointState StateLocked() const;
  // The partner's steps from its state file; on a read failure, the last ones read.
  std::set<int64_t> PartnerStepsLocked();
  // Drops what retention drops; returns those to delete.
  std::vector<std::string> ApplyRetentionLocked(const std::set<int64_t>& partner_steps);
  // Deletes (or defers, when pinned) every name in unwritten_deletions_.
  void DeleteDroppedLocked();
  // Deletes one dropped checkpoint if it is ours to delete; a failure is logged and counted.
  void DeleteCheckpointLocked(const std::string& name);

  io::FileSystem* const fs_;
  const std::string dir_;
  const std::string basename_;
  const int max_to_keep_;
  const double keep_every_n_hours_;
  const std::string state_file_name_;
  const CheckpointValidator validator_;
  const CheckpointPartner partner_;

  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // oldest first
  double last_preserved_timestamp_ = 0;
  double next_preserve_time_ = 0;
  std::map<std::string, int> pins_;
  // Dropped by retention, but the state file on disk may still name them: not deleted yet.
  std::vector<std::string> unwritten_deletions_;
  // Dropped and no longer named by the state file, but pinned: deleted by the last Unpin.
  std::set<std::string> deferred_deletions_;
  std::set<int64_t> partner_steps_;             // at the last good read of the partner's state file
  std::atomic<int64_t> retention_failures_{0};  // read without mu_: a deletion may hold it long
};

/// The steps of the committed checkpoints "<basename>-<step>" in `dir`, ascending (the engine
/// of CommittedCheckpointSteps, with an injected validator). From the state file when it is
/// healthy: it parses and names at least one checkpoint of `basename`, and each one it names is
/// a real directory that `validator` finds complete (names of other forms are ignored).
/// Otherwise from the directory: every "<basename>-<step>" real directory that `validator`
/// finds complete; a scan that finds any is logged with what was wrong with the state file.
/// A missing `dir` has none. IOError when `dir` cannot be listed, the state file exists but
/// cannot be read, or a named checkpoint cannot be validated.
Result<std::vector<int64_t>> ListCommittedSteps(io::FileSystem& fs, const std::string& dir,
                                                const std::string& basename,
                                                const std::string& state_file_name,
                                                const CheckpointValidator& validator);

}  // namespace asyncckpt
