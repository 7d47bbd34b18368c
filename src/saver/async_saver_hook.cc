// AsyncCheckpointSaverHook: the training thread only snapshots; the engine's flow graph
// encodes, writes and commits in the background.

#include <chrono>
#include <deque>
#include <mutex>
#include <vector>

#include "asyncckpt/saver_hook.h"
#include "src/engine/engine.h"
#include "src/saver/saver_common.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

class AsyncCheckpointSaverHook::Impl {
 public:
  Impl(SaverOptions options, const TensorRegistry* registry,
       std::vector<CheckpointSaverListener*> listeners, SaveSchedule schedule)
      : options_(std::move(options)),
        registry_(registry),
        listeners_(std::move(listeners)),
        schedule_(std::move(schedule)) {}

  ~Impl() { engine_.reset(); }  // waits for saves in flight before the storage goes

  Status Begin() {
    ASSIGN_OR_RETURN(SaverStart start, StartSaver(options_, *registry_, &storage_));
    {
      std::lock_guard lock(mu_);
      totals_.stale_temporaries_removed = std::move(start.removed);
    }
    written_ = std::move(start.written);
    Result<std::unique_ptr<Engine>> engine = Engine::Create(
        EngineOptionsFor(options_, std::move(start.job_token)), storage_.fs, storage_.manager.get(),
        written_ ? written_.get() : registry_, [this](const SaveStats& stats) { OnDone(stats); });
    // Every rank of a job learns whether every rank has an engine, so that none trains alone.
    RETURN_IF_ERROR(AgreeStarted(options_, engine.status()));
    engine_ = std::move(engine).value();
    for (auto* listener : listeners_) listener->begin();
    return Status::OK();
  }

  // Snapshots `step`; with may_skip, skips it when staging is busy (as on_busy says). With
  // heed_listeners false, a listener's after_save answer for this save asks for no stop: the
  // save of a session's start, which TensorFlow's hook (and CheckpointSaverHook) ignore.
  Status Save(int64_t step, bool may_skip, bool heed_listeners = true) {
    if (!engine_) return Status::FailedPrecondition("AsyncCheckpointSaverHook: begin() not called");
    schedule_.mark(step);
    CheckpointMetadata metadata{step, options_.clock(), options_.user_metadata};
    SubmitRequest request{.metadata = metadata,
                          .skip_if_busy = may_skip && options_.on_busy == OnBusy::kSkip,
                          .before_copy = [&] {
                            {
                              // Runs once the save is certain: on_done comes for it, in this
                              // order.
                              std::lock_guard lock(mu_);
                              heed_answers_.push_back(heed_listeners);
                            }
                            for (auto* listener : listeners_) listener->before_save(step);
                          }};
    ASSIGN_OR_RETURN(const SubmitResult submitted, engine_->Submit(request));
    const SubmitOutcome outcome = submitted.outcome;
    if (outcome == SubmitOutcome::kSubmitted) schedule_.mark_saved(step);
    std::lock_guard lock(mu_);
    if (outcome == SubmitOutcome::kSkipped) {
      ++totals_.saves_skipped;
      LogLine("skipped the save of step " + std::to_string(step) + ": staging is still busy");
    }
    totals_.staging_high_water_bytes = engine_->staging_high_water();
    return Status::OK();
  }

  // Called on the training thread after each step: delivers what the background reported.
  Status Poll(RunContext* context) {
    std::lock_guard lock(mu_);
    if (stop_requested_by_listener_ && context != nullptr) context->request_stop();
    for (Status& failure : unreported_failures_) {
      if (options_.on_error == OnError::kStop) {
        if (context != nullptr) context->request_stop();
        if (first_error_.ok()) first_error_ = failure;
      } else {
        LogLine("a background save failed; training goes on: " + failure.ToString());
      }
    }
    unreported_failures_.clear();
    return Status::OK();
  }

  // Leaves failures for the next Poll, unlike WaitUntilSaved.
  void WaitForSavesInFlight() {
    if (engine_) engine_->WaitAll();
  }

  Status WaitUntilSaved() {
    if (engine_) engine_->WaitAll();
    (void)Poll(nullptr);
    std::lock_guard lock(mu_);
    // Kept, not cleared: a caller that waited and went on must still see end() fail.
    return first_error_;
  }

  Status End(int64_t step) {
    Status status;
    // A skipped save of this step is retried here, waiting for staging: no later trigger would.
    if (schedule_.final_save_needed(step)) {
      status = Save(step, /*may_skip=*/false);
    }
    Status saved = WaitUntilSaved();
    if (status.ok()) status = saved;
    for (auto* listener : listeners_) listener->end(step);
    storage_.ReleaseLock();  // the engine is idle: every save is durable or failed
    return status;
  }

