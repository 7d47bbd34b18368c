#pragma once

// The input pipeline's state, checkpointed apart from the model's (TensorFlow's
// CheckpointInputPipelineHook): its own basename and state file in the same checkpoint_dir, so
// a pre-empted job resumes its input exactly where it left off — no example seen twice or
// skipped.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "asyncckpt/compression.h"
#include "asyncckpt/dtype.h"
#include "asyncckpt/file_system.h"
#include "asyncckpt/hooks.h"
#include "asyncckpt/saver_options.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"
#include "asyncckpt/timer.h"

namespace asyncckpt {

/// The state file of the input pipeline's checkpoints in a single-worker job (see
/// InputStateFileName).
inline constexpr char kInputStateFileName[] = "checkpoint_input";

/// An iterator's saved state: named tensors in host memory that it owns.
class IteratorState {
 public:
  /// One saved tensor.
  struct Entry {
    /// Unique name within the state.
    std::string name;
    /// Element type.
    DType dtype = DType::kU8;
    /// Dimensions.
    std::vector<int64_t> shape;
    /// The raw bytes (elements × dtype size).
    std::vector<uint8_t> bytes;
  };

  /// Stores a copy of `bytes` as tensor `name`; InvalidArgument for a duplicate or empty name
  /// or a size that does not match shape × dtype.
  Status put(const std::string& name, DType dtype, std::vector<int64_t> shape,
             std::span<const uint8_t> bytes);
  /// Stores opaque bytes as a u8 vector.
  Status put_bytes(const std::string& name, std::span<const uint8_t> bytes);
  /// Stores 64-bit integers as an i64 vector.
  Status put_i64(const std::string& name, std::span<const int64_t> values);
  /// The entry named `name`, or NotFound naming it.
  Result<const Entry*> get(const std::string& name) const;
  /// Reads an i64 vector of exactly `count` values; Corruption when it has another shape/dtype.
  Result<std::vector<int64_t>> get_i64(const std::string& name, size_t count) const;
  /// Every entry, in insertion order.
  const std::vector<Entry>& entries() const { return entries_; }
  /// Forgets every entry.
  void clear() { entries_.clear(); }
  /// Total bytes held.
  uint64_t total_bytes() const;
  /// A registry whose tensors point at this state's buffers (valid until the state changes).
  Result<TensorRegistry> as_registry() const;

