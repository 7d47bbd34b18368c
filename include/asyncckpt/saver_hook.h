#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "asyncckpt/compression.h"
#include "asyncckpt/coordinator.h"
#include "asyncckpt/file_system.h"
#include "asyncckpt/hooks.h"
#include "asyncckpt/save_stats.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"
#include "asyncckpt/timer.h"

namespace asyncckpt {

/// What the asynchronous hook does when a save is due while staging memory is still held by
/// earlier saves, or two earlier saves are not yet committed.
enum class OnBusy {
  /// Block the training thread until staging frees up (no save is ever dropped).
  kWait,
  /// Skip this save, count it, and try again at the next trigger.
  kSkip,
};

/// What the asynchronous hook does when a background save fails.
enum class OnError {
  /// Request a stop at the next after_run; end() reports the failure.
  kStop,
  /// Log it, count it, and keep training.
  kContinue,
};

/// Options shared by CheckpointSaverHook and AsyncCheckpointSaverHook. Validated once by the
/// hooks' Create().
struct SaverOptions {
  /// Directory holding the checkpoints and the `checkpoint` state file; created if missing.
  std::string checkpoint_dir;
  /// Save every N global steps (exactly one of save_steps / save_secs).
  std::optional<int64_t> save_steps;
  /// Save every N seconds (exactly one of save_steps / save_secs).
  std::optional<double> save_secs;
  /// Checkpoints are named "<basename>-<step>"; a plain name, no '/'.
  std::string basename = "model.ckpt";
  /// Keep the newest N checkpoints; 0 keeps all.
  int max_to_keep = 5;
  /// The basename of the input pipeline checkpoints these model checkpoints pair with
  /// (InputCheckpointBasename, e.g. "input.ckpt"; its state file is the one InputStateFileName
  /// gives). Retention then also keeps every checkpoint whose step is among the newest
  /// max_to_keep steps both sides hold, so that a model checkpoint whose input partner is kept
  /// is never deleted (at most 2 * max_to_keep are kept). Empty (the default): unpaired.
  std::string paired_input_basename;
  /// Of the checkpoints that fall out of max_to_keep, keep one every N hours (0 = none).
  double keep_checkpoint_every_n_hours = 0;
  /// Tensors are cut into chunks of at most this many bytes (rounded to whole elements).
  uint64_t chunk_bytes = 4ull << 20;
  /// Number of data files each checkpoint is spread over (written concurrently).
  uint32_t num_data_files = 2;
  /// Codec and level.
  CompressionOptions compression;
  /// Extra key/values stored in every checkpoint's metadata.
  std::map<std::string, std::string> user_metadata;
  /// Asynchronous hook: pinned staging budget in bytes; 0 means one full snapshot of the state.
  uint64_t staging_bytes = 0;
  /// Asynchronous hook: what to do when a save is due and staging is busy (or two saves are
  /// still uncommitted).
  OnBusy on_busy = OnBusy::kWait;
  /// Asynchronous hook: what to do when a background save fails.
  OnError on_error = OnError::kStop;
  /// Asynchronous hook: threads that copy a snapshot (the training thread and N - 1 helpers)
  /// and that the background arena may use (at most cores - 1); 0 = the machine's cores.
  unsigned background_threads = 0;
  /// Most writes in flight at once while saving (over all data files), and the io_uring batch
  /// depth.
  unsigned queue_depth = 64;
  /// Asynchronous hook, CUDA state: return from a save as soon as the copies are enqueued
  /// (stream-ordered mode); set the compute stream first with SetCudaComputeStream.
  bool cuda_stream_ordered = false;
  /// Write data files with O_DIRECT where the file system allows it, else buffered I/O with
  /// fdatasync. On by default: buffered writes cost a core's worth of page-cache copies per
  /// save, taken from the training job, and write at a fraction of the device's speed.
  bool use_o_direct = true;
  /// Use the POSIX I/O backend even where io_uring works (only when file_system is null).
  bool force_posix_io = false;
  /// Where every file goes (borrowed; must outlive the hook). Null: io_uring where a ring can
  /// be set up, else POSIX (force_posix_io and queue_depth choose), as leveldb's Options::env.
  io::FileSystem* file_system = nullptr;
  /// Time source for save_secs and retention (tests use a fake clock).
  Clock clock = SystemClockSeconds;
  /// Multi-process jobs: the job's processes (borrowed; must outlive the hook; e.g.
  /// NewMpiCoordinator). Null, or a job of one: a single-process saver, as before. With more
  /// than one process every rank registers its own tensors (whole ones are replicas, written
  /// by rank 0; shards carry global_shape and global_offset; a box several ranks hold is
  /// written by the lowest), every rank shares checkpoint_dir, and the hook's begin(), and its
  /// after_run under save_secs, are collectives every rank reaches in the same order (rank 0's
  /// clock decides when to save). The registry is read at begin(). on_busy must be kWait.
  /// Every rank must also stop at the same step (e.g. at a fixed last step): a stop that one
  /// rank requests alone (a listener's, or OnError::kStop's, which each rank hears of at its
  /// own after_run) is not agreed, and the final saves of different steps fail after
  /// coordination_timeout_secs.
  Coordinator* coordinator = nullptr;
  /// Multi-process jobs: how long a rank waits for the others during a save's commit before
  /// that save fails on it (seconds, > 0).
  double coordination_timeout_secs = 300;
};

/// InvalidArgument naming the first bad field, worded like TensorFlow's messages.
Status ValidateSaverOptions(const SaverOptions& options);

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
/// totals, so that a job saving every step for weeks holds bounded memory (a SaveStats is about
/// half a KiB).
inline constexpr size_t kSaverTotalsWindow = 1000;

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
