#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "asyncckpt/reader.h"
#include "asyncckpt/saver_options.h"
#include "asyncckpt/saver_types.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"

namespace asyncckpt {

/// Saves on demand, for a training loop that is not built from hooks (a Python loop, a
/// hand-written C++ loop): the loop calls save() or maybe_save() at its own steps and hands over
/// the tensors to save each time, so the set of tensors may change between saves (an optimizer
/// whose state appears after its first step). Same options, checkpoint layout, retention and
/// state file as the saver hooks; the asynchronous mode runs the same engine as
/// AsyncCheckpointSaverHook, the synchronous mode the same writer as CheckpointSaverHook.
///
/// Failures. Bad input (a tensor the format cannot hold, metadata too large, a call after
/// close()) is returned by the call that got it, and nothing is written. A save that fails while
/// writing (I/O, commit) is recorded in totals() and then, with OnError::kStop, returned by the
/// save that failed (synchronous) or by the next save / maybe_save / wait_until_finished / close
/// (asynchronous), and by every such call after it: the checkpointer saves nothing more. With
/// OnError::kContinue it is logged and counted, and the calls go on returning OK.
///
/// Threads: save, maybe_save, due, wait_until_finished, close and open are called from one
/// thread at a time (the training thread); totals, all_steps, latest_step and checkpoint_path
/// from any thread.
///
/// Several processes (options.coordinator of size > 1): every rank makes a Checkpointer over the
/// same shared checkpoint_dir and calls save(step, its registry) for the same steps in the same
/// order, as it would a collective; prepare() too. Each rank registers what it holds (whole
/// tensors are replicas, written once; shards carry global_shape and global_offset), which may
/// change from save to save: the ranks agree on who writes what at every save (one all_gather
/// on the calling thread), start at the first save or prepare (rank 0 locks and cleans up), and
/// each save is one sharded checkpoint that rank 0 commits once every rank's part is durable,
/// all or nothing (docs/distributed.md). A failure one rank keeps (OnError::kStop) fails the
/// next save on every rank, naming it. Rank 0 writes the state file; the others read it.
/// wait_until_finished() and close() are collective too: every rank returns once rank 0 has
/// committed and listed every save, with the same status.
/// When a Checkpointer takes checkpoint_dir: locks it, cleans up and quarantines (the start of
/// SaverStorage::Start).
enum class CheckpointerStart {
  /// In Create().
  kAtCreate,
  /// At the first save or maybe_save; until then the checkpointer only reads the directory
  /// (the Python manager: constructing one changes nothing on disk).
  kAtFirstSave,
};

class Checkpointer {
 public:
  /// Validates the options (InvalidArgument naming the field) and refuses a basename that another
  /// state file of checkpoint_dir lists (FailedPrecondition naming both, CheckBasenameUnclaimed;
  /// read-only); then, at `start`, creates
  /// checkpoint_dir, locks it, removes temporaries of interrupted saves, quarantines damaged
  /// checkpoints, and recovers the retained list from the state file (a refusal, such as
  /// another writer's lock or quarantined checkpoints without allow_fresh_start, is returned
  /// there). `mode` says whether a save returns once staged (the default) or once committed.
  static Result<std::unique_ptr<Checkpointer>> Create(
      SaverOptions options, SaveMode mode = SaveMode::kAsynchronous,
      CheckpointerStart start = CheckpointerStart::kAtCreate);
  /// Waits for the saves in flight; their failures are dropped (close() reports them).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  /// True when options.save_steps / save_secs make a save due at `step` (SecondOrStepTimer's
  /// rules: the first step seen is due, no step twice, then every N steps or seconds after the
  /// last save).
  bool due(int64_t step) const;

  /// Saves the tensors of `registry` as checkpoint `step` now, with `user_metadata` added to
  /// options.user_metadata (a per-save value wins). Returns once the tensors' buffers may change
  /// again: asynchronous, after the snapshot copy into staging (the write goes on in the
  /// background); synchronous, once the checkpoint is committed. The registry is read only
  /// during the call. A save whose snapshot is larger than staging_bytes = 0 sized for (a state
  /// that grew) first waits for the saves in flight and re-sizes staging. Never skipped for a
  /// busy staging (on_busy applies to maybe_save).
  Status save(int64_t step, const TensorRegistry& registry,
              const std::map<std::string, std::string>& user_metadata = {});