 private:
  std::vector<Entry> entries_;
};

/// An input iterator whose position can be saved and restored. Called from the training thread.
class SaveableIterator {
 public:
  virtual ~SaveableIterator() = default;
  /// Writes the iterator's complete state into `state` (which starts empty).
  virtual Status save(IteratorState* state) = 0;
  /// Replaces the iterator's state by a saved one; Corruption naming the entry when it does
  /// not fit this iterator.
  virtual Status restore(const IteratorState& state) = 0;
  /// True when the iterator depends on state it cannot save (an external source, a live
  /// stream): such a checkpoint would not resume exactly.
  virtual bool has_external_state() const { return false; }
  /// Upper bound on the bytes save() writes, used to size staging; 0 when unknown.
  virtual uint64_t max_state_bytes() const { return 0; }
};

/// What to do when the iterator has external state (TensorFlow's ExternalStatePolicy).
enum class ExternalStatePolicy {
  /// Save anyway, silently.
  kIgnore,
  /// Save anyway and log a warning.
  kWarn,
  /// Refuse to save (the default): the save fails with FailedPrecondition.
  kFail,
};

/// Options of CheckpointInputPipelineHook.
struct InputPipelineOptions {
  /// How the input checkpoints are saved, as the model's savers save theirs (checkpoint_dir,
  /// save_steps / save_secs, max_to_keep, on_error, chunk_bytes, compression, file_system, ...;
  /// give on_error the model saver's value: with kContinue on the model side only, a full disk
  /// stops the job here). The hook sets some fields itself: basename is
  /// InputCheckpointBasename(), paired_input_basename is unused (model_basename pairs), each
  /// checkpoint has one data file, one background thread writes it at high priority, and no
  /// save is ever skipped (on_busy is ignored). staging_bytes 0 sizes staging from the
  /// iterator's max_state_bytes() (or twice the first snapshot when the iterator cannot tell);
  /// set, it is the budget, as for every saver.
  /// A coordinator of several processes names the workers (num_workers and task_id default to
  /// its size and rank; set, they must match it) and, under save_secs, lets rank 0's clock
  /// decide when every worker saves (a collective after every step), so that every worker's
  /// input checkpoints pair with the model checkpoints of the same steps; each worker's input
  /// checkpoints stay its own, never sharded.
  SaverOptions saver;
  /// The basename of the model checkpoints these input checkpoints pair with (state file
  /// "checkpoint"): retention also keeps every input checkpoint whose step is among the newest
  /// max_to_keep steps both sides hold, so the input partner of a kept model checkpoint is never
  /// deleted (at most 2 * max_to_keep are kept). Empty: unpaired.
  std::string model_basename = "model.ckpt";
  /// Workers in the job; with more than one the basename is input_<task_type>_<task_id>.ckpt.
  int num_workers = 1;
  /// This worker's task type, e.g. "worker".
  std::string task_type = "worker";
  /// This worker's index.
  int task_id = 0;
  /// For iterators with external state.
  ExternalStatePolicy external_state_policy = ExternalStatePolicy::kFail;
  /// When the session's starting step S > 0 has no input checkpoint `<basename>-S`: false (the
  /// default) fails the first before_run with FailedPrecondition naming the step and the
  /// directory; true restores the latest input checkpoint instead (saving the initial state when
  /// there is none), as TensorFlow does, which may pair the model of step S with the input
  /// position of another step.
  bool restore_latest_when_step_missing = false;
  /// Called at each session's first before_run with the starting step: the basename whose
  /// checkpoint of that step to restore instead of this worker's own (e.g. another worker's,
  /// when the job grew and this worker has no input state of its own); "" or unset: its own.
  /// What it saves afterwards is still its own.
  std::function<std::string(int64_t start_step)> restore_basename;
};

/// The basename the options give: "input.ckpt", or "input_<task_type>_<task_id>.ckpt".
std::string InputCheckpointBasename(const InputPipelineOptions& options);

/// The state file the options give: "checkpoint_input", or "checkpoint_input_<task_type>_<task_id>"
/// with several workers (TensorFlow's latest_filename), so that workers sharing checkpoint_dir
/// never share a state file (nor retain or restore each other's checkpoints).
std::string InputStateFileName(const InputPipelineOptions& options);

/// Saves and restores a SaveableIterator beside the model's checkpoints (basename
/// InputCheckpointBasename, state file InputStateFileName), with TensorFlow's
/// CheckpointInputPipelineHook semantics: on the first before_run after each
/// after_create_session (a new session, or one re-created after a pre-emption) it restores the
/// input checkpoint of exactly the session's starting step; without one it saves the initial
/// state at step 0, and fails with FailedPrecondition at a later step (unless
/// restore_latest_when_step_missing). Then it saves on its own schedule and at end().
/// Each input checkpoint records the model step it belongs to. Saves go through the
/// asynchronous engine; a failed save requests a stop and end() returns it, or with
/// OnError::kContinue is logged and counted. The iterator is borrowed and must outlive the hook.
class CheckpointInputPipelineHook : public SessionRunHook {
 public:
  /// Validates the options (InvalidArgument naming the problem).
  static Result<std::unique_ptr<CheckpointInputPipelineHook>> Create(InputPipelineOptions options,
                                                                     SaveableIterator* iterator);
  ~CheckpointInputPipelineHook() override;

