// Checkpointer: the saver core driven by explicit calls instead of hook callbacks, with the
// tensors handed over (and planned once) at every save.

#include "asyncckpt/checkpointer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <mutex>

#include "asyncckpt/state.h"
#include "src/engine/engine.h"
#include "src/format/format.h"
#include "src/saver/saver_core.h"
#include "src/saver/saver_start.h"
#include "src/state/checkpoint_names.h"
#include "src/state/committed_steps.h"
#include "src/state/state_claims.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {
namespace {

// The device whose pinned memory an engine stages through: the first non-host one, else null.
const Device* StagingDevice(const TensorRegistry& registry) {
  for (const TensorRef& ref : registry.tensors()) {
    if (ref.device && ref.device->kind() != DeviceKind::kHost) return ref.device.get();
  }
  return nullptr;
}

// Forwards to a reader and keeps its checkpoint pinned against retention while it lives.
class PinnedReader final : public CheckpointReader {
 public:
  PinnedReader(std::unique_ptr<CheckpointReader> reader, CheckpointManager* manager,
               std::string name)
      : reader_(std::move(reader)), manager_(manager), name_(std::move(name)) {}
  ~PinnedReader() override { manager_->Unpin(name_); }

  const std::string& path() const override { return reader_->path(); }
  const CheckpointMetadata& metadata() const override { return reader_->metadata(); }
  const std::vector<TensorInfo>& tensors() const override { return reader_->tensors(); }
  const TensorInfo* find(const std::string& name) const override { return reader_->find(name); }
  uint32_t num_data_files() const override { return reader_->num_data_files(); }
  bool sharded() const override { return reader_->sharded(); }
  uint32_t world_size() const override { return reader_->world_size(); }
  ReadStats read_stats() const override { return reader_->read_stats(); }
  Status read(const std::string& name, void* dst, size_t dst_bytes) override {
    return reader_->read(name, dst, dst_bytes);
  }
  Status read_box(const std::string& name, const std::vector<int64_t>& offset,
                  const std::vector<int64_t>& shape, void* dst, size_t dst_bytes) override {
    return reader_->read_box(name, offset, shape, dst, dst_bytes);
  }
  Status restore(const TensorRegistry& registry) override { return reader_->restore(registry); }
  VerifyReport verify() override { return reader_->verify(); }

 private:
  std::unique_ptr<CheckpointReader> reader_;
  CheckpointManager* const manager_;
  const std::string name_;
};

}  // namespace

class Checkpointer::Impl {
 public:
  Impl(std::unique_ptr<SaverCore> core, SaveMode mode) : core_(std::move(core)), mode_(mode) {}
  // The saves in flight are waited for while the registry the engine borrows still lives.
  ~Impl() {
    (void)AwaitPreparation();
    core_.reset();
  }

  Status Start() {
    RETURN_IF_ERROR(core_->StartStorage());
    started_ = true;
    return Status::OK();
  }

  // A deferred start happens at the first save.
  Status StartIfDeferred() { return started_ ? Status::OK() : Start(); }

  // The file system reads go through before the start opened the saver's own.
  io::FileSystem* ReadFs() const { return started_ ? core_->fs() : core_->options().file_system; }

  Result<std::vector<std::string>> Damaged() const {
    std::unique_ptr<io::FileSystem> posix;
    io::FileSystem* fs = ReadFs();
    if (fs == nullptr) fs = (posix = io::NewPosixFileSystem()).get();
    return FindDamagedCheckpoints(
        *fs, core_->options().checkpoint_dir, core_->options().basename,
        [fs](const std::string& path) { return ValidateCheckpointDirectory(*fs, path); });
  }

  bool Due(int64_t step) const { return core_->schedule().due(step); }

  Result<bool> MaybeSave(int64_t step, const TensorRegistry& registry,
                         const std::map<std::string, std::string>& user_metadata) {
    // A failure reaches the loop at its next call, due or not, as after_run delivers it.
    if (closed_) return Status::FailedPrecondition("the checkpointer is closed");
    RETURN_IF_ERROR(core_->Deliver(nullptr));
    if (!core_->schedule().due(step)) return false;
    return Save(step, registry, user_metadata, /*may_skip=*/true);
  }

