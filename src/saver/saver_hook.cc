// CheckpointSaverHook: the synchronous saver. Every save is the engine's save followed by a wait,
// so the training thread is blocked until it is durable; it is the baseline the asynchronous hook
// is measured against, and writes the same bytes.

#include "asyncckpt/saver_hook.h"

#include <mutex>
#include <vector>

#include "src/saver/saver_common.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

class CheckpointSaverHook::Impl {
 public:
  Impl(SaverOptions options, const TensorRegistry* registry,
       std::vector<CheckpointSaverListener*> listeners, SaveSchedule schedule)
      : options_(std::move(options)),
        registry_(registry),
        listeners_(std::move(listeners)),
        schedule_(std::move(schedule)) {}

  Status Begin() {
    ASSIGN_OR_RETURN(SaverStart start, StartSaver(options_, *registry_, &storage_));
    totals_.stale_temporaries_removed = std::move(start.removed);
    written_ = std::move(start.written);
    Result<std::unique_ptr<Engine>> engine = Engine::Create(
        EngineOptionsFor(options_, std::move(start.job_token)), storage_.fs, storage_.manager.get(),
        written_ ? written_.get() : registry_, [this](const SaveStats& stats) {
          std::lock_guard lock(done_mu_);
          done_ = stats;
        });
    // Every rank of a job learns whether every rank has an engine, so that none trains alone.
    RETURN_IF_ERROR(AgreeStarted(options_, engine.status()));
    engine_ = std::move(engine).value();
    for (auto* listener : listeners_) listener->begin();
    return Status::OK();
  }

  // Saves `step`; *stop is set when a listener asks the loop to stop.
  // Whether a save is due after `step` on every rank (a collective under save_secs with a
  // coordinator).
  Result<bool> Due(int64_t step) { return schedule_.due_everywhere(step); }

  Status Save(int64_t step, bool* stop) {
    if (!engine_) return Status::FailedPrecondition("CheckpointSaverHook: begin() not called");
    schedule_.mark(step);
    schedule_.mark_saved(step);
    for (auto* listener : listeners_) listener->before_save(step);
    const auto start = SteadyClock::now();
    SaveStats stats =
        SaveAndWait(CheckpointMetadata{step, options_.clock(), options_.user_metadata});
    stats.seconds_to_durable = SecondsSince(start);
    stats.blocked_seconds = stats.seconds_to_durable;
    totals_.staging_high_water_bytes = engine_->staging_high_water();
    AddToTotals(stats, &totals_);
    *stop = NotifyAfterSave(listeners_, step, stats) || *stop;
    return stats.status;
  }

  Status End(int64_t step) {
    Status status;
    if (schedule_.final_save_needed(step)) {
      bool stop = false;
      status = Save(step, &stop);
    }
    for (auto* listener : listeners_) listener->end(step);
    storage_.ReleaseLock();  // every save of this hook is durable or failed by now
    return status;
  }

  const SaveSchedule& schedule() const { return schedule_; }
  SaverTotals totals() const {
    SaverTotals totals = totals_;
    if (storage_.manager) totals.retention_failures = storage_.manager->retention_failures();
    return totals;
  }

 private:
  // The engine's report of the save, once durable (on_done runs before WaitAll returns).
  SaveStats SaveAndWait(const CheckpointMetadata& metadata) {
    SaveStats failed;
    failed.step = metadata.step;
    failed.final_level = options_.compression.level;
    SubmitRequest request;
    request.metadata = metadata;
    Result<SubmitResult> submitted = engine_->Submit(request);
    if (!submitted.ok()) {
      failed.status = submitted.status();
      return failed;
    }
    engine_->WaitAll();
    std::lock_guard lock(done_mu_);
    return done_;
  }

  SaverOptions options_;
  const TensorRegistry* registry_;
  std::vector<CheckpointSaverListener*> listeners_;
  SaveSchedule schedule_;
  SaverStorage storage_;
  // Multi-process jobs: what this rank writes (the engine's registry); null in one process.
  std::unique_ptr<TensorRegistry> written_;
  SaverTotals totals_;
  std::mutex done_mu_;
  SaveStats done_;                  // written by on_done, read after WaitAll
  std::unique_ptr<Engine> engine_;  // after storage_: destroyed (and waited for) first
};

Result<std::unique_ptr<CheckpointSaverHook>> CheckpointSaverHook::Create(
    SaverOptions options, const TensorRegistry* registry,
    std::vector<CheckpointSaverListener*> listeners) {
  if (registry == nullptr) return Status::InvalidArgument("the tensor registry must not be null");
  RETURN_IF_ERROR(ValidateSaverOptions(options));
  ASSIGN_OR_RETURN(SaveSchedule schedule, SaveSchedule::Create(options));
  return std::unique_ptr<CheckpointSaverHook>(new CheckpointSaverHook(std::make_unique<Impl>(
      std::move(options), registry, std::move(listeners), std::move(schedule))));
}

CheckpointSaverHook::CheckpointSaverHook(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointSaverHook::~CheckpointSaverHook() = default;

Status CheckpointSaverHook::begin() { return impl_->Begin(); }

Status CheckpointSaverHook::after_create_session(int64_t global_step) {
  bool stop = false;  // nothing to stop yet: TensorFlow ignores the listeners' answer here too
  return impl_->Save(global_step, &stop);
}

Status CheckpointSaverHook::after_run(RunContext& context, const RunValues& values) {
  (void)values;
  ASSIGN_OR_RETURN(const bool due, impl_->Due(context.step()));
  if (!due) return Status::OK();
  bool stop = false;
  Status status = impl_->Save(context.step(), &stop);
  if (stop) context.request_stop();
  return status;
}

Status CheckpointSaverHook::end(int64_t global_step) { return impl_->End(global_step); }

SaverTotals CheckpointSaverHook::totals() const { return impl_->totals(); }

}  // namespace asyncckpt
