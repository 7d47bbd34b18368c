#include "asyncckpt/session.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {
namespace {

// Hooks and step functions are user code: an exception they throw must not cross our API,
// so it becomes an Internal status that says who threw at which step.
template <typename Fn>
Status Guard(const std::string& who, Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Status::Internal(who + " threw: " + e.what());
  } catch (...) {
    return Status::Internal(who + " threw an exception that is not a std::exception");
  }
}

std::string HookName(size_t index, const char* call) {
  return "hook #" + std::to_string(index) + " " + call;
}

// before_run on every hook in order, collecting the union of their fetches; stops at the
// first failure.
Status CallBeforeRun(const std::vector<SessionRunHook*>& hooks, RunContext& context,
                     std::set<std::string>& fetches) {
  for (size_t i = 0; i < hooks.size(); ++i) {
    Result<RunArgs> args = RunArgs{};
    RETURN_IF_ERROR(Guard(HookName(i, "before_run()"), [&] {
      args = hooks[i]->before_run(context);
      return Status::OK();
    }));
    RETURN_IF_ERROR(args.status());
    fetches.insert(args->fetches.begin(), args->fetches.end());
  }
  return Status::OK();
}

// after_run on every hook in order; stops at the first failure.
Status CallAfterRun(const std::vector<SessionRunHook*>& hooks, RunContext& context,
                    const RunValues& values) {
  for (size_t i = 0; i < hooks.size(); ++i) {
    RETURN_IF_ERROR(
        Guard(HookName(i, "after_run()"), [&] { return hooks[i]->after_run(context, values); }));
  }
  return Status::OK();
}

// The errors TensorFlow's _RecoverableSession recovers from: a pre-empted worker or device.
bool IsPreemption(const Status& status) {
  return status.code() == StatusCode::kAborted || status.code() == StatusCode::kUnavailable;
}

Status CheckHooks(const std::vector<SessionRunHook*>& hooks) {
  for (size_t i = 0; i < hooks.size(); ++i) {
    if (hooks[i] == nullptr) {
      return Status::InvalidArgument("MonitoredSession: hook #" + std::to_string(i) + " is null");
    }
  }
  return Status::OK();
}

Status CallBegin(const std::vector<SessionRunHook*>& hooks) {
  for (size_t i = 0; i < hooks.size(); ++i) {
    RETURN_IF_ERROR(Guard(HookName(i, "begin()"), [&] { return hooks[i]->begin(); }));
  }
  return Status::OK();
}

// before_recovery on every hook; a failure is logged, not returned: the recovery goes on, and
// whatever the hook was finishing reports its own failures through its own path.
void CallBeforeRecovery(const std::vector<SessionRunHook*>& hooks) {
  for (size_t i = 0; i < hooks.size(); ++i) {
    Status status =
        Guard(HookName(i, "before_recovery()"), [&] { return hooks[i]->before_recovery(); });
    if (!status.ok()) LogWarning("MonitoredSession: " + status.ToString());
  }
}

Status CallAfterCreateSession(const std::vector<SessionRunHook*>& hooks, int64_t step) {
  for (size_t i = 0; i < hooks.size(); ++i) {
    RETURN_IF_ERROR(Guard(HookName(i, "after_create_session()"),
                          [&] { return hooks[i]->after_create_session(step); }));
  }
  return Status::OK();
}

}  // namespace

// The hooked session, plus the recovery of MonitoredSession when a creator is set.
class MonitoredSessionBase::Impl {
 public:
  // `creator` null: no recovery, the session starts at `initial_step`.
  Impl(std::vector<SessionRunHook*> hooks, SessionCreator* creator, int64_t initial_step,
       int max_consecutive_recoveries)
      : hooks_(std::move(hooks)),
        creator_(creator),
        max_in_a_row_(max_consecutive_recoveries),
        global_step_(initial_step) {}

  // begin() on every hook, then the first session.
  Status Start() {
    RETURN_IF_ERROR(CallBegin(hooks_));
    Status created = CreateSession();
    if (created.ok() || !Recoverable(created)) return created;
    return Recover(created);
  }