  // One process: bad input is returned here, and the engine is created on a thread of its own
  // (see preparing_), so the caller goes on at once. Several: collective, on this thread.
  Status Prepare(const TensorRegistry& registry, uint64_t reserve_bytes) {
    if (closed_) return Status::FailedPrecondition("the checkpointer is closed");
    if (MultiProcess()) return StartAcrossRanks(registry);
    if (Status earlier = AwaitPreparation(); !earlier.ok()) LogWarning(earlier.ToString());
    // Preparing announces saves: a deferred start (lock, clean-up, quarantine) happens here.
    RETURN_IF_ERROR(StartIfDeferred());
    ASSIGN_OR_RETURN(SnapshotPlan plan, PlanSnapshot(registry, core_->engine_options(), "prepare"));
    RETURN_IF_ERROR(StagingBudget(plan.staging, core_->options(), mode_).status());
    reserve_bytes_ = std::max(reserve_bytes_, reserve_bytes);
    StartPreparing(registry, std::move(plan));
    return Status::OK();
  }

  // A resume's next save holds what the checkpoint it resumes from holds, so staging can be
  // sized from that checkpoint's index before the state exists: the training thread's restore
  // and the faulting-in of staging then overlap.
  Result<bool> PrepareLikeLatest() {
    if (closed_) return Status::FailedPrecondition("the checkpointer is closed");
    if (MultiProcess()) {
      return Status::FailedPrecondition(
          "prepare_like_latest is for one process: a job of "
          "several prepares with prepare(), on every rank");
    }
    if (Status earlier = AwaitPreparation(); !earlier.ok()) LogWarning(earlier.ToString());
    // Sized before the start, so that a directory with nothing to resume is not locked yet.
    Result<std::unique_ptr<CheckpointReader>> latest = Open(std::nullopt);
    if (latest.status().code() == StatusCode::kNotFound) return false;
    RETURN_IF_ERROR(latest.status().WithContext("sizing staging like the latest checkpoint"));
    SnapshotPlan plan = PlanLike(**latest);
    latest->reset();  // closed before the start, which may quarantine it
    RETURN_IF_ERROR(StagingBudget(plan.staging, core_->options(), mode_).status());
    RETURN_IF_ERROR(StartIfDeferred());
    StartPreparing(TensorRegistry(), std::move(plan));
    return true;
  }

  // The plan of a host state shaped as `checkpoint`'s tensors: sizes alone, since PlanChunks
  // reads no data (sharded: its global tensors, as one process restores them).
  SnapshotPlan PlanLike(const CheckpointReader& checkpoint) const {
    SnapshotPlan plan;
    for (const TensorInfo& info : checkpoint.tensors()) {
      plan.tensors.push_back(
          format::HostTensor{info.name, info.dtype, info.shape, nullptr, info.bytes});
    }
    const SaverOptions& options = core_->options();
    plan.jobs = format::PlanChunks(plan.tensors, options.chunk_bytes, options.num_data_files);
    plan.staging = StagingNeedOf(plan.jobs);
    return plan;
  }

  void StartPreparing(TensorRegistry registry, SnapshotPlan plan) {
    preparing_ = std::async(std::launch::async,
                            [this, registry = std::move(registry), plan = std::move(plan)] {
                              return PrepareEngine(registry, plan);
                            });
  }

