// CheckpointInputPipelineHook and IteratorState: the input pipeline's checkpoints, beside the
// model's, through their own engine, basename and state file.

#include "asyncckpt/input_pipeline.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <string_view>
#include <utility>

#include "asyncckpt/reader.h"
#include "asyncckpt/state.h"
#include "src/engine/engine.h"
#include "src/format/format.h"
#include "src/saver/saver_common.h"
#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

Status IteratorState::put(const std::string& name, DType dtype, std::vector<int64_t> shape,
                          std::span<const uint8_t> bytes) {
  if (name.empty()) return Status::InvalidArgument("iterator state entry name must not be empty");
  for (const Entry& entry : entries_) {
    if (entry.name == name) {
      return Status::InvalidArgument("iterator state entry '" + name + "' is stored twice");
    }
  }
  const int64_t elements = NumElements(shape);
  if (elements < 0 || static_cast<uint64_t>(elements) * DTypeSize(dtype) != bytes.size()) {
    return Status::InvalidArgument("iterator state entry '" + name + "' has " +
                                   std::to_string(bytes.size()) +
                                   " bytes, which does not match its shape and dtype");
  }
  entries_.push_back(Entry{name, dtype, std::move(shape), {bytes.begin(), bytes.end()}});
  return Status::OK();
}

Status IteratorState::put_bytes(const std::string& name, std::span<const uint8_t> bytes) {
  return put(name, DType::kU8, {static_cast<int64_t>(bytes.size())}, bytes);
}

Status IteratorState::put_i64(const std::string& name, std::span<const int64_t> values) {
  return put(name, DType::kI64, {static_cast<int64_t>(values.size())},
             {reinterpret_cast<const uint8_t*>(values.data()), values.size_bytes()});
}

Result<const IteratorState::Entry*> IteratorState::get(const std::string& name) const {
  for (const Entry& entry : entries_) {
    if (entry.name == name) return &entry;
  }
  return Status::NotFound("the iterator state has no entry '" + name + "'");
}

Result<std::vector<int64_t>> IteratorState::get_i64(const std::string& name, size_t count) const {
  ASSIGN_OR_RETURN(const Entry* entry, get(name));
  if (entry->dtype != DType::kI64 || entry->bytes.size() != count * sizeof(int64_t)) {
    return Status::Corruption("iterator state entry '" + name + "' should hold " +
                              std::to_string(count) + " i64 values");
  }
  std::vector<int64_t> values(count);
  if (count > 0) std::memcpy(values.data(), entry->bytes.data(), entry->bytes.size());
  return values;
}

uint64_t IteratorState::total_bytes() const {
  uint64_t total = 0;
  for (const Entry& entry : entries_) total += entry.bytes.size();
  return total;
}

Result<TensorRegistry> IteratorState::AsRegistry() const {
  TensorRegistry registry;
  for (const Entry& entry : entries_) {
    RETURN_IF_ERROR(registry.add(TensorRef{entry.name,
                                           entry.dtype,
                                           entry.shape,
                                           const_cast<uint8_t*>(entry.bytes.data()),
                                           entry.bytes.size(),
                                           nullptr,
                                           {},
                                           {}}));
  }
  return registry;
}

std::string InputCheckpointBasename(const InputPipelineOptions& options) {
  if (options.num_workers <= 1) return "input.ckpt";
  return "input_" + options.task_type + "_" + std::to_string(options.task_id) + ".ckpt";
}

std::string InputStateFileName(const InputPipelineOptions& options) {
  return InputStateFileForBasename(InputCheckpointBasename(options));
}

namespace {

// The saver options the input hook's storage and checks share with the model's savers.
SaverOptions AsSaverOptions(const InputPipelineOptions& options) {
  SaverOptions saver;
  saver.checkpoint_dir = options.checkpoint_dir;
  saver.save_steps = options.save_steps;
  saver.save_secs = options.save_secs;
  saver.basename = InputCheckpointBasename(options);
  saver.max_to_keep = options.max_to_keep;
  saver.chunk_bytes = options.chunk_bytes;
  saver.num_data_files = 1;
  saver.compression = options.compression;
  saver.staging_bytes = options.staging_bytes;
  saver.force_posix_io = options.force_posix_io;
  saver.file_system = options.file_system;
  saver.clock = options.clock;
  return saver;
}

}  // namespace

