// The parts of an `asyncckpt train-sim` session: the saver hook of --saver, the input pipeline
// and its hook, and the session creators that restore at start and after every pre-emption.

#include "src/cli/train_sim_session.h"

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "src/cli/naive_saver.h"
#include "src/cli/shard_resume.h"
#include "src/util/status_macros.h"

namespace asyncckpt::cli {

void SaveRecorder::before_save(int64_t step) {
  std::lock_guard lock(mutex_);
  save_steps_.insert(step);
}

bool SaveRecorder::after_save(int64_t step, const SaveStats& stats) {
  std::lock_guard lock(mutex_);
  if (!stats.status.ok()) {
    std::fprintf(stderr, "\nasyncckpt: save of step %" PRId64 " failed: %s\n", step,
                 stats.status.ToString().c_str());
    // A rank that timed out once is never waited for again (src/state/sharded_commit.cc).
    if (gone_.ok() && stats.failed_rank >= 0 &&
        stats.status.message().find(" is known to be gone") != std::string::npos) {
      gone_ = Status::Aborted("rank " + std::to_string(stats.failed_rank) +
                              " stopped answering the job's saves and cannot rejoin; every later "
                              "save would fail, so the job ends (save of step " +
                              std::to_string(step) + ": " + stats.status.message() + ")");
    }
  }
  return false;
}

Status SaveRecorder::gone_rank() const {
  std::lock_guard lock(mutex_);
  return gone_;
}

bool SaveRecorder::TakeSavedAt(int64_t step) {
  std::lock_guard lock(mutex_);
  const bool saved = save_steps_.contains(step);
  save_steps_.erase(save_steps_.begin(), save_steps_.upper_bound(step));
  return saved;
}

Result<std::unique_ptr<SessionRunHook>> MakeSaverHook(const TrainSimConfig& config,
                                                      const TensorRegistry* registry,
                                                      SaveRecorder* recorder,
                                                      std::function<SaverTotals()>* totals,
                                                      std::function<bool(int64_t)> keep_start) {
  if (config.saver_kind == "none") {
    *totals = [] { return SaverTotals{}; };
    return std::unique_ptr<SessionRunHook>();
  }
  if (config.saver_kind == "naive") {
    auto hook = NaiveSaverHook::Create(config.saver, registry, {recorder});
    if (!hook.ok()) return hook.status();
    NaiveSaverHook* raw = hook->get();
    *totals = [raw] { return raw->totals(); };
    return std::unique_ptr<SessionRunHook>(std::move(hook).value());
  }
  if (config.saver_kind == "sync") {
    auto hook = CheckpointSaverHook::Create(config.saver, registry, {recorder});
    if (!hook.ok()) return hook.status();
    CheckpointSaverHook* raw = hook->get();
    raw->set_keep_start_checkpoint(std::move(keep_start));
    *totals = [raw] { return raw->totals(); };
    return std::unique_ptr<SessionRunHook>(std::move(hook).value());
  }
  auto hook = AsyncCheckpointSaverHook::Create(config.saver, registry, {recorder});
  if (!hook.ok()) return hook.status();
  AsyncCheckpointSaverHook* raw = hook->get();
  raw->set_keep_start_checkpoint(std::move(keep_start));
  *totals = [raw] { return raw->totals(); };
  return std::unique_ptr<SessionRunHook>(std::move(hook).value());
}

InputPipelineOptions InputOptions(const TrainSimConfig& config) {
  InputPipelineOptions options;
  options.saver.checkpoint_dir = config.saver.checkpoint_dir;
  options.saver.save_steps = config.saver.save_steps;
  options.saver.save_secs = config.saver.save_secs;
  options.saver.max_to_keep = config.saver.max_to_keep;
  // The model's kept steps keep their input partners.
  options.saver.keep_period = config.saver.keep_period;
  options.model_basename = config.saver.basename;
  options.saver.compression = config.saver.compression;
  options.saver.chunk_bytes = config.saver.chunk_bytes;
  options.saver.force_posix_io = config.saver.force_posix_io;
  options.saver.file_system = config.saver.file_system;
  options.saver.on_error = config.saver.on_error;
  options.saver.clock = config.saver.clock;
  options.saver.allow_fresh_start = config.saver.allow_fresh_start;
  if (config.model.shard) {
    // TensorFlow's per-worker suffix: each rank saves and restores its own input position.
    options.num_workers = config.model.world_size;
    options.task_type = "worker";
    options.task_id = config.model.rank;
  }
  return options;
}

Result<std::unique_ptr<CheckpointSessionCreator>> MakeCreator(const TrainSimConfig& config,
                                                              TrainModel* model) {
  CheckpointSessionCreatorOptions options;
  options.checkpoint_dir = config.saver.checkpoint_dir;
  options.model_basename = config.saver.basename;
  options.input_basename = InputCheckpointBasename(InputOptions(config));
  options.allow_fresh_start = config.allow_fresh_start;
  options.init_fn = [model] {
    model->Reset();
    return Status::OK();
  };
  return CheckpointSessionCreator::Create(std::move(options), &model->registry());
}

Result<std::unique_ptr<ShardedSessionCreator>> MakeShardedCreator(const TrainSimConfig& config,
                                                                  TrainModel* model,
                                                                  Coordinator* coordinator) {
  ShardedSessionCreatorOptions options;
  options.checkpoint_dir = config.saver.checkpoint_dir;
  options.model_basename = config.saver.basename;
  if (config.saver_kind == "sync" || config.saver_kind == "async") {
    options.input_basename = InputCheckpointBasename(InputOptions(config));
  }
  options.allow_fresh_start = config.allow_fresh_start;
  options.file_system = config.saver.file_system;
  options.init_fn = [model] {
    model->Reset();
    return Status::OK();
  };
  return ShardedSessionCreator::Create(std::move(options), coordinator, &model->registry());
}

Result<int64_t> SeedCheckedCreator::create_session() {
  RETURN_IF_ERROR(CheckSameSeed(dir_, basename_, seed_));
  return inner_->create_session();
}

Status InputCommittedFirstHook::after_run(RunContext& context, const RunValues& values) {
  (void)context;
  (void)values;
  (void)input_->wait_until_saved();
  return Status::OK();
}

Result<std::unique_ptr<RecordDatasetIterator>> OpenInput(TrainSimConfig& config,
                                                         Coordinator* coordinator) {
  if (config.dataset.empty())
    config.dataset = config.saver.checkpoint_dir + "/train-sim-dataset.bin";
  std::error_code ec;
  std::filesystem::create_directories(config.saver.checkpoint_dir, ec);
  Status written;
  if ((coordinator == nullptr || coordinator->rank() == 0) &&
      !std::filesystem::exists(config.dataset, ec)) {
    written = WriteRecordDataset(config.dataset, config.dataset_records, config.record_bytes,
                                 config.model.seed)
                  .WithContext("writing the synthetic dataset");
  }
  if (coordinator != nullptr) {
    ASSIGN_OR_RETURN(auto outcomes, GatherValues(*coordinator, written.ok() ? 0 : 1));
    if (outcomes[0] != 0 && written.ok()) {
      return Status::Unavailable("rank 0 could not write the dataset " + config.dataset);
    }
  }
  RETURN_IF_ERROR(written);
  config.input.path = config.dataset;
  return RecordDatasetIterator::Open(config.input);
}

Result<std::unique_ptr<CheckpointInputPipelineHook>> MakeInputHook(
    const TrainSimConfig& config, RecordDatasetIterator* input,
    std::function<std::string(int64_t)> restore_basename) {
  InputPipelineOptions options = InputOptions(config);
  options.restore_basename = std::move(restore_basename);
  return CheckpointInputPipelineHook::Create(std::move(options), input);
}

}  // namespace asyncckpt::cli