  Status Run(const StepFn& step_fn) {
    RETURN_IF_ERROR(CheckRunnable());
    for (;;) {
      const int64_t attempted = global_step_ + 1;
      Status status = RunOnce(step_fn);
      if (status.ok()) {
        // Steps replayed up to the one a pre-emption struck are no progress: a step failing
        // every time would otherwise be retried forever.
        if (global_step_ >= struck_step_) recoveries_in_a_row_ = 0;
        return status;
      }
      if (finished_) return status;
      if (Recoverable(status)) {
        struck_step_ = std::max(struck_step_, attempted);
        // The failed step's stop requests go with it, as its context does in TensorFlow.
        Status recovered = Recover(status);
        // A stop the caller asked for during the failed attempt ends the loop at the restored
        // step instead of retrying.
        if (recovered.ok() && stop_requested_) return recovered;
        if (recovered.ok()) continue;
        status = std::move(recovered);
      }
      failed_ = true;
      return status;
    }
  }

  Status RunUntil(int64_t last_step, const StepFn& step_fn) {
    Status first_failure;
    while (!ShouldStop() && global_step_ < last_step) {
      Status status = Run(step_fn);
      if (status.code() == StatusCode::kOutOfRange) break;
      if (!status.ok()) {
        first_failure = std::move(status);
        break;
      }
    }
    Status close_status = Close();
    return first_failure.ok() ? close_status : first_failure;
  }

  Status Close() {
    // A second close() has nothing left to do; the first one reported any end() failure.
    if (closed_) return Status::OK();
    closed_ = true;
    // After a failure the hooks' state is unknown; end() would e.g. save a checkpoint of a
    // half-done step, so it is skipped (TensorFlow does the same).
    if (failed_) return Status::OK();
    Status first_failure;
    for (size_t i = 0; i < hooks_.size(); ++i) {
      // Every hook gets its end() so each can flush, even after an earlier one failed.
      Status status = Guard(HookName(i, "end()"), [&] { return hooks_[i]->end(global_step_); });
      if (first_failure.ok() && !status.ok()) first_failure = std::move(status);
    }
    return first_failure;
  }

  bool ShouldStop() const { return stop_requested_ || finished_ || failed_; }
  void RequestStop() { stop_requested_ = true; }
  int64_t global_step() const { return global_step_; }
  int64_t recoveries() const { return recoveries_; }

 private:
  bool Recoverable(const Status& status) const {
    return creator_ != nullptr && IsPreemption(status);
  }

  Status CheckRunnable() const {
    const std::string next = " (step " + std::to_string(global_step_ + 1) + " not run)";
    if (closed_) return Status::FailedPrecondition("MonitoredSession::run after close()" + next);
    if (failed_) {
      return Status::FailedPrecondition("MonitoredSession::run after a failed step or hook" + next);
    }
    if (finished_) {
      return Status::FailedPrecondition("MonitoredSession::run after the input ended" + next);
    }
    if (stop_requested_) {
      return Status::FailedPrecondition(
          "MonitoredSession::run called even after should_stop requested" + next +
          "; check should_stop() before each run");
    }
    return Status::OK();
  }

  // The creator's step (or the initial step), then after_create_session on every hook.
  Status CreateSession() {
    if (creator_ != nullptr) {
      Result<int64_t> step = int64_t{0};
      RETURN_IF_ERROR(Guard("the session creator's create_session()", [&] {
        step = creator_->create_session();
        return Status::OK();
      }));
      RETURN_IF_ERROR(step.status().WithContext("creating the session"));
      if (*step < 0) {
        return Status::Internal("the session creator returned step " + std::to_string(*step) +
                                ", which is negative");
      }
      global_step_ = *step;
    }
    return CallAfterCreateSession(hooks_, global_step_);
  }

  // Re-creates the session after the pre-emption error `error`, retrying while creating it
  // fails with one too; gives up after max_in_a_row_ recoveries that did not get past the step
  // a pre-emption struck.
  Status Recover(Status error) {
    for (;;) {
      if (recoveries_in_a_row_ >= max_in_a_row_) {
        return Status(error.code(),
                      "MonitoredSession gave up after " + std::to_string(recoveries_in_a_row_) +
                          " consecutive recoveries without getting past step " +
                          std::to_string(struck_step_) + " (max_consecutive_recoveries " +
                          std::to_string(max_in_a_row_) + "): " + error.message());
      }
      ++recoveries_in_a_row_;
      LogWarning("MonitoredSession: " + error.ToString() + " after step " +
                 std::to_string(global_step_) + "; re-creating the session (recovery " +
                 std::to_string(recoveries_in_a_row_) + " of at most " +
                 std::to_string(max_in_a_row_) + " in a row)");
      // Saves still in flight hold steps the loop already ran past: the creator must see them
      // committed, or it restores an older state (or none) than this job saved.
      CallBeforeRecovery(hooks_);
      Status created = CreateSession();
      if (created.ok()) {
        ++recoveries_;
        LogInfo("MonitoredSession: recovered; the session goes on from step " +
                std::to_string(global_step_));
        return created;
      }
      if (!IsPreemption(created)) return created;
      error = std::move(created);
    }
  }