Result<std::optional<int64_t>> NewestCompleteStep(const std::string& dir,
                                                  const std::string& model_basename,
                                                  const std::string& input_basename,
                                                  io::FileSystem* fs) {
  ASSIGN_OR_RETURN(const std::vector<int64_t> model,
                   CommittedCheckpointSteps(dir, model_basename, kCheckpointStateFileName, fs));
  ASSIGN_OR_RETURN(
      const std::vector<int64_t> input,
      CommittedCheckpointSteps(dir, input_basename, InputStateFileForBasename(input_basename), fs));
  const std::set<int64_t> input_steps(input.begin(), input.end());
  for (auto it = model.rbegin(); it != model.rend(); ++it) {
    if (input_steps.contains(*it)) return std::optional<int64_t>(*it);
  }
  if (!model.empty() || !input.empty()) {
    LogLine("WARNING: " + dir + " holds " + std::to_string(model.size()) + " complete " +
            model_basename + " and " + std::to_string(input.size()) + " complete " +
            input_basename + " checkpoints, but no step has both");
  }
  return std::optional<int64_t>();
}

class CheckpointInputPipelineHook::Impl {
 public:
  Impl(InputPipelineOptions options, SaveableIterator* iterator, SaveSchedule schedule)
      : options_(std::move(options)),
        saver_options_(AsSaverOptions(options_)),
        state_file_(InputStateFileName(options_)),
        iterator_(iterator),
        schedule_(std::move(schedule)) {}
  ~Impl() { engine_.reset(); }

  Status Begin() {
    CheckpointPartner model;
    if (!options_.model_basename.empty())
      model = {options_.model_basename, kCheckpointStateFileName};
    ASSIGN_OR_RETURN(std::vector<std::string> removed,
                     storage_.Start(saver_options_, state_file_, model));
    (void)removed;  // SaverStorage::Start already logged them
    return Status::OK();
  }

  // A new session (the first, or one re-created after a pre-emption) starts at `step`: the
  // next before_run restores the input of exactly that step, as the iterator has moved on.
  void SetStartStep(int64_t step) {
    start_step_ = step;
    restore_done_ = false;
  }

  // First before_run of a session: restore the input checkpoint of the starting step, or save
  // the initial state at step 0.
  Status RestoreOrSaveInitial() {
    restore_done_ = true;
    restored_from_.clear();
    // A re-created session may start at a step whose save this hook still has in flight.
    if (engine_) engine_->WaitAll();
    const bool moved = std::exchange(iterator_moved_, true);  // the steps consume it from here
    ASSIGN_OR_RETURN(std::string path, CheckpointToRestore());
    if (path.empty()) {
      // "The initial state" is the iterator's only while it has not moved. It is durable
      // before the first step runs, so a model checkpoint past step 0 always has a partner to
      // come back to: without the wait, a job killed 40 ms in (the crash harness) left
      // model.ckpt-0 and -1 committed, no input checkpoint, and every later start refusing
      // to train over them. A failure of this save stops the loop at the next after_run.
      if (!moved) {
        RETURN_IF_ERROR(Save(start_step_));
        if (engine_) engine_->WaitAll();
        return Status::OK();
      }
      return Status::FailedPrecondition(
          "the re-created session starts at step " + std::to_string(start_step_) + " but " +
          options_.checkpoint_dir + " has no input checkpoint " + StartName() +
          " to restore, and the input iterator has moved past its initial state");
    }
    RETURN_IF_ERROR(Restore(path));
    restored_from_ = path;
    schedule_.mark(start_step_);
    schedule_.mark_saved(start_step_);
    return Status::OK();
  }

  // The input checkpoint of the starting step; "" when there is none to restore (a fresh start
  // at step 0). At a later step without one: FailedPrecondition, or the latest one when the
  // options ask for TensorFlow's behaviour.
  Result<std::string> CheckpointToRestore() {
    const std::string exact = options_.checkpoint_dir + "/" + StartName();
    bool exists = false, is_dir = false;
    RETURN_IF_ERROR(ToStatus(storage_.fs->stat(exact, &exists, &is_dir)));
    if (exists && is_dir) return exact;
    if (start_step_ == 0) return std::string();
    if (!options_.restore_latest_when_step_missing) {
      return Status::FailedPrecondition(
          "the session starts at step " + std::to_string(start_step_) + " but " +
          options_.checkpoint_dir + " has no input checkpoint " + StartName() +
          "; resuming the input from another step would pair the model with another input "
          "position (restore_latest_when_step_missing allows it)");
    }
    auto latest = LatestCheckpoint(options_.checkpoint_dir, state_file_, storage_.fs);
    if (latest.status().code() == StatusCode::kNotFound) return std::string();
    RETURN_IF_ERROR(latest.status());
    LogLine("no input checkpoint for step " + std::to_string(start_step_) +
            "; restoring the latest one, " + *latest);
    return *latest;
  }

  std::string StartName() const {
    return format::CheckpointDirName(saver_options_.basename, start_step_);
  }

