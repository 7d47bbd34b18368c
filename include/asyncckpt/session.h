#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "asyncckpt/hooks.h"
#include "asyncckpt/status.h"

namespace asyncckpt {

/// What the step function sees: the step it makes, the fetches the hooks asked for, and a
/// place to put their values.
class StepContext {
 public:
  /// A context for the step that makes global step `step`, with the hooks' fetches.
  StepContext(int64_t step, std::set<std::string> fetches)
      : step_(step), fetches_(std::move(fetches)) {}
  /// The global step after this run.
  int64_t step() const { return step_; }
  /// The union of every hook's fetches for this step.
  const std::set<std::string>& fetches() const { return fetches_; }
  /// True when some hook asked for `name`.
  bool wants(const std::string& name) const { return fetches_.count(name) != 0; }
  /// Provides a fetched value; values for names nobody fetched are dropped.
  void provide(const std::string& name, std::any value) {
    if (wants(name)) values_.results[name] = std::move(value);
  }
  /// What was provided so far.
  const RunValues& values() const { return values_; }

 private:
  int64_t step_;
  std::set<std::string> fetches_;
  RunValues values_;
};

/// One training step. Return OK when the step completed; OutOfRange to say the input is
/// exhausted (a normal end: hooks' end() runs); any other failure ends the session without
/// end(). An exception thrown by the step counts as an Internal failure.
using StepFn = std::function<Status(StepContext&)>;

/// Runs a step function with hooks around it, in TensorFlow's MonitoredSession order.
/// Owns nothing but the step counter; hooks are borrowed and must outlive the session.
/// Single-threaded: call from the training thread only.
class MonitoredSession {
 public:
  /// Calls begin() then after_create_session(initial_step) on every hook, in order.
  static Result<std::unique_ptr<MonitoredSession>> Create(std::vector<SessionRunHook*> hooks,
                                                          int64_t initial_step = 0);

  /// Runs one step: before_run on every hook, the step, after_run on every hook. Returns the
  /// step's failure, or a hook's. OutOfRange from the step marks the session finished (it
  /// should_stop()) and is returned as is. Calling run() after a failure or close() is an error.
  Status run(const StepFn& step_fn);

  /// Runs steps until should_stop() or `last_step` is reached (the global step), then close().
  /// End of data is a normal finish (returns OK).
  Status run_until(int64_t last_step, const StepFn& step_fn);

  /// True once a hook or the step requested a stop, the input ended, or a step failed.
  bool should_stop() const { return stop_requested_ || finished_ || failed_; }
  /// Asks the loop to stop after the current step.
  void request_stop() { stop_requested_ = true; }
  /// The last completed global step.
  int64_t global_step() const { return global_step_; }

  /// Calls end() on every hook unless a step or hook failed; idempotent. Returns the first
  /// hook failure.
  Status close();
  /// Closes if still open (errors are dropped; call close() to see them).
  ~MonitoredSession();

 private:
  MonitoredSession(std::vector<SessionRunHook*> hooks, int64_t initial_step)
      : hooks_(std::move(hooks)), global_step_(initial_step) {}

  std::vector<SessionRunHook*> hooks_;
  int64_t global_step_;
  bool stop_requested_ = false;
  bool finished_ = false;
  bool failed_ = false;
  bool closed_ = false;
};

}  // namespace asyncckpt