  // One attempt at a step; OutOfRange from the step sets finished_.
  Status RunOnce(const StepFn& step_fn) {
    const int64_t step = global_step_ + 1;
    // One context for the whole step, as in TensorFlow: a stop asked for in before_run is seen
    // once the step completes.
    RunContext run_context(step);
    std::set<std::string> fetches;
    RETURN_IF_ERROR(CallBeforeRun(hooks_, run_context, fetches));
    StepContext step_context(step, std::move(fetches));
    Status status = Guard("step " + std::to_string(step), [&] { return step_fn(step_context); });
    if (status.code() == StatusCode::kOutOfRange) {
      // End of data: the step did not complete, but the session finished normally.
      finished_ = true;
      return status;
    }
    RETURN_IF_ERROR(status);
    global_step_ = step;
    RETURN_IF_ERROR(CallAfterRun(hooks_, run_context, step_context.values()));
    if (run_context.stop_requested()) stop_requested_ = true;
    return Status::OK();
  }

  const std::vector<SessionRunHook*> hooks_;
  SessionCreator* const creator_;
  const int max_in_a_row_;
  int64_t global_step_;
  int recoveries_in_a_row_ = 0;
  // The furthest step a pre-emption struck; the bound resets once a step gets there.
  int64_t struck_step_ = 0;
  int64_t recoveries_ = 0;
  bool stop_requested_ = false;
  bool finished_ = false;
  bool failed_ = false;
  bool closed_ = false;
};

MonitoredSessionBase::MonitoredSessionBase(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MonitoredSessionBase::~MonitoredSessionBase() {
  if (impl_) (void)impl_->Close();
}

Status MonitoredSessionBase::run(const StepFn& step_fn) { return impl_->Run(step_fn); }

Status MonitoredSessionBase::run_until(int64_t last_step, const StepFn& step_fn) {
  return impl_->RunUntil(last_step, step_fn);
}

bool MonitoredSessionBase::should_stop() const { return impl_->ShouldStop(); }
void MonitoredSessionBase::request_stop() { impl_->RequestStop(); }
int64_t MonitoredSessionBase::global_step() const { return impl_->global_step(); }
Status MonitoredSessionBase::close() { return impl_->Close(); }

Result<std::unique_ptr<MonitoredSession>> MonitoredSession::Create(
    std::vector<SessionRunHook*> hooks, SessionCreator* creator, MonitoredSessionOptions options) {
  RETURN_IF_ERROR(CheckHooks(hooks));
  if (creator == nullptr) {
    return Status::InvalidArgument("MonitoredSession: the session creator is null");
  }
  if (options.max_consecutive_recoveries < 0) {
    return Status::InvalidArgument(
        "MonitoredSession: max_consecutive_recoveries must be >= 0, got " +
        std::to_string(options.max_consecutive_recoveries));
  }
  auto impl =
      std::make_unique<Impl>(std::move(hooks), creator, 0, options.max_consecutive_recoveries);
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<MonitoredSession>(new MonitoredSession(std::move(impl)));
}

MonitoredSession::MonitoredSession(std::unique_ptr<Impl> impl)
    : MonitoredSessionBase(std::move(impl)) {}

int64_t MonitoredSession::recoveries() const { return impl().recoveries(); }

SingularMonitoredSession::SingularMonitoredSession(std::unique_ptr<Impl> impl)
    : MonitoredSessionBase(std::move(impl)) {}

Result<std::unique_ptr<SingularMonitoredSession>> SingularMonitoredSession::Create(
    std::vector<SessionRunHook*> hooks, int64_t initial_step) {
  RETURN_IF_ERROR(CheckHooks(hooks));
  auto impl = std::make_unique<Impl>(std::move(hooks), nullptr, initial_step, 0);
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<SingularMonitoredSession>(new SingularMonitoredSession(std::move(impl)));
}

}  // namespace asyncckpt
