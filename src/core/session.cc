#include "asyncckpt/session.h"

#include <exception>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

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

}  // namespace

Result<std::unique_ptr<MonitoredSession>> MonitoredSession::Create(
    std::vector<SessionRunHook*> hooks, int64_t initial_step) {
  for (size_t i = 0; i < hooks.size(); ++i) {
    if (hooks[i] == nullptr) {
      return Status::InvalidArgument("MonitoredSession: hook #" + std::to_string(i) + " is null");
    }
  }
  for (size_t i = 0; i < hooks.size(); ++i) {
    RETURN_IF_ERROR(Guard(HookName(i, "begin()"), [&] { return hooks[i]->begin(); }));
  }
  for (size_t i = 0; i < hooks.size(); ++i) {
    RETURN_IF_ERROR(Guard(HookName(i, "after_create_session()"),
                          [&] { return hooks[i]->after_create_session(initial_step); }));
  }
  return std::unique_ptr<MonitoredSession>(new MonitoredSession(std::move(hooks), initial_step));
}

Status MonitoredSession::run(const StepFn& step_fn) {
  if (closed_) return Status::FailedPrecondition("MonitoredSession::run after close()");
  if (failed_) {
    return Status::FailedPrecondition("MonitoredSession::run after a failed step or hook (step " +
                                      std::to_string(global_step_ + 1) + " not run)");
  }
  const int64_t step = global_step_ + 1;
  // One context for the whole step, as in TensorFlow: a stop asked for in before_run is seen
  // once the step completes.
  RunContext run_context(step);
  std::set<std::string> fetches;
  if (Status before_status = CallBeforeRun(hooks_, run_context, fetches); !before_status.ok()) {
    failed_ = true;
    return before_status;
  }

  StepContext step_context(step, std::move(fetches));
  Status status = Guard("step " + std::to_string(step), [&] { return step_fn(step_context); });
  if (status.code() == StatusCode::kOutOfRange) {
    // End of data: the step did not complete, but the session finished normally.
    finished_ = true;
    return status;
  }
  if (!status.ok()) {
    failed_ = true;
    return status;
  }

  global_step_ = step;
  Status hooks_status = CallAfterRun(hooks_, run_context, step_context.values());
  if (!hooks_status.ok()) {
    failed_ = true;
    return hooks_status;
  }
  if (run_context.stop_requested()) stop_requested_ = true;
  return Status::OK();
}

Status MonitoredSession::run_until(int64_t last_step, const StepFn& step_fn) {
  Status first_failure;
  while (!should_stop() && global_step_ < last_step) {
    Status status = run(step_fn);
    if (status.code() == StatusCode::kOutOfRange) break;
    if (!status.ok()) {
      first_failure = std::move(status);
      break;
    }
  }
  Status close_status = close();
  return first_failure.ok() ? close_status : first_failure;
}

Status MonitoredSession::close() {
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

MonitoredSession::~MonitoredSession() {
  if (!closed_) (void)close();
}

}  // namespace asyncckpt
