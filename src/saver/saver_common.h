#pragma once

// The savers' building blocks below the saver core: option checks, the save schedule
// (TensorFlow CheckpointSaverHook's rules), the start-up of a checkpoint directory (lock,
// clean-up, multi-process agreement), and the engine options a saver's options give.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "asyncckpt/coordinator.h"
#include "asyncckpt/file_system.h"
#include "asyncckpt/saver_options.h"
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
  /// True when a save is due after the step that made global step `step`, by this process's
  /// clock.
  bool due(int64_t step) const { return timer_.should_trigger_for_step(step); }
  /// Whether a save is due after `step` in every process of the job: due(step) in a single
  /// process, or with save_steps (every rank counts the same steps); under save_secs in a
  /// multi-process job, rank 0's due(step), broadcast (a collective: every rank calls it after
  /// every step, in step order), so that a rank with a skewed clock saves the same steps.
  Result<bool> due_everywhere(int64_t step);
  /// Records a save's attempt at `step`, saved or skipped: the next one is due N steps or
  /// seconds later.
  void mark(int64_t step) { (void)timer_.update_last_triggered_step(step); }
  /// Records that the state of `step` was saved (a skipped save's was not).
  void mark_saved(int64_t step) { last_saved_step_ = step; }
  /// True when the end of the session must still save `step`: its state was not saved.
  bool final_save_needed(int64_t step) const { return last_saved_step_ != step; }

 private:
  SaveSchedule(SecondOrStepTimer timer, Coordinator* agree_with)
      : timer_(std::move(timer)), agree_with_(agree_with) {}
  SecondOrStepTimer timer_;
  Coordinator* agree_with_;  // the job's coordinator when the decision must be agreed, or null
  std::optional<int64_t> last_saved_step_;
};

/// "<state_file_name>.lock": the file in checkpoint_dir whose lock makes a saver the one writer
/// of that state file (and so of every basename it lists). Never of a checkpoint's form
/// ("<basename>-<step>") nor a temporary's.
std::string DirectoryLockFileName(const std::string& state_file_name);

/// The file system, directory lock and retention manager of a saver, ready after Start().
struct SaverStorage {
  /// options.file_system, or the default backend the options choose (then owned here).
  io::FileSystem* fs = nullptr;
  /// The default backend when options.file_system is null.
  std::unique_ptr<io::FileSystem> owned_fs;
  /// State file and retention.
  std::unique_ptr<CheckpointManager> manager;
  /// The lock on DirectoryLockFileName(state file), held from Start() until ReleaseLock() or
  /// destruction; declared last so that it goes first, before the file system it came from.
  std::unique_ptr<io::FileLock> lock;

  /// Creates checkpoint_dir and locks its state file `state_file_name` before touching
  /// anything else there: while another saver (of any process and basename, this one
  /// included) holds that lock, fails with FailedPrecondition naming the lock file and its
  /// holder's PID and host, and leaves the directory as it was. Then creates a manager
  /// validating with ValidateCheckpointDirectory and runs its start-up recovery and garbage
  /// collection (CheckpointManager::Start). Pairs retention with `partner`, or, when that is
  /// empty, with options.paired_input_basename's input checkpoints. FailedPrecondition naming
  /// them when quarantined checkpoints of options.basename are on disk and no good one is
  /// listed, unless options.allow_fresh_start. Returns the names removed (each logged); what
  /// start-up could not do is logged, not returned. On failure the lock is released again. A
  /// second Start() keeps the lock it holds.
  Result<std::vector<std::string>> Start(
      const SaverOptions& options, const std::string& state_file_name = kCheckpointStateFileName,
      const CheckpointPartner& partner = {});
  /// For a rank other than 0 of a multi-process job, after rank 0's Start(): opens the file
  /// system and creates a manager (for the engine) without locking the directory or touching
  /// anything in it, which rank 0 alone does. FailedPrecondition when checkpoint_dir is not a
  /// directory here (the ranks do not share it).
  Status Attach(const SaverOptions& options,
                const std::string& state_file_name = kCheckpointStateFileName,
                const CheckpointPartner& partner = {});
  /// Lets another saver take the directory (the hooks call it once their last save is
  /// durable, in end()).
  void ReleaseLock() { lock.reset(); }

 private:
  void OpenFileSystem(const SaverOptions& options);
  void MakeManager(const SaverOptions& options, const std::string& state_file_name,
                   const CheckpointPartner& partner);
};

/// What a saver's begin() hands its engine.
struct SaverStart {
  /// Entries rank 0 (or the single process) removed from checkpoint_dir at the start.
  std::vector<std::string> removed;
  /// The job's token (multi-process jobs; empty otherwise).
  std::string job_token;
  /// Multi-process jobs: the tensors and boxes this rank writes (replicas held by a lower rank
  /// left out). Null in a single process: the engine takes the hook's registry.
  std::unique_ptr<TensorRegistry> written;
};

/// A saver's start. One process: storage->Start(options) (lock, clean-up). A multi-process job
/// (options.coordinator of size > 1; collective): rank 0 runs storage->Start while the others
/// wait, then every rank learns the job token, rank != 0 attaches to the directory
/// (storage->Attach), and the ranks agree on who writes what (AgreeOnWriters). Every rank
/// returns the same error when one rank could not start, naming it.
Result<SaverStart> StartSaver(const SaverOptions& options, const TensorRegistry& registry,
                              SaverStorage* storage);

/// Collective in a multi-process job (a no-op otherwise): OK on every rank when `local` is OK
/// on every rank, else on every rank the error of the lowest failing rank, naming it. The hooks
/// call it after creating their engine, so that no rank trains on alone.
Status AgreeStarted(const SaverOptions& options, const Status& local);

/// The engine options a saver's options give (the fields both have, same meaning); with a
/// coordinator, sharding names this rank, the job's size, `job_token` (agreed at begin) and
/// coordination_timeout_secs.
EngineOptions EngineOptionsFor(const SaverOptions& saver, std::string job_token = {});

/// The state file of input pipeline checkpoints named `basename`: "checkpoint_" + the basename
/// without ".ckpt" ("checkpoint_input" for "input.ckpt"; TensorFlow's latest_filename).
std::string InputStateFileForBasename(const std::string& basename);

}  // namespace asyncckpt
