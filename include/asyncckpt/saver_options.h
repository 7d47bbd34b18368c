#pragma once

// The options every saver takes (CheckpointSaverHook, AsyncCheckpointSaverHook, Checkpointer, and,
// embedded in InputPipelineOptions, CheckpointInputPipelineHook). Their ranges are in limits.h.

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "asyncckpt/compression.h"
#include "asyncckpt/coordinator.h"
#include "asyncckpt/file_system.h"
#include "asyncckpt/limits.h"
#include "asyncckpt/state.h"
#include "asyncckpt/status.h"
#include "asyncckpt/timer.h"

namespace asyncckpt {

/// What a saver does when a save is due while staging memory is still held by earlier saves,
/// or two earlier saves are not yet committed.
enum class OnBusy {
  /// Block the training thread until staging frees up (no save is ever dropped).
  kWait,
  /// Skip this save, count it, and try again at the next trigger.
  kSkip,
};

/// What a saver does when a background save fails.
enum class OnError {
  /// Request a stop at the next after_run; end() reports the failure.
  kStop,
  /// Log it, count it, and keep training.
  kContinue,
};

/// Whether a save returns before its checkpoint is durable (Checkpointer; the two hooks are one
/// mode each).
enum class SaveMode {
  /// Return once the state is copied into staging; the write goes on in the background.
  kAsynchronous,
  /// Return once the checkpoint is committed.
  kSynchronous,
};

/// Options shared by every saver. Validated once, by the saver's Create() (ValidateSaverOptions).
///
/// The directory lock: a saver's start locks "<checkpoint_dir>/<state file>.lock" (an advisory
/// lock holding the holder's PID and host; "checkpoint.lock" for the model's savers,
/// "checkpoint_input.lock" for the input hook's) before it looks at or removes anything there,
/// and keeps it until its end() / close(). The lock is per state file, not per basename: a
/// second saver that would write the same state file, of any basename, in any process, fails
/// to start with FailedPrecondition naming the lock file and its holder.
struct SaverOptions {
  /// Directory holding the checkpoints and the `checkpoint` state file; created if missing.
  std::string checkpoint_dir;
  /// Save every N global steps (exactly one of save_steps / save_secs). The hooks and
  /// Checkpointer::maybe_save follow TensorFlow's SecondOrStepTimer (the first step seen, then N
  /// steps after the last save), while the Python manager follows Orbax (step % N == 0).
  std::optional<int64_t> save_steps;
  /// Save every N seconds (exactly one of save_steps / save_secs).
  std::optional<double> save_secs;
  /// Checkpoints are named "<basename>-<step>"; a plain name, no '/'.
  std::string basename = "model.ckpt";
  /// Keep the newest N checkpoints (the best N under best_mode); 0 keeps all.
  int max_to_keep = 5;
  /// The basename of the input pipeline checkpoints these model checkpoints pair with
  /// (InputCheckpointBasename, e.g. "input.ckpt"; its state file is the one InputStateFileName
  /// gives). Retention then also keeps every checkpoint whose step is among the newest
  /// max_to_keep steps both sides hold, so that a model checkpoint whose input partner is kept
  /// is never deleted (at most 2 * max_to_keep are kept). Empty (the default): unpaired.
  std::string paired_input_basename;
  /// Of the checkpoints that fall out of max_to_keep, keep one every N hours (0 = none).
  double keep_checkpoint_every_n_hours = 0;
  /// Never delete a checkpoint whose step % keep_period == 0; it stays listed beside the
  /// max_to_keep, as Orbax's keep_period (0 = none).
  int keep_period = 0;
  /// What max_to_keep keeps: the newest (kNone, the default), or the max_to_keep best by the
  /// score each save stores under kRetentionScoreKey in its metadata (kMax: highest, kMin:
  /// lowest; equal scores favour the newer), beside every save without a score, which is never
  /// deleted: Orbax's best_fn / best_mode. The newest may then be deleted when it ranks below
  /// max_to_keep others. Needs max_to_keep > 0. Scores are read back from the checkpoints at
  /// start-up, so a restarted job ranks as before.
  BestMode best_mode = BestMode::kNone;
  /// Tensors are cut into chunks of at most this many bytes (rounded to whole elements), in
  /// [kMinChunkBytes, kMaxChunkBytes].
  uint64_t chunk_bytes = 4ull << 20;
  /// Number of data files each checkpoint is spread over (written concurrently), in
  /// [1, kMaxNumDataFiles].
  uint32_t num_data_files = 2;
  /// Codec and level.
  CompressionOptions compression;
  /// Extra key/values stored in every checkpoint's metadata (not kRetentionScoreKey, which is
  /// per save).
  std::map<std::string, std::string> user_metadata;
  /// Pinned staging budget in bytes. 0: one full snapshot of the state for an asynchronous
  /// save, and for a synchronous one (CheckpointSaverHook, SaveMode::kSynchronous) a window of
  /// kSynchronousStagingBytes the state streams through. A state larger than the budget streams
  /// through it (an asynchronous save then blocks until its last chunk is staged).
  uint64_t staging_bytes = 0;
  /// What to do when a save is due and staging is busy (or two saves are still uncommitted);
  /// the synchronous hook always waits.
  OnBusy on_busy = OnBusy::kWait;
  /// What to do when a background save fails (the synchronous savers return it instead).
  OnError on_error = OnError::kStop;
  /// Threads that copy a snapshot (the training thread and N - 1 helpers) and that the
  /// background arena may use (at most cores - 1); 0 = the machine's cores; at most
  /// kMaxBackgroundThreads.
  unsigned background_threads = 0;
  /// Most writes in flight at once while saving (over all data files), in [1, kMaxQueueDepth].
  unsigned queue_depth = kDefaultQueueDepth;
  /// CUDA state: return from a save as soon as the copies are enqueued (stream-ordered mode);
  /// set the compute stream first with SetCudaComputeStream. The save then makes the compute
  /// stream wait for its copies, so the GPU's next kernels queue behind the copy.
  bool cuda_stream_ordered = false;
  /// Stream-ordered mode: the save does not make the compute stream wait; the loop calls
  /// WaitForCopiesOnComputeStream right before the state changes (the optimizer's update), so
  /// the next forward and backward passes overlap the copy. A loop that writes the state
  /// without that call corrupts the checkpoint.
  bool cuda_defer_compute_wait = false;
  /// Write data files with O_DIRECT where the file system allows it, else buffered I/O with
  /// fdatasync. On by default: buffered writes cost a core's worth of page-cache copies per
  /// save, taken from the training job, and write at a fraction of the device's speed.
  bool use_o_direct = true;
  /// Use the POSIX I/O backend even where io_uring works (only when file_system is null).
  bool force_posix_io = false;
  /// Where every file goes (borrowed; must outlive the saver). Null: io_uring where a ring can
  /// be set up, else POSIX (force_posix_io chooses), as leveldb's Options::env.
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
  /// Start even when checkpoint_dir holds quarantined (damaged) checkpoints of this basename,
  /// "<basename>-<step>.corrupt-<hex>", and no good one. Off (the default): such a start fails
  /// with FailedPrecondition naming them, as a fresh start would silently train from step 0.
  bool allow_fresh_start = false;
  /// Multi-process jobs: how long a rank waits for the others during a save's commit before
  /// that save fails on it (seconds, > 0).
  double coordination_timeout_secs = 300;
};

/// InvalidArgument naming the first bad field and its valid range, worded like TensorFlow's
/// messages.
Status ValidateSaverOptions(const SaverOptions& options);

}  // namespace asyncckpt