  Result<bool> Save(int64_t step, const TensorRegistry& registry,
                    const std::map<std::string, std::string>& user_metadata, bool may_skip) {
    // Blocked time counts from here: planning and a new engine are the caller's wait too.
    const auto started = SteadyClock::now();
    if (closed_) return Status::FailedPrecondition("the checkpointer is closed");
    if (MultiProcess()) return SaveAcrossRanks(step, registry, user_metadata, started);
    // A failed preparation is only logged: PrepareEngine below tries again, and returns its
    // own error if it fails too.
    if (Status prepared = AwaitPreparation(); !prepared.ok()) LogWarning(prepared.ToString());
    RETURN_IF_ERROR(StartIfDeferred());
    RETURN_IF_ERROR(core_->Deliver(nullptr));
    const SaverOptions& options = core_->options();
    CheckpointMetadata metadata{step, options.clock(), options.user_metadata};
    for (const auto& [key, value] : user_metadata) metadata.user[key] = value;
    // Bad input is the caller's error, returned before the schedule moves or anything is written:
    // the tensors are checked by the plan made here (the one the engine uses), the step and the
    // metadata by the engine's Submit.
    const std::string name = format::CheckpointDirName(options.basename, step);
    ASSIGN_OR_RETURN(SnapshotPlan plan, PlanSnapshot(registry, core_->engine_options(), name));
    RETURN_IF_ERROR(PrepareEngine(registry, plan));
    CoreSaveRequest request;
    request.metadata = std::move(metadata);
    request.may_skip = may_skip;
    request.plan = std::move(plan);
    request.started = started;
    ASSIGN_OR_RETURN(const CoreSaveResult saved, core_->Save(std::move(request)));
    if (mode_ == SaveMode::kSynchronous && !saved.stats.status.ok()) {
      core_->RecordFailure(saved.stats.status);
    }
    if (mode_ == SaveMode::kSynchronous) RETURN_IF_ERROR(core_->Deliver(nullptr));
    return saved.saved;
  }

  // In a multi-process job every rank returns the same status, and only once rank 0 has
  // committed and listed every save: the ranks agree after waiting (collective).
  Status WaitUntilFinished() {
    if (Status prepared = AwaitPreparation(); !prepared.ok()) LogWarning(prepared.ToString());
    const Status waited = core_->WaitUntilSaved();
    return MultiProcess() && started_ ? AgreeStarted(core_->options(), waited) : waited;
  }

  bool WaitForFinishedSaves(int64_t finished, double timeout_seconds) const {
    return core_->WaitForFinishedSaves(finished, timeout_seconds);
  }

  Status Close() {
    if (Status prepared = AwaitPreparation(); !prepared.ok()) LogWarning(prepared.ToString());
    if (closed_) return core_->WaitUntilSaved();
    closed_ = true;
    // Every save is durable or failed: the directory is free for the next job (or for another
    // checkpointer of this process, as a restore after a `with` block opens one).
    const Status finished = core_->Finish(std::nullopt);
    return MultiProcess() && started_ ? AgreeStarted(core_->options(), finished) : finished;
  }

  SaverTotals Totals() const { return core_->totals(); }

  std::vector<int64_t> AllSteps() const {
    // Rank 0 alone commits and writes the state file: the other ranks read it, as does a
    // checkpointer not yet started, changing nothing.
    if (!started_ || (MultiProcess() && core_->options().coordinator->rank() != 0)) {
      const SaverOptions& options = core_->options();
      std::unique_ptr<io::FileSystem> posix;
      io::FileSystem* fs = ReadFs();
      if (fs == nullptr) fs = (posix = io::NewPosixFileSystem()).get();
      Result<ResumeCheckpoints> resume = ResolveResumeCheckpoints(
          *fs, options.checkpoint_dir, options.basename, kCheckpointStateFileName,
          [fs](const std::string& path) { return ValidateCheckpointDirectory(*fs, path); },
          options.best_mode == BestMode::kNone ? options.max_to_keep : 0, options.keep_period);
      return resume.ok() ? resume->steps : std::vector<int64_t>();
    }
    std::vector<int64_t> steps;
    for (const std::string& name : core_->manager()->retained()) {
      if (auto step = CheckpointStep(name, core_->options().basename)) steps.push_back(*step);
    }
    return steps;
  }

  Status Quarantine(int64_t step, const std::string& why) {
    const SaverOptions& options = core_->options();
    std::unique_ptr<io::FileSystem> posix;
    io::FileSystem* fs = started_ ? core_->fs() : ReadFs();
    if (fs == nullptr) fs = (posix = io::NewPosixFileSystem()).get();
    return QuarantineFoundDamage(*fs, options.checkpoint_dir, kCheckpointStateFileName,
                                 format::CheckpointDirName(options.basename, step), why)
        .status();
  }

  std::string CheckpointPath(int64_t step) const {
    const SaverOptions& options = core_->options();
    return options.checkpoint_dir + "/" + format::CheckpointDirName(options.basename, step);
  }

