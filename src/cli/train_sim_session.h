#pragma once

// The parts of an `asyncckpt train-sim` session: the saver hook of --saver, the input pipeline
// and its hook, and the session creator that restores the newest step with both a model and an
// input checkpoint (alone, or agreed by every rank with --shard).

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "asyncckpt/coordinator.h"
#include "asyncckpt/hooks.h"
#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/session_creator.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"
#include "src/cli/shard_job.h"
#include "src/cli/sim_model.h"
#include "src/cli/train_sim_flags.h"

namespace asyncckpt::cli {

/// Records which steps saved, for the step times, and reports a failed save on stderr.
/// Thread-safe: the saver calls it from its commit thread.
class SaveRecorder final : public CheckpointSaverListener {
 public:
  /// Notes `step` as a step that saved.
  void before_save(int64_t step) override;
  /// Prints a failed save's status; never asks the saver to stop.
  bool after_save(int64_t step, const SaveStats& stats) override;
  /// True when a save began at `step`; forgets every step up to `step`, which the loop asks
  /// about once, in order: the recorder holds no record per save.
  bool TakeSavedAt(int64_t step);
  /// Aborted, naming the rank, once a save failed because a rank of the job is known to be
  /// gone: no later save can commit without it, so the job must end rather than run on with
  /// every save failing (on_error continue) and exit 0. OK until then.
  Status gone_rank() const;

 private:
  mutable std::mutex mutex_;
  std::set<int64_t> save_steps_;  // noted and not yet asked about: one or two
  Status gone_;
};

/// The hook of --saver, reporting to `recorder`; null for --saver none. `totals` is set to read
/// the hook's totals (all zero for none). `keep_start` goes to the library's savers
/// (set_keep_start_checkpoint).
Result<std::unique_ptr<SessionRunHook>> MakeSaverHook(const TrainSimConfig& config,
                                                      const TensorRegistry* registry,
                                                      SaveRecorder* recorder,
                                                      std::function<SaverTotals()>* totals,
                                                      std::function<bool(int64_t)> keep_start);

/// The input hook's options: its schedule, retention and codec follow the model saver's.
InputPipelineOptions InputOptions(const TrainSimConfig& config);

/// Restores the model at the newest step that has both a model and an input checkpoint, at the
/// start and after every pre-emption, so that the input hook resumes the input at exactly that
/// step. Model checkpoints newer than that (their input checkpoint was still being written when
/// the job died) are not used: resuming from one would replay the input from another position.
/// Checkpoints without any such pair are an error unless --allow_fresh_start; with no
/// checkpoint at all the job starts afresh from step 0 (a re-created session resets the model).
Result<std::unique_ptr<CheckpointSessionCreator>> MakeCreator(const TrainSimConfig& config,
                                                              TrainModel* model);

/// --shard: every rank agrees on the step to resume (ShardedSessionCreator). The input pairs
/// with the model unless the saver writes no input checkpoints (none, naive: a restore of the
/// model alone, on any number of ranks).
Result<std::unique_ptr<ShardedSessionCreator>> MakeShardedCreator(const TrainSimConfig& config,
                                                                  TrainModel* model,
                                                                  Coordinator* coordinator);

/// Refuses another --seed over existing checkpoints (CheckSameSeed), then lets `inner` create
/// the session. It runs after the hooks' begin(), so a second job is refused for the lock first.
class SeedCheckedCreator final : public SessionCreator {
 public:
  /// `inner` is borrowed and must outlive this creator.
  SeedCheckedCreator(const TrainSimConfig& config, SessionCreator* inner)
      : dir_(config.saver.checkpoint_dir),
        basename_(config.saver.basename),
        seed_(config.model.seed),
        inner_(inner) {}
  /// FailedPrecondition naming both seeds, or what `inner` returns.
  Result<int64_t> create_session() override;

 private:
  std::string dir_, basename_;
  uint64_t seed_;
  SessionCreator* inner_;
};

/// Runs after the input hook and before the model's saver, and
/// waits until the input save of the step just run is committed (or failed). A rank's part of
/// the model checkpoint of a step is then published only after its input checkpoint of that
/// step is committed, so the model checkpoint that rank 0 commits always completes a whole set,
/// and retention, which drops the older sets once the newer model checkpoint is listed, never
/// leaves the job without one (docs/distributed.md).
class InputCommittedFirstHook final : public SessionRunHook {
 public:
  /// `input` is borrowed and must outlive this hook.
  explicit InputCommittedFirstHook(CheckpointInputPipelineHook* input) : input_(input) {}
  /// Waits for the input's saves in flight; their failures reach the loop through the input
  /// hook, as on_error says.
  Status after_run(RunContext& context, const RunValues& values) override;

 private:
  CheckpointInputPipelineHook* input_;
};

/// Opens the dataset, writing the synthetic one first when it is missing, and sets
/// config.dataset and config.input.path. With a coordinator, rank 0 alone writes it, and the
/// others open it after. Collective with a coordinator.
Result<std::unique_ptr<RecordDatasetIterator>> OpenInput(TrainSimConfig& config,
                                                         Coordinator* coordinator);

/// The hook that checkpoints `input` beside the model; at each session's start it restores
/// the input checkpoint `restore_basename` names for the starting step (its own when "").
Result<std::unique_ptr<CheckpointInputPipelineHook>> MakeInputHook(
    const TrainSimConfig& config, RecordDatasetIterator* input,
    std::function<std::string(int64_t)> restore_basename);

}  // namespace asyncckpt::cli