  /// Creates the engine and its staging for a state like `registry`, so that the first save
  /// pays for no allocation (SaverTotals::startup_seconds counts it). One process: returns once
  /// the plan is made (bad input is returned here) and creates the engine on a thread of its
  /// own, which save, wait_until_finished, close and the next prepare await (a failure there is
  /// logged, and the save creates the engine itself). `reserve_bytes`: the
  /// staging to reserve, for a state that will grow (an optimizer's moments appear after its
  /// first step); 0 sizes it for `registry` (or options.staging_bytes when set). The registry
  /// is not read beyond its sizes and devices. FailedPrecondition after close().
  Status prepare(const TensorRegistry& registry, uint64_t reserve_bytes = 0);

  /// prepare() for a state the size of the latest checkpoint's, as a resume will save: staging
  /// is sized from its index (no registry needed) and made on a thread of its own. One process
  /// only (FailedPrecondition otherwise, and after close()). Starts the checkpointer (takes the
  /// directory's lock). False, and nothing prepared, when there is no checkpoint yet. A first save
  /// of a larger state waits for the saves in flight and re-sizes staging, as save() does.
  Result<bool> prepare_like_latest();

  /// Saves as save() does when due(step); true when a save was taken. With OnBusy::kSkip an
  /// asynchronous save is skipped (false, counted in totals().saves_skipped) while staging is
  /// still held by earlier saves; the next due step tries again.
  Result<bool> maybe_save(int64_t step, const TensorRegistry& registry,
                          const std::map<std::string, std::string>& user_metadata = {});

  /// Blocks until every save so far is committed (durable) or failed; with OnError::kStop, the
  /// first failure (see the class comment). Retention's removal of the checkpoints those saves
  /// dropped goes on in the background (close() waits for it).
  Status wait_until_finished();

  /// Blocks until `finished` saves in all have committed or failed (totals().saves_committed +
  /// saves_failed), or `timeout_seconds` passed (negative: no limit); true when they have. Saves
  /// finish in the order they were made, so the n-th save is done once n have finished. Any
  /// thread; reports no failure (wait_until_finished does).
  bool wait_for_finished_saves(int64_t finished, double timeout_seconds) const;

  /// wait_until_finished(), then refuses further saves (FailedPrecondition) and releases the
  /// directory lock, so that another checkpointer may take checkpoint_dir; all_steps(), open()
  /// and the other read-only calls keep working. Idempotent.
  Status close();

  /// Totals so far, every save's stats in step order.
  SaverTotals totals() const;

  /// Steps of the retained checkpoints in save order (the state file's order; committed saves
  /// only), so that the last is the latest: after a forced save of a lower step, that step.
  /// Before a deferred start: those a start would retain (FindResumeCheckpoints; none on error).
  std::vector<int64_t> all_steps() const;
  /// The damaged checkpoints of this basename in checkpoint_dir, quarantined or about to be,
  /// one line each ("<path>: what is wrong"); read-only (FindDamagedCheckpoints). For a caller
  /// that finds no step to restore, so that it does not start afresh beside them.
  Result<std::vector<std::string>> damaged() const;
  /// The step of the last successful save, as the state file records it (the last of
  /// all_steps()): what a resume restores; nullopt when there is none.
  std::optional<int64_t> latest_step() const;
  /// Quarantines checkpoint `step`, which a restore found damaged (a chunk failing its checksum;
  /// `why` says what), as start-up quarantines one (QuarantineFoundDamage): it leaves
  /// all_steps(), so latest_step() is then the newest good one. Before a deferred start the
  /// directory's lock is taken for the moment; FailedPrecondition when another job holds it
  /// (then nothing is changed).
  Status quarantine(int64_t step, const std::string& why);
  /// The directory of checkpoint `step` ("<checkpoint_dir>/<basename>-<step>").
  std::string checkpoint_path(int64_t step) const;

  /// Opens checkpoint `step` (the latest when nullopt) for reading, through the options' file
  /// system. The checkpoint is protected from retention until the reader is destroyed, so the
  /// reader must not outlive the checkpointer. NotFound when there is no such checkpoint.
  Result<std::unique_ptr<CheckpointReader>> open(std::optional<int64_t> step = std::nullopt);

  /// Internal state (defined in the source file).
  class Impl;

 private:
  explicit Checkpointer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace asyncckpt