  Result<std::unique_ptr<CheckpointReader>> Open(std::optional<int64_t> step) {
    if (!step) {
      std::vector<int64_t> steps = AllSteps();
      if (steps.empty()) {
        return Status::NotFound("no checkpoint in " + core_->options().checkpoint_dir);
      }
      step = steps.back();
    }
    const std::string name = format::CheckpointDirName(core_->options().basename, *step);
    ReaderOptions reader_options;
    reader_options.file_system = ReadFs();
    // Before a deferred start nothing of this checkpointer deletes: no pin is needed.
    if (!started_) return CheckpointReader::Open(CheckpointPath(*step), reader_options);
    // Pinned before the open, so that retention cannot delete it between the two.
    core_->manager()->Pin(name);
    auto reader = CheckpointReader::Open(CheckpointPath(*step), reader_options);
    if (!reader.ok()) {
      core_->manager()->Unpin(name);
      return reader.status();
    }
    return std::unique_ptr<CheckpointReader>(
        std::make_unique<PinnedReader>(std::move(reader).value(), core_->manager(), name));
  }

 private:
  bool MultiProcess() const {
    const Coordinator* coordinator = core_->options().coordinator;
    return coordinator != nullptr && coordinator->size() > 1;
  }

  // Multi-process jobs (collective): the start (rank 0 locks and cleans up, every rank learns
  // the job token and attaches) and an engine over this rank's part of `registry`, created on
  // every rank or on none.
  Status StartAcrossRanks(const TensorRegistry& registry) {
    if (started_) return Status::OK();
    RETURN_IF_ERROR(core_->StartWithEngine(registry));
    started_ = true;
    return Status::OK();
  }

  // A save of a multi-process job (collective: every rank saves `step`, in the same order).
  // Every rank's tensors may change between saves, so the ranks agree again on who writes
  // what, and a rank's failure kept from an earlier save fails every rank's save, naming it;
  // the engine's sharded commit then makes the checkpoint visible once every part is durable.
  Result<bool> SaveAcrossRanks(int64_t step, const TensorRegistry& registry,
                               const std::map<std::string, std::string>& user_metadata,
                               SteadyClock::time_point started) {
    if (!started_) {
      RETURN_IF_ERROR(StartAcrossRanks(registry));
    } else {
      ASSIGN_OR_RETURN(const bool changed,
                       core_->AgreeOnWritten(registry, core_->Deliver(nullptr)));
      if (changed) RETURN_IF_ERROR(core_->RecreateEngineAcrossRanks());
    }
    const SaverOptions& options = core_->options();
    CoreSaveRequest request;
    request.metadata = CheckpointMetadata{step, options.clock(), options.user_metadata};
    for (const auto& [key, value] : user_metadata) request.metadata.user[key] = value;
    request.started = started;
    ASSIGN_OR_RETURN(const CoreSaveResult saved, core_->Save(std::move(request)));
    if (mode_ == SaveMode::kSynchronous) {
      if (!saved.stats.status.ok()) core_->RecordFailure(saved.stats.status);
      RETURN_IF_ERROR(core_->Deliver(nullptr));
    }
    return saved.saved;
  }

  // Points the engine at `registry`, whose plan is `plan`. The engine reads its registry only in
  // Create and Submit, so the copy it borrows is replaced here, between submits; a new engine
  // (waiting for the saves in flight) is needed only when staging must be pinned by another
  // device or, sized from an earlier state (staging_bytes 0), is smaller than this one's would be.
  Status PrepareEngine(const TensorRegistry& registry, const SnapshotPlan& plan) {
    ASSIGN_OR_RETURN(const uint64_t budget, StagingBudget(plan.staging, core_->options(), mode_));
    const uint64_t wanted = std::max(budget, reserve_bytes_);
    const bool fits = core_->has_engine() && StagingDevice(registry) == staging_device_ &&
                      wanted <= core_->staging_budget();
    registry_ = registry;
    if (fits) return Status::OK();
    staging_device_ = StagingDevice(registry);
    EngineOptions engine_options = core_->engine_options();
    engine_options.staging_budget = wanted;
    return core_->CreateEngine(&registry_, plan, engine_options);
  }

  // The preparation's outcome; OK when none was started or it was awaited already.
  Status AwaitPreparation() {
    if (!preparing_.valid()) return Status::OK();
    return preparing_.get().WithContext("preparing the engine and its staging in the background");
  }

