// SaverCore: the start, engine, submission, totals, listeners and failure policy that every
// saver shares (see saver_core.h).

#include "src/saver/saver_core.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "src/saver/coordination.h"
#include "src/saver/saver_start.h"
#include "src/state/sharded_commit.h"
#include "src/util/elapsed.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

bool NotifyAfterSave(const std::vector<CheckpointSaverListener*>& listeners, int64_t step,
                     const SaveStats& stats) {
  bool stop = false;
  for (auto* listener : listeners) stop = listener->after_save(step, stats) || stop;
  return stop;
}

void AddToTotals(const SaveStats& stats, SaverTotals* totals) {
  if (stats.status.ok()) {
    ++totals->saves_committed;
    totals->bytes_raw += stats.bytes_raw;
    totals->bytes_stored += stats.bytes_stored;
    totals->seconds_to_durable_total += stats.seconds_to_durable;
    totals->seconds_to_durable_max =
        std::max(totals->seconds_to_durable_max, stats.seconds_to_durable);
    for (const auto& [codec, chunks] : stats.chunks_by_codec) {
      totals->chunks_by_codec[codec] += chunks;
    }
  } else {
    ++totals->saves_failed;
  }
  totals->blocked_seconds_total += stats.blocked_seconds;
  totals->blocked_seconds_max = std::max(totals->blocked_seconds_max, stats.blocked_seconds);
  totals->saves.push_back(stats);
  while (totals->saves.size() > kSaverTotalsWindow) totals->saves.pop_front();
}

Result<std::unique_ptr<SaverCore>> SaverCore::Create(SaverOptions options, SaverCoreSetup setup) {
  RETURN_IF_ERROR(ValidateSaverOptions(options));
  SaverOptions schedule_options = options;
  if (setup.schedule_coordinator != nullptr) {
    schedule_options.coordinator = setup.schedule_coordinator;
  }
  ASSIGN_OR_RETURN(SaveSchedule schedule, SaveSchedule::Create(schedule_options));
  return std::unique_ptr<SaverCore>(
      new SaverCore(std::move(options), std::move(setup), std::move(schedule)));
}

namespace {

// The engine options of a saver: its own, and with a coordinator of several processes, this
// rank's place among them.
EngineOptions EngineOptionsOf(SaverOptions saver) {
  EngineOptions options;
  if (saver.coordinator != nullptr) {
    options.sharding.rank = static_cast<uint32_t>(saver.coordinator->rank());
    options.sharding.world_size = static_cast<uint32_t>(saver.coordinator->size());
  }
  options.saver = std::move(saver);
  return options;
}

}  // namespace

SaverCore::SaverCore(SaverOptions options, SaverCoreSetup setup, SaveSchedule schedule)
    : engine_options_(EngineOptionsOf(std::move(options))),
      setup_(std::move(setup)),
      schedule_(std::move(schedule)) {}

SaverCore::~SaverCore() { engine_.reset(); }

Status SaverCore::StartStorage() {
  ASSIGN_OR_RETURN(std::vector<std::string> removed,
                   storage_.Start(options(), setup_.state_file_name, setup_.partner));
  std::lock_guard lock(mu_);
  totals_.stale_temporaries_removed = std::move(removed);
  return Status::OK();
}

Status SaverCore::StartWithEngine(const TensorRegistry& registry) {
  ASSIGN_OR_RETURN(SaverStart start, StartSaver(options(), registry, &storage_));
  {
    std::lock_guard lock(mu_);
    totals_.stale_temporaries_removed = std::move(start.removed);
  }
  engine_options_.sharding.job_token = std::move(start.job_token);
  written_ = std::move(start.written);
  const Status created = CreatePlannedEngine(written_ ? written_.get() : &registry);
  // Every rank of a job learns whether every rank has an engine, so that none trains alone.
  RETURN_IF_ERROR(AgreeStarted(options(), created));
  for (auto* listener : setup_.listeners) listener->begin();
  return Status::OK();
}

namespace {

// Whether two registries hold the same tensors laid out the same way (their buffers aside).
bool SameLayout(const TensorRegistry& a, const TensorRegistry& b) {
  if (a.tensors().size() != b.tensors().size()) return false;
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const TensorRef& x = a.tensors()[i];
    const TensorRef& y = b.tensors()[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.bytes != y.bytes ||
        x.device != y.device || x.global_shape != y.global_shape ||
        x.global_offset != y.global_offset) {
      return false;
    }
  }
  return true;
}

}  // namespace

