#pragma once

// What the synchronous and the asynchronous saver hooks share: option checks, the save
// schedule (TensorFlow CheckpointSaverHook's rules), and the start-up of a checkpoint directory.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/timer.h"
#include "src/engine/engine.h"
#include "src/state/checkpoint_state.h"
#include "src/util/elapsed.h"

namespace asyncckpt {

/// When to save: at the session's start, whenever the step/second timer fires after a step, and
/// at the end when the last step was not saved.
class SaveSchedule {
 public:
  /// Built from validated options.
  static Result<SaveSchedule> Create(const SaverOptions& options);
  /// True when a save is due after the step that made global step `step`.
  bool due(int64_t step) const { return timer_.should_trigger_for_step(step); }
  /// Records a save's attempt at `step`, saved or skipped: the next one is due N steps or
  /// seconds later.
  void mark(int64_t step) { (void)timer_.update_last_triggered_step(step); }
  /// Records that the state of `step` was saved (a skipped save's was not).
  void mark_saved(int64_t step) { last_saved_step_ = step; }
  /// True when the end of the session must still save `step`: its state was not saved.
  bool final_save_needed(int64_t step) const { return last_saved_step_ != step; }

 private:
  explicit SaveSchedule(SecondOrStepTimer timer) : timer_(std::move(timer)) {}
  SecondOrStepTimer timer_;
  std::optional<int64_t> last_saved_step_;
};

/// "<basename>.lock": the file in checkpoint_dir whose lock makes a saver the one writer of
/// `basename` there. Never of a checkpoint's form ("<basename>-<step>") nor a temporary's.
std::string DirectoryLockFileName(const std::string& basename);

/// The file system, directory lock and retention manager of a saver, ready after Start().
struct SaverStorage {
  /// options.file_system, or the default backend the options choose (then owned here).
  io::FileSystem* fs = nullptr;
  /// The default backend when options.file_system is null.
  std::unique_ptr<io::FileSystem> owned_fs;
  /// State file and retention.
  std::unique_ptr<CheckpointManager> manager;
  /// The lock on DirectoryLockFileName(basename), held from Start() until ReleaseLock() or
  /// destruction; declared last so that it goes first, before the file system it came from.
  std::unique_ptr<io::FileLock> lock;

  /// Creates checkpoint_dir and locks it for options.basename before touching anything else
  /// there: while another saver (of any process, this one included) holds that lock, fails
  /// with FailedPrecondition naming the lock file and its holder's PID and host, and leaves
  /// the directory as it was. Then creates a manager validating with
  /// ValidateCheckpointDirectory and runs its start-up recovery and garbage collection
  /// (CheckpointManager::Start) on the state file named `state_file_name`. Pairs retention
  /// with `partner`, or, when that is empty, with options.paired_input_basename's input
  /// checkpoints. Returns the names removed (each logged); what start-up could not do is
  /// logged, not returned. On failure the lock is released again. A second Start() keeps the
  /// lock it holds.
  Result<std::vector<std::string>> Start(
      const SaverOptions& options, const std::string& state_file_name = kCheckpointStateFileName,
      const CheckpointPartner& partner = {});
  /// Lets another saver take the directory (the hooks call it once their last save is
  /// durable, in end()).
  void ReleaseLock() { lock.reset(); }
};

/// The engine options a saver's options give (the fields both have, same meaning).
EngineOptions EngineOptionsFor(const SaverOptions& saver);

/// The savers' CheckpointValidator: OK (with the metadata's wall time) when `checkpoint_path`
/// holds a regular "index" file of at most format::kMaxIndexBytes that decodes, and every chunk
/// it names lies inside its data files (their sizes, not their bytes, are checked).
/// NotFound or Corruption when it does not; FailedPrecondition for an intact index of another
/// format version; IOError when a file cannot be read; ResourceExhausted when the index cannot
/// be held in memory. Never opens anything but the index, never follows a symlinked index.
Result<ValidCheckpoint> ValidateCheckpointDirectory(io::FileSystem& fs,
                                                    const std::string& checkpoint_path);

/// The state file of input pipeline checkpoints named `basename`: "checkpoint_" + the basename
/// without ".ckpt" ("checkpoint_input" for "input.ckpt"; TensorFlow's latest_filename).
std::string InputStateFileForBasename(const std::string& basename);

/// Tells every listener about a finished save; true when one of them asks to stop.
bool NotifyAfterSave(const std::vector<CheckpointSaverListener*>& listeners, int64_t step,
                     const SaveStats& stats);

/// Adds one finished save to the running totals and to the window of recent saves, dropping the
/// oldest save beyond kSaverTotalsWindow.
void AddToTotals(const SaveStats& stats, SaverTotals* totals);

}  // namespace asyncckpt
