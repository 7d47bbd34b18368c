// CheckpointSaverHook: the synchronous saver. Every save is the engine's save followed by a wait,
// so the training thread is blocked until it is durable; it is the baseline the asynchronous hook
// is measured against, and writes the same bytes.

#include "asyncckpt/saver_hook.h"

#include <functional>
#include <utility>
#include <vector>

#include "src/saver/saver_core.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

class CheckpointSaverHook::Impl {
 public:
  Impl(std::unique_ptr<SaverCore> core, const TensorRegistry* registry)
      : core_(std::move(core)), registry_(registry) {}

  Status Begin() { return core_->StartWithEngine(*registry_); }

  // Saves `step`; *stop is set when a listener asks the loop to stop.
  Status Save(int64_t step, bool* stop, bool heed_listeners = true) {
    const SaverOptions& options = core_->options();
    CoreSaveRequest request;
    request.metadata = CheckpointMetadata{step, options.clock(), options.user_metadata};
    request.heed_listeners = heed_listeners;
    ASSIGN_OR_RETURN(const CoreSaveResult saved, core_->Save(std::move(request)));
    *stop = saved.stop_requested || *stop;
    return saved.stats.status;
  }

  Result<bool> Due(int64_t step) { return core_->schedule().due_everywhere(step); }

  bool StartSaveNeeded(int64_t step) { return core_->schedule().start_save_needed(step); }
  void KeepStart(std::function<bool(int64_t)> keep) {
    core_->schedule().set_keep_start(std::move(keep));
  }

  Status End(int64_t step) {
    // Before the final save: a rank still training must not wait for this one's parts.
    Status status = core_->AnnounceEnd(step);
    if (status.ok() && core_->schedule().final_save_needed(step)) {
      bool stop = false;
      status = Save(step, &stop);
    }
    Status finished = core_->Finish(step);
    return status.ok() ? finished : status;
  }

  SaverTotals totals() const { return core_->totals(); }

 private:
  std::unique_ptr<SaverCore> core_;
  const TensorRegistry* registry_;
};

Result<std::unique_ptr<CheckpointSaverHook>> CheckpointSaverHook::Create(
    SaverOptions options, const TensorRegistry* registry,
    std::vector<CheckpointSaverListener*> listeners) {
  if (registry == nullptr) return Status::InvalidArgument("the tensor registry must not be null");
  SaverCoreSetup setup;
  setup.mode = SaveMode::kSynchronous;
  setup.listeners = std::move(listeners);
  ASSIGN_OR_RETURN(auto core, SaverCore::Create(std::move(options), std::move(setup)));
  return std::unique_ptr<CheckpointSaverHook>(
      new CheckpointSaverHook(std::make_unique<Impl>(std::move(core), registry)));
}

CheckpointSaverHook::CheckpointSaverHook(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointSaverHook::~CheckpointSaverHook() = default;

Status CheckpointSaverHook::begin() { return impl_->Begin(); }

Status CheckpointSaverHook::after_create_session(int64_t global_step) {
  if (!impl_->StartSaveNeeded(global_step)) return Status::OK();
  bool stop = false;  // nothing to stop yet: TensorFlow ignores the listeners' answer here too
  return impl_->Save(global_step, &stop, /*heed_listeners=*/false);
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

void CheckpointSaverHook::set_keep_start_checkpoint(std::function<bool(int64_t)> keep) {
  impl_->KeepStart(std::move(keep));
}

SaverTotals CheckpointSaverHook::totals() const { return impl_->totals(); }

}  // namespace asyncckpt
