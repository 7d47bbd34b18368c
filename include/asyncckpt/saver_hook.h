#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "asyncckpt/hooks.h"
#include "asyncckpt/saver_options.h"
#include "asyncckpt/saver_types.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"
#include "asyncckpt/timer.h"

namespace asyncckpt {

/// Saves the registry on the training thread (the baseline the asynchronous hook must beat):
/// at after_create_session, at each trigger, and at end() when the last step was not saved.
/// The registry and listeners are borrowed and must outlive the hook. A failed save fails the
/// session with its status; earlier checkpoints are untouched.
class CheckpointSaverHook : public SessionRunHook {
 public:
  /// Validates the options (InvalidArgument naming the problem).
  static Result<std::unique_ptr<CheckpointSaverHook>> Create(
      SaverOptions options, const TensorRegistry* registry,
      std::vector<CheckpointSaverListener*> listeners = {});
  ~CheckpointSaverHook() override;

  Status begin() override;
  Status after_create_session(int64_t global_step) override;
  Status after_run(RunContext& context, const RunValues& values) override;
  Status end(int64_t global_step) override;

  /// Asked by after_create_session(step) before its save: true keeps the committed checkpoint
  /// of `step` as it is and counts the step as saved. Unset: every start saves (TensorFlow's
  /// rule). For a session restored from that checkpoint onto another number of processes, whose
  /// re-save would replace the set of checkpoints a restore needs (docs/distributed.md).
  void set_keep_start_checkpoint(std::function<bool(int64_t)> keep);

  /// Totals so far.
  SaverTotals totals() const;

  /// Internal state (defined in the source file).
  class Impl;

 private:
  explicit CheckpointSaverHook(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Saves the registry without making the training loop wait for the disk: at a save the
/// training thread is blocked only while the state is copied into pinned staging memory (not at
/// all in CUDA stream-ordered mode); compression, writing and the commit run on a background
/// oneTBB flow graph while the next steps run. Same save points and listeners as
/// CheckpointSaverHook; after_save comes from the background thread that committed the save.
/// A background failure reaches the loop at the next after_run as options.on_error says.
/// end() returns only once every save is durable and committed (or failed).
class AsyncCheckpointSaverHook : public SessionRunHook {
 public:
  /// Validates the options (InvalidArgument naming the problem).
  static Result<std::unique_ptr<AsyncCheckpointSaverHook>> Create(
      SaverOptions options, const TensorRegistry* registry,
      std::vector<CheckpointSaverListener*> listeners = {});
  /// Waits for the saves still in flight.
  ~AsyncCheckpointSaverHook() override;

  Status begin() override;
  Status after_create_session(int64_t global_step) override;
  Status after_run(RunContext& context, const RunValues& values) override;
  /// Waits for the saves in flight, so a re-created session restores the newest of them;
  /// a failure among them still reaches the next after_run as options.on_error says.
  Status before_recovery() override;
  Status end(int64_t global_step) override;

  /// Blocks until every save submitted so far is committed or failed; the first failure so far
  /// (end() reports it too).
  Status wait_until_saved();
  /// As CheckpointSaverHook::set_keep_start_checkpoint.
  void set_keep_start_checkpoint(std::function<bool(int64_t)> keep);
  /// Totals so far (thread-safe).
  SaverTotals totals() const;

  /// Internal state (defined in the source file).
  class Impl;

 private:
  explicit AsyncCheckpointSaverHook(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace asyncckpt