Result<bool> SaverCore::AgreeOnWritten(const TensorRegistry& registry, const Status& local) {
  ASSIGN_OR_RETURN(TensorRegistry written, AgreeOnWriters(*options().coordinator, registry, local));
  const bool changed = written_ == nullptr || !SameLayout(*written_, written);
  if (written_ == nullptr) written_ = std::make_unique<TensorRegistry>();
  // The engine reads its registry only in Create and Submit: replacing it between two submits
  // is safe, and the saves in flight copied theirs already.
  *written_ = std::move(written);
  return changed;
}

Status SaverCore::RecreateEngineAcrossRanks() {
  return AgreeStarted(options(), CreatePlannedEngine(written_.get()));
}

Status SaverCore::CreatePlannedEngine(const TensorRegistry* registry) {
  ASSIGN_OR_RETURN(const SnapshotPlan plan,
                   PlanSnapshot(*registry, engine_options_, options().basename));
  EngineOptions engine_options = engine_options_;
  ASSIGN_OR_RETURN(engine_options.staging_budget,
                   StagingBudget(plan.staging, options(), setup_.mode));
  return CreateEngine(registry, plan, engine_options);
}

Status SaverCore::CreateEngine(const TensorRegistry* registry, const SnapshotPlan& plan,
                               const EngineOptions& engine_options) {
  if (engine_) engine_->WaitAll();
  engine_.reset();
  const auto start = SteadyClock::now();
  auto created = Engine::Create(engine_options, plan, storage_.fs, storage_.manager.get(), registry,
                                [this](const SaveStats& stats) { OnDone(stats); });
  {
    std::lock_guard lock(mu_);
    totals_.startup_seconds += SecondsSince(start);
  }
  ASSIGN_OR_RETURN(engine_, std::move(created));
  return Status::OK();
}

uint64_t SaverCore::staging_budget() const { return engine_ ? engine_->staging_budget() : 0; }

Result<CoreSaveResult> SaverCore::Save(CoreSaveRequest request) {
  if (!engine_) return Status::FailedPrecondition("the saver has not started (begin() not called)");
  const int64_t step = request.metadata.step;
  const auto start = request.started.value_or(SteadyClock::now());
  const bool heed = request.heed_listeners;
  SubmitRequest submit;
  submit.metadata = std::move(request.metadata);
  submit.skip_if_busy = request.may_skip && options().on_busy == OnBusy::kSkip && !synchronous();
  // Runs once the save is certain: on_done comes for it, in this order.
  submit.before_copy = [&] {
    if (!synchronous()) {
      std::lock_guard lock(mu_);
      heed_answers_.push_back(heed);
    }
    for (auto* listener : setup_.listeners) listener->before_save(step);
  };
  submit.plan = std::move(request.plan);
  submit.started = start;
  ASSIGN_OR_RETURN(const SubmitResult submitted, engine_->Submit(std::move(submit)));
  schedule_.mark(step);
  {
    // Every lease of a save is taken inside Submit: its high water is known now.
    std::lock_guard lock(mu_);
    staging_high_water_ = std::max(staging_high_water_, engine_->staging_high_water());
    if (submitted.outcome == SubmitOutcome::kSkipped) ++totals_.saves_skipped;
  }
  if (submitted.outcome == SubmitOutcome::kSkipped) {
    LogWarning("skipped the save of step " + std::to_string(step) + ": staging is still busy");
    return CoreSaveResult{};
  }
  schedule_.mark_saved(step);
  CoreSaveResult result;
  result.saved = true;
  if (!synchronous()) return result;
  engine_->WaitSaves();  // on_done has run for this save by now; removals go on
  {
    std::lock_guard lock(mu_);
    result.stats = std::move(last_done_).value_or(SaveStats{});
    last_done_.reset();
  }
  // The caller was blocked until the checkpoint was durable: the two times are one.
  result.stats.seconds_to_durable = SecondsSince(start);
  result.stats.blocked_seconds = result.stats.seconds_to_durable;
  Record(result.stats);
  result.stop_requested = NotifyAfterSave(setup_.listeners, step, result.stats) && heed;
  return result;
}

