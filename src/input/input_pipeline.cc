// CheckpointInputPipelineHook and IteratorState: the input pipeline's checkpoints, beside the
// model's, through their own engine, basename and state file.

#include "asyncckpt/input_pipeline.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string_view>
#include <utility>

#include "asyncckpt/reader.h"
#include "asyncckpt/state.h"
#include "src/format/format.h"
#include "src/saver/saver_core.h"
#include "src/saver/saver_storage.h"
#include "src/staging/staging_pool.h"
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

Result<TensorRegistry> IteratorState::as_registry() const {
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

// The saver options the input hook's storage and engine use: the user's, with what the hook
// decides itself (see InputPipelineOptions::saver). The coordinator stays out: each worker's
// input checkpoints are written and committed as one process's.
SaverOptions InputSaverOptions(const InputPipelineOptions& options) {
  SaverOptions saver = options.saver;
  saver.basename = InputCheckpointBasename(options);
  saver.paired_input_basename.clear();
  saver.num_data_files = 1;
  saver.background_threads = 1;
  saver.on_busy = OnBusy::kWait;
  saver.cuda_stream_ordered = false;
  saver.coordinator = nullptr;
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
    LogWarning("" + dir + " holds " + std::to_string(model.size()) + " complete " + model_basename +
               " and " + std::to_string(input.size()) + " complete " + input_basename +
               " checkpoints, but no step has both");
  }
  return std::optional<int64_t>();
}

class CheckpointInputPipelineHook::Impl {
 public:
  Impl(InputPipelineOptions options, SaveableIterator* iterator, std::unique_ptr<SaverCore> core)
      : options_(std::move(options)),
        state_file_(InputStateFileName(options_)),
        iterator_(iterator),
        core_(std::move(core)) {}

  Status Begin() { return core_->StartStorage(); }

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
    core_->WaitAll();
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
        core_->WaitAll();
        return Status::OK();
      }
      return Status::FailedPrecondition(
          "the re-created session starts at step " + std::to_string(start_step_) + " but " +
          core_->options().checkpoint_dir + " has no input checkpoint " + StartName() +
          " to restore, and the input iterator has moved past its initial state");
    }
    RETURN_IF_ERROR(Restore(path));
    restored_from_ = path;
    if (path != core_->options().checkpoint_dir + "/" + StartName()) {
      // Another worker's position: saved as this worker's own at once, so that the step's
      // set of input checkpoints under this job's workers is complete.
      return Save(start_step_);
    }
    core_->schedule().mark(start_step_);
    core_->schedule().mark_saved(start_step_);
    return Status::OK();
  }

  // The input checkpoint of the starting step; "" when there is none to restore (a fresh start
  // at step 0). At a later step without one: FailedPrecondition, or the latest one when the
  // options ask for TensorFlow's behaviour.
  Result<std::string> CheckpointToRestore() {
    const std::string& dir = core_->options().checkpoint_dir;
    const std::string exact = dir + "/" + RestoreName();
    io::EntryType type = io::EntryType::kNone;
    RETURN_IF_ERROR(ToStatus(core_->fs()->entry_type(exact, &type, io::Symlinks::kFollow)));
    if (type == io::EntryType::kDirectory) return exact;
    if (start_step_ == 0) return std::string();
    if (!options_.restore_latest_when_step_missing) {
      return Status::FailedPrecondition(
          "the session starts at step " + std::to_string(start_step_) + " but " + dir +
          " has no input checkpoint " + RestoreName() +
          "; resuming the input from another step would pair the model with another input "
          "position (restore_latest_when_step_missing allows it)");
    }
    auto latest = LatestCheckpoint(dir, state_file_, core_->fs());
    if (latest.status().code() == StatusCode::kNotFound) return std::string();
    RETURN_IF_ERROR(latest.status());
    LogWarning("no input checkpoint for step " + std::to_string(start_step_) +
               "; restoring the latest one, " + *latest);
    return *latest;
  }

  // The checkpoint of the starting step to restore: this worker's own, or the one
  // options_.restore_basename names.
  std::string RestoreName() const {
    const std::string other =
        options_.restore_basename ? options_.restore_basename(start_step_) : std::string();
    return other.empty() ? StartName() : format::CheckpointDirName(other, start_step_);
  }

  std::string StartName() const { return StepName(start_step_); }

  std::string StepName(int64_t step) const {
    return format::CheckpointDirName(core_->options().basename, step);
  }

  Status Save(int64_t step) {
    core_->schedule().mark(step);
    core_->schedule().mark_saved(step);
    RETURN_IF_ERROR(CheckExternalState());
    state_.clear();
    RETURN_IF_ERROR(iterator_->save(&state_).WithContext("saving the input iterator"));
    ASSIGN_OR_RETURN(registry_, state_.as_registry());
    ASSIGN_OR_RETURN(SnapshotPlan plan,
                     PlanSnapshot(registry_, core_->engine_options(), StepName(step)));
    RETURN_IF_ERROR(EnsureEngine(plan));
    CheckpointMetadata metadata{step,
                                core_->options().clock(),
                                {{"model_step", std::to_string(step)}, {"kind", "input_pipeline"}}};
    // Never skipped: the input's position must not be lost.
    CoreSaveRequest request;
    request.metadata = std::move(metadata);
    request.plan = std::move(plan);
    return core_->Save(std::move(request)).status();
  }

  Status Poll(RunContext& context) {
    (void)core_->Deliver(&context);
    return Status::OK();
  }

  Status End(int64_t step) {
    // Matched with a rank still training's Due(), like the model saver's end.
    Status status = core_->AnnounceEnd(step);
    if (status.ok() && !restore_done_) status = RestoreOrSaveInitial();
    if (status.ok() && core_->schedule().final_save_needed(step)) status = Save(step);
    Status finished = core_->Finish(std::nullopt);
    return status.ok() ? finished : status;
  }

  Status WaitUntilSaved() { return core_->WaitUntilSaved(); }

  bool restore_done() const { return restore_done_; }
  // Whether a save is due after `step` on every worker (agreed under save_secs with a
  // coordinator).
  Result<bool> Due(int64_t step) { return core_->schedule().due_everywhere(step); }
  const std::string& restored_from() const { return restored_from_; }
  int64_t saves_committed() const { return core_->totals().saves_committed; }
  int64_t saves_failed() const { return core_->totals().saves_failed; }

 private:
  Status CheckExternalState() const {
    if (!iterator_->has_external_state()) return Status::OK();
    const std::string why = "the input iterator depends on external state it cannot save";
    if (options_.external_state_policy == ExternalStatePolicy::kFail) {
      return Status::FailedPrecondition(why +
                                        "; set external_state_policy to warn or ignore to "
                                        "save it anyway");
    }
    if (options_.external_state_policy == ExternalStatePolicy::kWarn) {
      LogWarning("" + why + "; its checkpoint will not resume exactly");
    }
    return Status::OK();
  }

  // The engine, made at the first save from its plan. Its staging must hold every later state
  // too: a bound on the state (the iterator's, else twice the first snapshot), with room for
  // every entry's page rounding and for one more chunk, since without a bound a later state may
  // outgrow the first snapshot and only a whole chunk_bytes is sure to hold each of its chunks.
  Status EnsureEngine(const SnapshotPlan& plan) {
    if (core_->has_engine()) return Status::OK();
    const uint64_t chunk_bytes = core_->options().chunk_bytes;
    uint64_t bound = iterator_->max_state_bytes();
    const bool bounded = bound != 0;
    if (!bounded) bound = 2 * state_.total_bytes();
    const StagingNeed need{
        .snapshot_bytes = bound + (registry_.size() + 2) * StagingPool::kPageBytes +
                          (bounded ? std::min<uint64_t>(chunk_bytes, bound) : chunk_bytes),
        .largest_chunk_bytes = plan.staging.largest_chunk_bytes};
    EngineOptions engine_options = core_->engine_options();
    ASSIGN_OR_RETURN(engine_options.staging_budget,
                     StagingBudget(need, core_->options(), SaveMode::kAsynchronous));
    // Its saves are small: they must not wait behind the model's large ones for a worker, or a
    // crash finds the input's checkpoint of a step missing long after the model's committed.
    engine_options.high_priority = true;
    return core_->CreateEngine(&registry_, plan, engine_options);
  }

  Status Restore(const std::string& path) {
    ASSIGN_OR_RETURN(auto reader,
                     CheckpointReader::Open(path, ReaderOptions{.file_system = core_->fs()}));
    IteratorState state;
    for (const TensorInfo& info : reader->tensors()) {
      std::vector<uint8_t> bytes(info.bytes);
      RETURN_IF_ERROR(reader->read(info.name, bytes.data(), bytes.size()));
      RETURN_IF_ERROR(state.put(info.name, info.dtype, info.shape, bytes));
    }
    LogInfo("restored the input pipeline from " + path);
    return iterator_->restore(state).WithContext("restoring the input iterator from " + path);
  }

  const InputPipelineOptions options_;
  const std::string state_file_;
  SaveableIterator* const iterator_;
  IteratorState state_;
  TensorRegistry registry_;  // points into state_; read by the engine only inside Submit
  int64_t start_step_ = 0;
  bool restore_done_ = false;
  bool iterator_moved_ = false;  // once a session's steps may have consumed the iterator
  std::string restored_from_;
  std::unique_ptr<SaverCore> core_;  // last: waits for the saves in flight first
};