  Status Save(int64_t step) {
    schedule_.mark(step);
    schedule_.mark_saved(step);
    if (iterator_->has_external_state()) {
      const std::string why = "the input iterator depends on external state it cannot save";
      if (options_.external_state_policy == ExternalStatePolicy::kFail) {
        return Status::FailedPrecondition(why +
                                          "; set external_state_policy to warn or ignore to "
                                          "save it anyway");
      }
      if (options_.external_state_policy == ExternalStatePolicy::kWarn) {
        LogLine("warning: " + why + "; its checkpoint will not resume exactly");
      }
    }
    state_.clear();
    RETURN_IF_ERROR(iterator_->save(&state_).WithContext("saving the input iterator"));
    ASSIGN_OR_RETURN(registry_, state_.AsRegistry());
    RETURN_IF_ERROR(EnsureEngine());
    CheckpointMetadata metadata{
        step, options_.clock(), {{"model_step", std::to_string(step)}, {"kind", "input_pipeline"}}};
    // Never skipped: the input's position must not be lost.
    SubmitRequest request;
    request.metadata = std::move(metadata);
    return engine_->Submit(request).status();
  }

  Status Poll(RunContext* context) {
    std::lock_guard lock(mu_);
    if (!failure_.ok() && context != nullptr) context->request_stop();
    return Status::OK();
  }

  Status End(int64_t step) {
    Status status;
    if (!restore_done_) status = RestoreOrSaveInitial();
    if (status.ok() && schedule_.final_save_needed(step)) status = Save(step);
    Status saved = WaitUntilSaved();
    storage_.ReleaseLock();  // the engine is idle: every save is durable or failed
    return status.ok() ? saved : status;
  }

  Status WaitUntilSaved() {
    if (engine_) engine_->WaitAll();
    std::lock_guard lock(mu_);
    return failure_;
  }

  bool restore_done() const { return restore_done_; }
  const SaveSchedule& schedule() const { return schedule_; }
  // Whether a save is due after `step` on every worker (agreed under save_secs with a
  // coordinator).
  Result<bool> Due(int64_t step) { return schedule_.due_everywhere(step); }
  const std::string& restored_from() const { return restored_from_; }
  int64_t saves_committed() const {
    std::lock_guard lock(mu_);
    return committed_;
  }
  int64_t saves_failed() const {
    std::lock_guard lock(mu_);
    return failed_;
  }

 private:
  Status EnsureEngine() {
    if (engine_) return Status::OK();
    EngineOptions engine_options = EngineOptionsFor(saver_options_);
    engine_options.background_threads = 1;
    // Its saves are small: they must not wait behind the model's large ones for a worker, or a
    // crash finds the input's checkpoint of a step missing long after the model's committed.
    engine_options.high_priority = true;
    uint64_t budget = options_.staging_bytes;
    if (budget == 0) budget = iterator_->max_state_bytes();
    const bool bounded = budget != 0;
    if (!bounded) budget = 2 * state_.total_bytes();
    // Room for every entry's page rounding and for the largest chunk: no chunk outgrows a bound
    // on the state, but without one a later state may outgrow the first snapshot, and only a
    // whole chunk_bytes is sure to hold each of its chunks (a chunk over the budget fails).
    budget += (registry_.size() + 2) * 4096 +
              (bounded ? std::min<uint64_t>(options_.chunk_bytes, budget) : options_.chunk_bytes);
    engine_options.staging_bytes = budget;
    ASSIGN_OR_RETURN(engine_,
                     Engine::Create(engine_options, storage_.fs, storage_.manager.get(), &registry_,
                                    [this](const SaveStats& stats) { OnDone(stats); }));
    return Status::OK();
  }

  void OnDone(const SaveStats& stats) {
    std::lock_guard lock(mu_);
    if (stats.status.ok()) {
      ++committed_;
      return;
    }
    ++failed_;
    const Status failure = stats.status.WithContext("input pipeline checkpoint");
    if (options_.on_error == OnError::kContinue) {
      // Its model partner of this step, if committed, is then unpaired: a resume skips it.
      LogLine("an input pipeline save failed; training goes on: " + failure.ToString());
    } else if (failure_.ok()) {
      failure_ = failure;
    }
  }

  Status Restore(const std::string& path) {
    ASSIGN_OR_RETURN(auto reader,
                     CheckpointReader::Open(path, ReaderOptions{.file_system = storage_.fs}));
    IteratorState state;
    for (const TensorInfo& info : reader->tensors()) {
      std::vector<uint8_t> bytes(info.bytes);
      RETURN_IF_ERROR(reader->read(info.name, bytes.data(), bytes.size()));
      RETURN_IF_ERROR(state.put(info.name, info.dtype, info.shape, bytes));
    }
    LogLine("restored the input pipeline from " + path);
    return iterator_->restore(state).WithContext("restoring the input iterator from " + path);
  }

