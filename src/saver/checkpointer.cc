// Checkpointer: the savers' machinery (SaverStorage, SaveSchedule, the engine, followed by a wait
// when synchronous) driven by explicit calls instead of hook callbacks, with the tensors handed
// over at every save.

#include "asyncckpt/checkpointer.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <mutex>

#include "src/engine/engine.h"
#include "src/format/format.h"
#include "src/format/writer.h"
#include "src/saver/saver_common.h"
#include "src/staging/staging_pool.h"
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

std::vector<format::HostTensor> Describe(const TensorRegistry& registry) {
  std::vector<format::HostTensor> tensors;
  tensors.reserve(registry.size());
  for (const TensorRef& ref : registry.tensors()) {
    tensors.push_back(format::HostTensor{ref.name, ref.dtype, ref.shape, ref.data, ref.bytes});
  }
  return tensors;
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
  Status read(const std::string& name, void* dst, size_t dst_bytes) override {
    return reader_->read(name, dst, dst_bytes);
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
  Impl(SaverOptions options, bool asynchronous, SaveSchedule schedule)
      : options_(std::move(options)), asynchronous_(asynchronous), schedule_(std::move(schedule)) {}

  ~Impl() { engine_.reset(); }  // waits for saves in flight before the storage goes

  Status Start() {
    ASSIGN_OR_RETURN(std::vector<std::string> removed, storage_.Start(options_));
    std::lock_guard lock(mu_);
    totals_.stale_temporaries_removed = std::move(removed);
    return Status::OK();
  }

  bool Due(int64_t step) const { return schedule_.due(step); }

  Result<bool> MaybeSave(int64_t step, const TensorRegistry& registry,
                         const std::map<std::string, std::string>& user_metadata) {
    // A failure reaches the loop at its next call, due or not, as after_run delivers it.
    if (closed_) return Status::FailedPrecondition("the checkpointer is closed");
    RETURN_IF_ERROR(StoppedBy());
    if (!schedule_.due(step)) return false;
    return Save(step, registry, user_metadata, /*may_skip=*/true);
  }

  Result<bool> Save(int64_t step, const TensorRegistry& registry,
                    const std::map<std::string, std::string>& user_metadata, bool may_skip) {
    if (closed_) return Status::FailedPrecondition("the checkpointer is closed");
    RETURN_IF_ERROR(StoppedBy());
    CheckpointMetadata metadata{step, options_.clock(), options_.user_metadata};
    for (const auto& [key, value] : user_metadata) metadata.user[key] = value;
    // Bad input is the caller's error, returned before the schedule moves or anything is written.
    const std::string name = format::CheckpointDirName(options_.basename, step);
    RETURN_IF_ERROR(format::ValidateTensors(Describe(registry)).WithContext(name));
    RETURN_IF_ERROR(format::ValidateMetadata(metadata).WithContext(name));
    if (asynchronous_) return SaveAsync(metadata, registry, may_skip);
    // Synchronous: the same engine, followed by a wait; blocked until durable.
    RETURN_IF_ERROR(SaveAsync(metadata, registry, /*may_skip=*/false).status());
    engine_->WaitAll();
    RETURN_IF_ERROR(StoppedBy());
    return true;
  }

  Status WaitUntilFinished() {
    if (engine_) engine_->WaitAll();
    return StoppedBy();
  }

  Status Close() {
    Status status = WaitUntilFinished();
    closed_ = true;
    // Every save is durable or failed: the directory is free for the next job (or for another
    // checkpointer of this process, as a restore after a `with` block opens one).
    engine_.reset();
    storage_.ReleaseLock();
    return status;
  }

  SaverTotals Totals() const {
    std::lock_guard lock(mu_);
    SaverTotals totals = totals_;
    totals.staging_high_water_bytes = staging_high_water_;
    return totals;
  }

  std::vector<int64_t> AllSteps() const {
    std::vector<int64_t> steps;
    const std::string prefix = options_.basename + "-";
    for (const std::string& name : storage_.manager->retained()) {
      if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
      int64_t step = 0;
      const char* first = name.data() + prefix.size();
      const char* last = name.data() + name.size();
      auto [end, error] = std::from_chars(first, last, step);
      if (error == std::errc() && end == last) steps.push_back(step);
    }
    return steps;
  }

  std::string CheckpointPath(int64_t step) const {
    return options_.checkpoint_dir + "/" + format::CheckpointDirName(options_.basename, step);
  }

  Result<std::unique_ptr<CheckpointReader>> Open(std::optional<int64_t> step) {
    if (!step) {
      std::vector<int64_t> steps = AllSteps();
      if (steps.empty()) {
        return Status::NotFound("no checkpoint in " + options_.checkpoint_dir);
      }
      step = steps.back();
    }
    const std::string name = format::CheckpointDirName(options_.basename, *step);
    // Pinned before the open, so that retention cannot delete it between the two.
    storage_.manager->Pin(name);
    ReaderOptions reader_options;
    reader_options.file_system = storage_.fs;
    auto reader = CheckpointReader::Open(CheckpointPath(*step), reader_options);
    if (!reader.ok()) {
      storage_.manager->Unpin(name);
      return reader.status();
    }
    return std::unique_ptr<CheckpointReader>(
        std::make_unique<PinnedReader>(std::move(reader).value(), storage_.manager.get(), name));
  }

 private:
  // The failure that stops this checkpointer (OnError::kStop), else OK.
  Status StoppedBy() {
    std::lock_guard lock(mu_);
    for (Status& failure : unreported_failures_) {
      if (options_.on_error == OnError::kStop) {
        if (first_error_.ok()) first_error_ = failure;
      } else {
        LogLine("a save failed; training goes on: " + failure.ToString());
      }
    }
    unreported_failures_.clear();
    return first_error_;
  }

  Result<bool> SaveAsync(const CheckpointMetadata& metadata, const TensorRegistry& registry,
                         bool may_skip) {
    RETURN_IF_ERROR(PrepareEngine(registry));
    schedule_.mark(metadata.step);
    SubmitRequest request;
    request.metadata = metadata;
    request.skip_if_busy = may_skip && options_.on_busy == OnBusy::kSkip;
    ASSIGN_OR_RETURN(const SubmitResult submitted, engine_->Submit(request));
    const SubmitOutcome outcome = submitted.outcome;
    std::lock_guard lock(mu_);
    // Every lease of a save is taken inside Submit: its high water is known now.
    staging_high_water_ = std::max(staging_high_water_, engine_->staging_high_water());
    if (outcome == SubmitOutcome::kSkipped) {
      ++totals_.saves_skipped;
      LogLine("skipped the save of step " + std::to_string(metadata.step) +
              ": staging is still busy");
      return false;
    }
    schedule_.mark_saved(metadata.step);
    return true;
  }

  // Points the engine at `registry`. The engine reads its registry only in Create and Submit, so
  // the copy it borrows is replaced here, between submits; a new engine (waiting for the saves
  // in flight) is needed only when staging must be pinned by another device or, sized by the
  // first snapshot (staging_bytes 0), is too small for this one.
  Status PrepareEngine(const TensorRegistry& registry) {
    const bool fits =
        engine_ && StagingDevice(registry) == staging_device_ &&
        (options_.staging_bytes != 0 ||
         SnapshotStagingBytes(registry, EngineOptionsFor(options_)) <= engine_->staging_budget());
    if (fits) {
      registry_ = registry;
      return Status::OK();
    }
    if (engine_) engine_->WaitAll();
    engine_.reset();
    registry_ = registry;
    staging_device_ = StagingDevice(registry);
    ASSIGN_OR_RETURN(engine_,
                     Engine::Create(EngineOptionsFor(options_), storage_.fs, storage_.manager.get(),
                                    &registry_, [this](const SaveStats& stats) { OnDone(stats); }));
    return Status::OK();
  }

  // From the engine's commit thread.
  void OnDone(SaveStats stats) {
    // A synchronous save blocks its caller until it is durable.
    if (!asynchronous_) stats.blocked_seconds = stats.seconds_to_durable;
    std::lock_guard lock(mu_);
    AddToTotals(stats, &totals_);
    if (!stats.status.ok()) unreported_failures_.push_back(stats.status);
  }

  const SaverOptions options_;
  const bool asynchronous_;
  SaveSchedule schedule_;
  SaverStorage storage_;
  TensorRegistry registry_;  // what the engine borrows; replaced between submits
  const Device* staging_device_ = nullptr;
  std::unique_ptr<Engine> engine_;
  bool closed_ = false;

  mutable std::mutex mu_;  // guards what the commit reports
  SaverTotals totals_;
  uint64_t staging_high_water_ = 0;  // over every engine so far
  std::vector<Status> unreported_failures_;
  Status first_error_;
};

Result<std::unique_ptr<Checkpointer>> Checkpointer::Create(SaverOptions options,
                                                           bool asynchronous) {
  RETURN_IF_ERROR(ValidateSaverOptions(options));
  if (options.coordinator != nullptr && options.coordinator->size() > 1) {
    // Its registry changes from save to save, so the ranks could not agree on it once.
    return Status::InvalidArgument(
        "Checkpointer saves one process; a multi-process job (coordinator of " +
        std::to_string(options.coordinator->size()) +
        " processes) uses CheckpointSaverHook or AsyncCheckpointSaverHook");
  }
  ASSIGN_OR_RETURN(SaveSchedule schedule, SaveSchedule::Create(options));
  auto impl = std::make_unique<Impl>(std::move(options), asynchronous, std::move(schedule));
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Checkpointer>(new Checkpointer(std::move(impl)));
}

Checkpointer::Checkpointer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpointer::~Checkpointer() = default;

bool Checkpointer::due(int64_t step) const { return impl_->Due(step); }

Status Checkpointer::save(int64_t step, const TensorRegistry& registry,
                          const std::map<std::string, std::string>& user_metadata) {
  return impl_->Save(step, registry, user_metadata, /*may_skip=*/false).status();
}

Result<bool> Checkpointer::maybe_save(int64_t step, const TensorRegistry& registry,
                                      const std::map<std::string, std::string>& user_metadata) {
  return impl_->MaybeSave(step, registry, user_metadata);
}

Status Checkpointer::wait_until_finished() { return impl_->WaitUntilFinished(); }

Status Checkpointer::close() { return impl_->Close(); }

SaverTotals Checkpointer::totals() const { return impl_->Totals(); }

std::vector<int64_t> Checkpointer::all_steps() const { return impl_->AllSteps(); }

std::optional<int64_t> Checkpointer::latest_step() const {
  std::vector<int64_t> steps = impl_->AllSteps();
  if (steps.empty()) return std::nullopt;
  return steps.back();
}

std::string Checkpointer::checkpoint_path(int64_t step) const {
  return impl_->CheckpointPath(step);
}

Result<std::unique_ptr<CheckpointReader>> Checkpointer::open(std::optional<int64_t> step) {
  return impl_->Open(step);
}

}  // namespace asyncckpt