  Status begin() override;
  Status after_create_session(int64_t global_step) override;
  Result<RunArgs> before_run(RunContext& context) override;
  Status after_run(RunContext& context, const RunValues& values) override;
  /// Waits for the input checkpoints in flight.
  Status before_recovery() override;
  Status end(int64_t global_step) override;

  /// The checkpoint restored at the first before_run of the latest session, or empty when it
  /// saved the initial state.
  const std::string& restored_from() const;
  /// Input checkpoints committed so far.
  int64_t saves_committed() const;
  /// Input checkpoints that failed so far (each logged; with OnError::kStop the first also
  /// stops the loop).
  int64_t saves_failed() const;
  /// Blocks until every save started so far is committed or failed; the first failure so far
  /// (end() reports it too).
  Status wait_until_saved();

  /// Internal state (defined in the source file).
  class Impl;

 private:
  explicit CheckpointInputPipelineHook(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The newest step that has both a complete model checkpoint (`model_basename`, state file
/// "checkpoint") and a complete input checkpoint (`input_basename`, state file "checkpoint_" +
/// the basename without ".ckpt": "checkpoint_input" for "input.ckpt", as InputStateFileName) in
/// `dir`. Each side's steps come from CommittedCheckpointSteps: its state file when healthy,
/// else a scan of `dir` for complete checkpoints (logged). nullopt when no step has both; that
/// is logged as a warning when either side has any checkpoint. Errors as
/// CommittedCheckpointSteps. `fs` (borrowed) is read through; null means the POSIX backend.
Result<std::optional<int64_t>> NewestCompleteStep(const std::string& dir,
                                                  const std::string& model_basename,
                                                  const std::string& input_basename,
                                                  io::FileSystem* fs = nullptr);

/// Options of RecordDatasetIterator.
struct RecordDatasetOptions {
  /// The dataset file (see WriteRecordDataset).
  std::string path;
  /// Records held for shuffling; 1 keeps file order.
  size_t shuffle_buffer = 1024;
  /// Records read ahead by a background thread.
  size_t prefetch = 64;
  /// Seed of the shuffle.
  uint64_t seed = 0;
  /// Passes over the file; -1 repeats forever.
  int64_t epochs = -1;
};

/// Writes a dataset of `num_records` fixed-size records of `record_bytes`, deterministic from
/// `seed`: a 32-byte header ("ACKPTDS1", record count, record size, checksum of the header)
/// followed by the records.
Status WriteRecordDataset(const std::string& path, uint64_t num_records, uint32_t record_bytes,
                          uint64_t seed);

/// Reads fixed-size records from a dataset file through a prefetch thread and a seeded shuffle
/// buffer, epoch after epoch (tf.data's repeat().shuffle().prefetch()). Its state — position,
/// prefetched records, shuffle buffer contents and generator state — is saved and restored
/// exactly. Not thread-safe: one consumer thread.
class RecordDatasetIterator final : public SaveableIterator {
 public:
  /// Opens the dataset; NotFound / Corruption naming the file when it cannot be read.
  static Result<std::unique_ptr<RecordDatasetIterator>> Open(const RecordDatasetOptions& options);
  ~RecordDatasetIterator() override;

  /// The next record; OutOfRange after the last epoch.
  Status next(std::vector<uint8_t>* record);
  /// Up to `count` records, concatenated (the last batch of a finite dataset may be short);
  /// OutOfRange when none is left.
  Status next_batch(size_t count, std::vector<uint8_t>* batch);
  /// Bytes per record.
  uint32_t record_bytes() const;
  /// Records in one epoch.
  uint64_t num_records() const;
  /// Records handed out so far (across restores).
  int64_t records_emitted() const;

  Status save(IteratorState* state) override;
  Status restore(const IteratorState& state) override;
  uint64_t max_state_bytes() const override;

  /// Internal state (defined in the source file).
  class Impl;

 private:
  explicit RecordDatasetIterator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace asyncckpt
