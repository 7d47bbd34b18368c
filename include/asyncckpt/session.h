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

/// Creates, or re-creates after a pre-emption, the state a session trains (TensorFlow's
/// SessionCreator: the chief's, which restores the newest checkpoint through its Scaffold).
/// MonitoredSession calls it from the training thread: once when it is created, and again after
/// every Aborted or Unavailable error. CheckpointSessionCreator (session_creator.h) restores the
/// newest checkpoint of a directory.
class SessionCreator {
 public:
  virtual ~SessionCreator() = default;
  /// Initialises or restores the training state and returns the global step the session starts
  /// from (0 for a fresh job). Aborted or Unavailable is retried by MonitoredSession as a failed
  /// step is; any other failure fails the session.
  virtual Result<int64_t> create_session() = 0;
};

/// Options of MonitoredSession.
struct MonitoredSessionOptions {
  /// Recoveries in a row, before a step completes past the one a pre-emption struck, after
  /// which the session gives up and fails with the last pre-emption error; 0 never recovers.
  /// Must be >= 0.
  int max_consecutive_recoveries = 10;
};

/// What both sessions share: the hooks, TensorFlow's hook order around each step, the stop
/// logic and close(). Created through MonitoredSession or SingularMonitoredSession.
/// Hooks are borrowed and must outlive the session. Single-threaded: call from the training
/// thread only.
class MonitoredSessionBase {
 public:
  MonitoredSessionBase(const MonitoredSessionBase&) = delete;
  MonitoredSessionBase& operator=(const MonitoredSessionBase&) = delete;
  /// Closes if still open (errors are dropped; call close() to see them).
  virtual ~MonitoredSessionBase();

  /// Runs one step: before_run on every hook, the step, after_run on every hook. Returns the
  /// step's failure, or a hook's. OutOfRange from the step marks the session finished (it
  /// should_stop()) and is returned as is. Calling run() once should_stop() is true (a stop was
  /// requested, the input ended, or a step failed) or after close() is FailedPrecondition and
  /// runs nothing, as TensorFlow's "Run called even after should_stop requested.".
  /// MonitoredSession recovers from pre-emption errors inside run() (see there).
  Status run(const StepFn& step_fn);

  /// Runs steps until should_stop() or `last_step` is reached (the global step), then close().
  /// End of data is a normal finish (returns OK).
  Status run_until(int64_t last_step, const StepFn& step_fn);

  /// True once a hook or the step requested a stop, the input ended, or a step failed.
  bool should_stop() const;
  /// Asks the loop to stop after the current step.
  void request_stop();
  /// The last completed global step (after a recovery: the step the session was restored to).
  int64_t global_step() const;

  /// Calls end() on every hook unless a step or hook failed; idempotent. Returns the first
  /// hook failure.
  Status close();

  /// Internal state (defined in the source file).
  class Impl;

 protected:
  /// Takes the state Create() built.
  explicit MonitoredSessionBase(std::unique_ptr<Impl> impl);
  /// The state, for the subclasses' accessors.
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

/// A session that recovers from pre-emption, as TensorFlow's MonitoredSession (its
/// _RecoverableSession): when the step, or a hook's before_run or after_run, returns Aborted or
/// Unavailable, it re-creates the session through its SessionCreator (which restores the newest
/// checkpoint), calls after_create_session(restored step) on every hook again (not begin()),
/// and retries. A recovery is logged and counted (recoveries()). At most
/// options.max_consecutive_recoveries recoveries may follow each other before a step completes
/// past the one a pre-emption struck (replayed steps are no progress); one more pre-emption
/// fails the session with the last error, naming the count. A
/// pre-emption error from the creator or from after_create_session is retried the same way,
/// also while Create() builds the first session. Other errors fail the session as in
/// SingularMonitoredSession, and end() runs once, at close().
///
/// What run() returns after a recovery: the retried step's result. The retried step is the
/// step after the restored one, so recovery is invisible to the loop except through
/// global_step(), which goes back to the restored step (steps after it are run again). A stop
/// a hook asked for during the failed attempt is dropped with it; a request_stop() on the
/// session during it is honoured: run() returns OK at the restored step without retrying.
class MonitoredSession final : public MonitoredSessionBase {
 public:
  /// Calls begin() on every hook, then creator->create_session() and after_create_session(its
  /// step) on every hook, in order. `creator` is borrowed and must outlive the session, as the
  /// hooks. InvalidArgument for a null hook or creator or a negative bound.
  static Result<std::unique_ptr<MonitoredSession>> Create(std::vector<SessionRunHook*> hooks,
                                                          SessionCreator* creator,
                                                          MonitoredSessionOptions options = {});

  /// Sessions re-created after a pre-emption error so far.
  int64_t recoveries() const;

 private:
  explicit MonitoredSession(std::unique_ptr<Impl> impl);
};

/// Runs a step function with hooks around it, in TensorFlow's order, without recovery
/// (TensorFlow's SingularMonitoredSession): every failure of the step or of a hook, pre-emption
/// errors included, ends the session without end(). The caller restores the state itself and
/// passes the step it restored.
class SingularMonitoredSession final : public MonitoredSessionBase {
 public:
  /// Calls begin() then after_create_session(initial_step) on every hook, in order.
  /// InvalidArgument for a null hook.
  static Result<std::unique_ptr<SingularMonitoredSession>> Create(
      std::vector<SessionRunHook*> hooks, int64_t initial_step = 0);

 private:
  explicit SingularMonitoredSession(std::unique_ptr<Impl> impl);
};

}  // namespace asyncckpt