  std::unique_ptr<SaverCore> core_;
  const SaveMode mode_;
  // Creating the engine touches and registers every page of staging: seconds per GiB, which
  // the training thread should not wait for before its first save. Save, wait_until_finished,
  // close and a later prepare await it; due() reads only the schedule and the read-only calls
  // only the storage started before it, so they do not.
  std::future<Status> preparing_;
  TensorRegistry registry_;  // what the engine borrows; replaced between submits
  const Device* staging_device_ = nullptr;
  uint64_t reserve_bytes_ = 0;  // staging asked for by prepare(), kept by later engines
  bool closed_ = false;
  std::atomic<bool> started_{false};  // read by the read-only calls of any thread
};

Result<std::unique_ptr<Checkpointer>> Checkpointer::Create(SaverOptions options, SaveMode mode,
                                                           CheckpointerStart start) {
  // A job of several processes starts collectively, with the tensors: at its first save.
  const bool collective = options.coordinator != nullptr && options.coordinator->size() > 1;
  SaverCoreSetup setup;
  setup.mode = mode;
  setup.save_noun = "a save";
  ASSIGN_OR_RETURN(auto core, SaverCore::Create(std::move(options), std::move(setup)));
  if (start == CheckpointerStart::kAtFirstSave) {
    // A deferred start would find this refusal only at the first save, after the training it
    // was to keep; read now, changing nothing.
    const SaverOptions& checked = core->options();
    std::unique_ptr<io::FileSystem> posix;
    io::FileSystem* fs = checked.file_system;
    if (fs == nullptr) fs = (posix = io::NewPosixFileSystem()).get();
    RETURN_IF_ERROR(CheckBasenameUnclaimed(*fs, checked.checkpoint_dir, checked.basename,
                                           kCheckpointStateFileName));
  }
  auto impl = std::make_unique<Impl>(std::move(core), mode);
  if (start == CheckpointerStart::kAtCreate && !collective) RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Checkpointer>(new Checkpointer(std::move(impl)));
}

Checkpointer::Checkpointer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpointer::~Checkpointer() = default;

bool Checkpointer::due(int64_t step) const { return impl_->Due(step); }

Status Checkpointer::save(int64_t step, const TensorRegistry& registry,
                          const std::map<std::string, std::string>& user_metadata) {
  return impl_->Save(step, registry, user_metadata, /*may_skip=*/false).status();
}

Status Checkpointer::prepare(const TensorRegistry& registry, uint64_t reserve_bytes) {
  return impl_->Prepare(registry, reserve_bytes);
}

Result<bool> Checkpointer::prepare_like_latest() { return impl_->PrepareLikeLatest(); }

Result<bool> Checkpointer::maybe_save(int64_t step, const TensorRegistry& registry,
                                      const std::map<std::string, std::string>& user_metadata) {
  return impl_->MaybeSave(step, registry, user_metadata);
}

Status Checkpointer::wait_until_finished() { return impl_->WaitUntilFinished(); }

bool Checkpointer::wait_for_finished_saves(int64_t finished, double timeout_seconds) const {
  return impl_->WaitForFinishedSaves(finished, timeout_seconds);
}

Status Checkpointer::close() { return impl_->Close(); }

SaverTotals Checkpointer::totals() const { return impl_->Totals(); }

std::vector<int64_t> Checkpointer::all_steps() const { return impl_->AllSteps(); }

Result<std::vector<std::string>> Checkpointer::damaged() const { return impl_->Damaged(); }

std::optional<int64_t> Checkpointer::latest_step() const {
  std::vector<int64_t> steps = impl_->AllSteps();
  if (steps.empty()) return std::nullopt;
  return steps.back();
}

Status Checkpointer::quarantine(int64_t step, const std::string& why) {
  return impl_->Quarantine(step, why);
}

std::string Checkpointer::checkpoint_path(int64_t step) const {
  return impl_->CheckpointPath(step);
}

Result<std::unique_ptr<CheckpointReader>> Checkpointer::open(std::optional<int64_t> step) {
  return impl_->Open(step);
}

}  // namespace asyncckpt