  const InputPipelineOptions options_;
  const SaverOptions saver_options_;
  const std::string state_file_;
  SaveableIterator* const iterator_;
  SaveSchedule schedule_;
  SaverStorage storage_;
  IteratorState state_;
  TensorRegistry registry_;  // points into state_; read by the engine only inside Submit
  std::unique_ptr<Engine> engine_;
  int64_t start_step_ = 0;
  bool restore_done_ = false;
  bool iterator_moved_ = false;  // once a session's steps may have consumed the iterator
  std::string restored_from_;

  mutable std::mutex mu_;
  Status failure_;  // the first failure, kept with OnError::kStop only
  int64_t committed_ = 0;
  int64_t failed_ = 0;
};

Result<std::unique_ptr<CheckpointInputPipelineHook>> CheckpointInputPipelineHook::Create(
    InputPipelineOptions options, SaveableIterator* iterator) {
  if (iterator == nullptr) return Status::InvalidArgument("the input iterator must not be null");
  if (options.coordinator != nullptr && options.coordinator->size() > 1) {
    const int size = options.coordinator->size();
    const int rank = options.coordinator->rank();
    if (options.num_workers == 1 && options.task_id == 0) {
      options.num_workers = size;
      options.task_id = rank;
    } else if (options.num_workers != size || options.task_id != rank) {
      return Status::InvalidArgument("num_workers " + std::to_string(options.num_workers) +
                                     " and task_id " + std::to_string(options.task_id) +
                                     " disagree with the coordinator's " + std::to_string(size) +
                                     " processes and rank " + std::to_string(rank));
    }
  }
  if (options.num_workers < 1 || options.task_id < 0 || options.task_id >= options.num_workers) {
    return Status::InvalidArgument(
        "task_id " + std::to_string(options.task_id) +
        " is not in [0, num_workers=" + std::to_string(options.num_workers) + ")");
  }
  if (options.num_workers > 1 && options.task_type.empty()) {
    return Status::InvalidArgument("task_type must be set when num_workers > 1");
  }
  const SaverOptions saver = AsSaverOptions(options);
  RETURN_IF_ERROR(ValidateSaverOptions(saver));
  if (!options.model_basename.empty()) {
    RETURN_IF_ERROR(ValidateCheckpointName(options.model_basename + "-0")
                        .WithContext("model_basename '" + options.model_basename +
                                     "' is not a plain file name"));
    if (options.model_basename == saver.basename) {
      return Status::InvalidArgument("model_basename '" + options.model_basename +
                                     "' must differ from the input checkpoints' basename");
    }
  }
  // Only the schedule is agreed across processes: the saver options themselves carry no
  // coordinator, so each worker's input checkpoints are written and committed as one process's.
  SaverOptions schedule_options = saver;
  schedule_options.coordinator = options.coordinator;
  ASSIGN_OR_RETURN(SaveSchedule schedule, SaveSchedule::Create(schedule_options));
  return std::unique_ptr<CheckpointInputPipelineHook>(new CheckpointInputPipelineHook(
      std::make_unique<Impl>(std::move(options), iterator, std::move(schedule))));
}

CheckpointInputPipelineHook::CheckpointInputPipelineHook(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
CheckpointInputPipelineHook::~CheckpointInputPipelineHook() = default;

Status CheckpointInputPipelineHook::begin() { return impl_->Begin(); }

Status CheckpointInputPipelineHook::after_create_session(int64_t global_step) {
  impl_->SetStartStep(global_step);
  return Status::OK();
}

Result<RunArgs> CheckpointInputPipelineHook::before_run(RunContext& context) {
  (void)context;
  if (!impl_->restore_done()) RETURN_IF_ERROR(impl_->RestoreOrSaveInitial());
  return RunArgs{};
}

Status CheckpointInputPipelineHook::after_run(RunContext& context, const RunValues& values) {
  (void)values;
  RETURN_IF_ERROR(impl_->Poll(&context));
  ASSIGN_OR_RETURN(const bool due, impl_->Due(context.step()));
  if (!due) return Status::OK();
  return impl_->Save(context.step());
}

Status CheckpointInputPipelineHook::end(int64_t global_step) { return impl_->End(global_step); }

const std::string& CheckpointInputPipelineHook::restored_from() const {
  return impl_->restored_from();
}

int64_t CheckpointInputPipelineHook::saves_committed() const { return impl_->saves_committed(); }

int64_t CheckpointInputPipelineHook::saves_failed() const { return impl_->saves_failed(); }

Status CheckpointInputPipelineHook::wait_until_saved() { return impl_->WaitUntilSaved(); }

Status CheckpointInputPipelineHook::before_recovery() {
  (void)impl_->WaitUntilSaved();  // a failure stays recorded: the next after_run stops the loop
  return Status::OK();
}

}  // namespace asyncckpt
