#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "asyncckpt/hooks.h"
#include "asyncckpt/save_stats.h"
#include "asyncckpt/saver_options.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"
#include "asyncckpt/timer.h"

namespace asyncckpt {

/// Observes saves (TensorFlow's CheckpointSaverListener). Called on the training thread for the
/// synchronous hook; for the asynchronous hook after_save comes from the background commit.
class CheckpointSaverListener {
 public:
  virtual ~CheckpointSaverListener() = default;
  /// Once, from the hook's begin().
  virtual void begin() {}
  /// Before a save of `step` starts.
  virtual void before_save(int64_t step) { (void)step; }
  /// After a save of `step` finished (stats.status says whether it succeeded). Returning true
  /// asks the training loop to stop, except for the save a hook makes in after_create_session
  /// (at a session's start or re-creation), whose answer is ignored, as in TensorFlow.
  virtual bool after_save(int64_t step, const SaveStats& stats) {
    (void)step;
    (void)stats;
    return false;
  }
  /// Once, from the hook's end(), after the last save.
  virtual void end(int64_t step) { (void)step; }
};

/// Most recent saves SaverTotals::saves keeps. Older saves live on only in SaverTotals' running
/// totals, so that a job saving every step for weeks holds bounded memory. A SaveStats costs
/// 0.3 to 1 KiB of heap (its path, status and codec map): at 1000 the heap of a saver grew by
/// about that much per save for its first 1000 saves, which looked like a leak; at 128 it is
/// flat after the first 128 (tests/saver/save_memory_test.cc holds it to that).
inline constexpr size_t kSaverTotalsWindow = 128;

/// Totals over a hook's life: exact running totals over every save, and the most recent saves.
struct SaverTotals {
  /// Saves that committed.
  int64_t saves_committed = 0;
  /// Saves that failed.
  int64_t saves_failed = 0;
  /// Saves skipped because staging was busy (OnBusy::kSkip).
  int64_t saves_skipped = 0;
  /// Sum and maximum of blocked seconds.
  double blocked_seconds_total = 0;
  /// Longest single block of the training thread by one save.
  double blocked_seconds_max = 0;
  /// Bytes of tensor data saved, over committed saves.
  uint64_t bytes_raw = 0;
  /// Bytes written to data files, over committed saves.
  uint64_t bytes_stored = 0;
  /// Sum of seconds_to_durable over committed saves (bytes_raw over it is the save throughput).
  double seconds_to_durable_total = 0;
  /// Longest seconds_to_durable of a committed save.
  double seconds_to_durable_max = 0;
  /// Chunks written per codec name, over committed saves.
  std::map<std::string, uint64_t> chunks_by_codec;
  /// Most pinned staging memory in use at once.
  uint64_t staging_high_water_bytes = 0;
  /// Start-up cost: seconds the saver's thread spent creating engines and their staging
  /// (allocating, touching and registering pinned memory), at begin() or
  /// Checkpointer::prepare(), or inside a save that needed a new engine, whose blocked_seconds
  /// then includes it.
  double startup_seconds = 0;
  /// Entries removed at begin(): temporaries of interrupted saves and deletions, and
  /// checkpoint directories that were incomplete or older than the retained ones
  /// (docs/durability.md).
  std::vector<std::string> stale_temporaries_removed;
  /// Old checkpoints that retention dropped but could not delete (each logged; the saves that
  /// dropped them still count as committed, and the next start retries).
  int64_t retention_failures = 0;
  /// The stats of the most recent saves, committed or failed (at most kSaverTotalsWindow), in
  /// the order they finished (step order), oldest first.
  std::deque<SaveStats> saves;
};

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
  /// Totals so far (thread-safe).
  SaverTotals totals() const;

  /// Internal state (defined in the source file).
  class Impl;

 private:
  explicit AsyncCheckpointSaverHook(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace asyncckpt