  const SaveSchedule& schedule() const { return schedule_; }
  // Whether a save is due after `step` on every rank: under save_secs with a coordinator, one
  // small broadcast from rank 0, never a wait for another rank's save.
  Result<bool> Due(int64_t step) { return schedule_.due_everywhere(step); }

  SaverTotals Totals() const {
    std::lock_guard lock(mu_);
    SaverTotals totals = totals_;
    if (engine_) totals.staging_high_water_bytes = engine_->staging_high_water();
    if (storage_.manager) totals.retention_failures = storage_.manager->retention_failures();
    return totals;
  }

 private:
  // From the engine's commit node, one save at a time, in step order.
  void OnDone(const SaveStats& stats) {
    // Recorded before the listeners hear of the save, so that whoever learns of it from a
    // listener finds it in totals() and, if it failed, the loop's next after_run sees it.
    {
      std::lock_guard lock(mu_);
      AddToTotals(stats, &totals_);
      if (!stats.status.ok()) unreported_failures_.push_back(stats.status);
    }
    bool heed = true;
    {
      std::lock_guard lock(mu_);
      // The engine reports every certain save once, in submission order.
      if (!heed_answers_.empty()) {
        heed = heed_answers_.front();
        heed_answers_.pop_front();
      }
    }
    if (NotifyAfterSave(listeners_, stats.step, stats) && heed) {
      std::lock_guard lock(mu_);
      stop_requested_by_listener_ = true;
    }
  }

  SaverOptions options_;
  const TensorRegistry* registry_;
  std::vector<CheckpointSaverListener*> listeners_;
  SaveSchedule schedule_;
  SaverStorage storage_;
  // Multi-process jobs: what this rank writes (the engine's registry); null in one process.
  std::unique_ptr<TensorRegistry> written_;
  std::unique_ptr<Engine> engine_;

  mutable std::mutex mu_;  // guards what the background reports
  SaverTotals totals_;
  std::vector<Status> unreported_failures_;
  // Per save submitted and not yet done, oldest first: whether its listeners' answer counts.
  std::deque<bool> heed_answers_;
  Status first_error_;
  bool stop_requested_by_listener_ = false;
};

Result<std::unique_ptr<AsyncCheckpointSaverHook>> AsyncCheckpointSaverHook::Create(
    SaverOptions options, const TensorRegistry* registry,
    std::vector<CheckpointSaverListener*> listeners) {
  if (registry == nullptr) return Status::InvalidArgument("the tensor registry must not be null");
  RETURN_IF_ERROR(ValidateSaverOptions(options));
  ASSIGN_OR_RETURN(SaveSchedule schedule, SaveSchedule::Create(options));
  return std::unique_ptr<AsyncCheckpointSaverHook>(
      new AsyncCheckpointSaverHook(std::make_unique<Impl>(
          std::move(options), registry, std::move(listeners), std::move(schedule))));
}

AsyncCheckpointSaverHook::AsyncCheckpointSaverHook(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
AsyncCheckpointSaverHook::~AsyncCheckpointSaverHook() = default;

Status AsyncCheckpointSaverHook::begin() { return impl_->Begin(); }

Status AsyncCheckpointSaverHook::after_create_session(int64_t global_step) {
  // Nothing to stop yet: TensorFlow ignores the listeners' answer for this save, also in a
  // session re-created after a pre-emption.
  return impl_->Save(global_step, /*may_skip=*/true, /*heed_listeners=*/false);
}

Status AsyncCheckpointSaverHook::after_run(RunContext& context, const RunValues& values) {
  (void)values;
  RETURN_IF_ERROR(impl_->Poll(&context));
  ASSIGN_OR_RETURN(const bool due, impl_->Due(context.step()));
  if (!due) return Status::OK();
  return impl_->Save(context.step(), /*may_skip=*/true);
}

Status AsyncCheckpointSaverHook::end(int64_t global_step) { return impl_->End(global_step); }

Status AsyncCheckpointSaverHook::wait_until_saved() { return impl_->WaitUntilSaved(); }

Status AsyncCheckpointSaverHook::before_recovery() {
  impl_->WaitForSavesInFlight();
  return Status::OK();
}

SaverTotals AsyncCheckpointSaverHook::totals() const { return impl_->Totals(); }

}  // namespace asyncckpt
