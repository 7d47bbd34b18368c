#pragma once

#include <any>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "asyncckpt/status.h"

namespace asyncckpt {

/// What a hook asks the next step to produce (TensorFlow's SessionRunArgs): named fetches
/// that the step function fills in.
struct RunArgs {
  /// Names of the values the hook wants back in after_run.
  std::vector<std::string> fetches;
};

/// What the step produced for the hooks' fetches (TensorFlow's SessionRunValues).
struct RunValues {
  /// Fetch name -> value, as the step function provided it. Missing when not provided.
  std::map<std::string, std::any> results;
};

/// Per-step context handed to hooks. Lives for one step.
class RunContext {
 public:
  /// A context for the step that will make the global step `step`.
  explicit RunContext(int64_t step) : step_(step) {}
  /// The global step after this run (the first run of a fresh job is step 1).
  int64_t step() const { return step_; }
  /// Asks the session to stop after this step; the loop sees should_stop().
  void request_stop() { stop_requested_ = true; }
  /// True once any hook asked to stop during this step.
  bool stop_requested() const { return stop_requested_; }

 private:
  int64_t step_;
  bool stop_requested_ = false;
};

/// A training-loop hook with TensorFlow's SessionRunHook life cycle. All calls come from the
/// training thread. A non-OK Status from any call fails the session with that status.
class SessionRunHook {
 public:
  virtual ~SessionRunHook() = default;
  /// Once, before the session is created (before any step).
  virtual Status begin() { return Status::OK(); }
  /// Once, after the session exists and the state is initialised or restored;
  /// `global_step` is the step the job starts from (0 for a fresh job).
  virtual Status after_create_session(int64_t global_step) {
    (void)global_step;
    return Status::OK();
  }
  /// Before every step; the returned fetches are added to the run.
  virtual Result<RunArgs> before_run(RunContext& context) {
    (void)context;
    return RunArgs{};
  }
  /// After every step that completed; not called when the step failed.
  virtual Status after_run(RunContext& context, const RunValues& values) {
    (void)context;
    (void)values;
    return Status::OK();
  }
  /// When a MonitoredSession is about to re-create itself after a pre-emption, before its
  /// creator restores the state: finish work still in flight (background saves), so that the
  /// restore finds the newest state this job saved. Not part of TensorFlow's hook (its savers
  /// are synchronous). A failure is logged and the recovery goes on; failures of the work
  /// itself are reported as they would have been without the recovery.
  virtual Status before_recovery() { return Status::OK(); }
  /// Once, when the session closes after a normal finish or end of data (not after a failure);
  /// `global_step` is the last completed step.
  virtual Status end(int64_t global_step) {
    (void)global_step;
    return Status::OK();
  }
};

}  // namespace asyncckpt