void SaverCore::OnDone(const SaveStats& stats) {
  if (synchronous()) {
    std::lock_guard lock(mu_);
    last_done_ = stats;
    return;
  }
  // Recorded before the listeners hear of the save, so that whoever learns of it from a
  // listener finds it in totals() and, if it failed, the loop's next after_run sees it.
  Record(stats);
  if (!stats.status.ok()) RecordFailure(stats.status);
  bool heed = true;
  {
    std::lock_guard lock(mu_);
    // The engine reports every certain save once, in submission order.
    if (!heed_answers_.empty()) {
      heed = heed_answers_.front();
      heed_answers_.pop_front();
    }
  }
  if (NotifyAfterSave(setup_.listeners, stats.step, stats) && heed) {
    std::lock_guard lock(mu_);
    stop_requested_by_listener_ = true;
  }
}

void SaverCore::Record(const SaveStats& stats) {
  {
    std::lock_guard lock(mu_);
    AddToTotals(stats, &totals_);
  }
  finished_.notify_all();
}

void SaverCore::RecordFailure(const Status& failure) {
  std::lock_guard lock(mu_);
  unreported_failures_.push_back(
      setup_.failure_context.empty() ? failure : failure.WithContext(setup_.failure_context));
}

Status SaverCore::Deliver(RunContext* context) {
  std::lock_guard lock(mu_);
  if (stop_requested_by_listener_ && context != nullptr) context->request_stop();
  for (Status& failure : unreported_failures_) {
    if (options().on_error == OnError::kStop) {
      if (first_error_.ok()) first_error_ = failure;
    } else {
      LogError(setup_.save_noun + " failed; training goes on: " + failure.ToString());
    }
  }
  unreported_failures_.clear();
  // Every step after a failure asks to stop, also when a wait took the failure first.
  if (!first_error_.ok() && context != nullptr) context->request_stop();
  return first_error_;
}

void SaverCore::WaitAll() {
  if (engine_) engine_->WaitAll();
}

Status SaverCore::WaitUntilSaved() {
  if (engine_) engine_->WaitSaves();
  return Deliver(nullptr);
}

bool SaverCore::WaitForFinishedSaves(int64_t finished, double timeout_seconds) const {
  std::unique_lock lock(mu_);
  const auto reached = [&] { return totals_.saves_committed + totals_.saves_failed >= finished; };
  if (timeout_seconds < 0) {
    finished_.wait(lock, reached);
    return true;
  }
  return finished_.wait_for(lock, std::chrono::duration<double>(timeout_seconds), reached);
}

Status SaverCore::AnnounceEnd(int64_t step) {
  const ShardingOptions& sharding = engine_options_.sharding;
  if (sharding.world_size <= 1 || storage_.fs == nullptr) return schedule_.agree_on_end(step);
  const SaverOptions& saver = engine_options_.saver;
  const Status published = PublishShardEnded(*storage_.fs, saver.checkpoint_dir, saver.basename,
                                             sharding.job_token, sharding.rank, step);
  if (!published.ok()) {
    LogWarning("rank " + std::to_string(sharding.rank) +
               " could not tell the others that it ended at step " + std::to_string(step) +
               " (a rank still training waits out its timeout instead): " + published.message());
  }
  return schedule_.agree_on_end(step);
}

Status SaverCore::Finish(std::optional<int64_t> end_step) {
  Status status = WaitUntilSaved();
  const ShardingOptions& sharding = engine_options_.sharding;
  if (end_step && sharding.world_size > 1 && sharding.rank == 0 && storage_.fs != nullptr) {
    // Every rank's part of every save up to rank 0's end is in: no one needs the markers now.
    RemoveShardEnded(*storage_.fs, engine_options_.saver.checkpoint_dir,
                     engine_options_.saver.basename, sharding.job_token, sharding.world_size);
  }
  if (end_step) {
    for (auto* listener : setup_.listeners) listener->end(*end_step);
  }
  engine_.reset();
  storage_.ReleaseLock();  // every save is durable or failed: the directory is free
  return status;
}

SaverTotals SaverCore::totals() const {
  std::lock_guard lock(mu_);
  SaverTotals totals = totals_;
  totals.staging_high_water_bytes = staging_high_water_;
  if (storage_.manager) totals.retention_failures = storage_.manager->retention_failures();
  return totals;
}

}  // namespace asyncckpt