Result<std::unique_ptr<CheckpointInputPipelineHook>> CheckpointInputPipelineHook::Create(
    InputPipelineOptions options, SaveableIterator* iterator) {
  if (iterator == nullptr) return Status::InvalidArgument("the input iterator must not be null");
  Coordinator* const coordinator = options.saver.coordinator;
  if (coordinator != nullptr && coordinator->size() > 1) {
    const int size = coordinator->size();
    const int rank = coordinator->rank();
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
  const SaverOptions saver = InputSaverOptions(options);
  if (!options.model_basename.empty()) {
    RETURN_IF_ERROR(ValidateCheckpointName(options.model_basename + "-0")
                        .WithContext("model_basename '" + options.model_basename +
                                     "' is not a plain file name"));
    if (options.model_basename == saver.basename) {
      return Status::InvalidArgument("model_basename '" + options.model_basename +
                                     "' must differ from the input checkpoints' basename");
    }
  }
  SaverCoreSetup setup;
  setup.state_file_name = InputStateFileName(options);
  // Only the schedule is agreed across processes: the saver options themselves carry no
  // coordinator, so each worker's input checkpoints are written and committed as one process's.
  setup.schedule_coordinator = coordinator;
  setup.failure_context = "input pipeline checkpoint";
  setup.save_noun = "an input pipeline save";
  if (!options.model_basename.empty()) {
    setup.partner = {options.model_basename, kCheckpointStateFileName};
  }
  ASSIGN_OR_RETURN(auto core, SaverCore::Create(saver, std::move(setup)));
  return std::unique_ptr<CheckpointInputPipelineHook>(new CheckpointInputPipelineHook(
      std::make_unique<Impl>(std::move(options), iterator, std::move(core))));
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
  RETURN_IF_ERROR(impl_->Poll(context));
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
