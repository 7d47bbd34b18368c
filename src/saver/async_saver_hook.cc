// AsyncCheckpointSaverHook: the training thread only snapshots; the engine's flow graph
// encodes, writes and commits in the background.

#include <functional>
#include <utility>
#include <vector>

#include "asyncckpt/saver_hook.h"
#include "src/saver/saver_core.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

class AsyncCheckpointSaverHook::Impl {
 public:
  Impl(std::unique_ptr<SaverCore> core, const TensorRegistry* registry)
      : core_(std::move(core)), registry_(registry) {}

  Status Begin() { return core_->StartWithEngine(*registry_); }

  // Snapshots `step`; with may_skip, skips it when staging is busy (as on_busy says). With
  // heed_listeners false, a listener's after_save answer for this save asks for no stop: the
  // save of a session's start, which TensorFlow's hook (and CheckpointSaverHook) ignore.
  Status Save(int64_t step, bool may_skip, bool heed_listeners = true) {
    const SaverOptions& options = core_->options();
    CoreSaveRequest request;
    request.metadata = CheckpointMetadata{step, options.clock(), options.user_metadata};
    request.may_skip = may_skip;
    request.heed_listeners = heed_listeners;
    return core_->Save(std::move(request)).status();
  }

  // Called on the training thread after each step: delivers what the background reported.
  Status Poll(RunContext& context) {
    (void)core_->Deliver(&context);
    return Status::OK();
  }

  // Leaves failures for the next Poll, unlike WaitUntilSaved.
  void WaitForSavesInFlight() { core_->WaitAll(); }

  // Kept, not cleared: a caller that waited and went on must still see end() fail.
  Status WaitUntilSaved() { return core_->WaitUntilSaved(); }

  Status End(int64_t step) {
    // Before the final save: a rank still training must not wait for this one's parts.
    Status status = core_->AnnounceEnd(step);
    // A skipped save of this step is retried here, waiting for staging: no later trigger would.
    if (status.ok() && core_->schedule().final_save_needed(step)) {
      status = Save(step, /*may_skip=*/false);
    }
    Status finished = core_->Finish(step);
    return status.ok() ? finished : status;
  }

  // Whether a save is due after `step` on every rank: under save_secs with a coordinator, one
  // small broadcast from rank 0, never a wait for another rank's save.
  Result<bool> Due(int64_t step) { return core_->schedule().due_everywhere(step); }

  bool StartSaveNeeded(int64_t step) { return core_->schedule().start_save_needed(step); }
  void KeepStart(std::function<bool(int64_t)> keep) {
    core_->schedule().set_keep_start(std::move(keep));
  }

  SaverTotals Totals() const { return core_->totals(); }

 private:
  std::unique_ptr<SaverCore> core_;
  const TensorRegistry* registry_;
};

Result<std::unique_ptr<AsyncCheckpointSaverHook>> AsyncCheckpointSaverHook::Create(
    SaverOptions options, const TensorRegistry* registry,
    std::vector<CheckpointSaverListener*> listeners) {
  if (registry == nullptr) return Status::InvalidArgument("the tensor registry must not be null");
  SaverCoreSetup setup;
  setup.listeners = std::move(listeners);
  ASSIGN_OR_RETURN(auto core, SaverCore::Create(std::move(options), std::move(setup)));
  return std::unique_ptr<AsyncCheckpointSaverHook>(
      new AsyncCheckpointSaverHook(std::make_unique<Impl>(std::move(core), registry)));
}

AsyncCheckpointSaverHook::AsyncCheckpointSaverHook(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
AsyncCheckpointSaverHook::~AsyncCheckpointSaverHook() = default;

Status AsyncCheckpointSaverHook::begin() { return impl_->Begin(); }

Status AsyncCheckpointSaverHook::after_create_session(int64_t global_step) {
  if (!impl_->StartSaveNeeded(global_step)) return Status::OK();
  // Nothing to stop yet: TensorFlow ignores the listeners' answer for this save, also in a
  // session re-created after a pre-emption.
  return impl_->Save(global_step, /*may_skip=*/true, /*heed_listeners=*/false);
}

Status AsyncCheckpointSaverHook::after_run(RunContext& context, const RunValues& values) {
  (void)values;
  RETURN_IF_ERROR(impl_->Poll(context));
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

void AsyncCheckpointSaverHook::set_keep_start_checkpoint(std::function<bool(int64_t)> keep) {
  impl_->KeepStart(std::move(keep));
}

SaverTotals AsyncCheckpointSaverHook::totals() const { return impl_->Totals(); }

}  // namespace asyncckpt
