#include "asyncckpt/session.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <any>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "asyncckpt/hooks.h"
#include "src/util/log.h"

namespace asyncckpt {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

using CallLog = std::vector<std::string>;

// The last `n` calls (all of them when there are fewer), to assert how a run ended.
CallLog Tail(const CallLog& log, size_t n) {
  if (n >= log.size()) return log;
  return CallLog(log.end() - static_cast<std::ptrdiff_t>(n), log.end());
}

// How often `call` appears in `log`.
size_t Count(const CallLog& log, const std::string& call) {
  return static_cast<size_t>(std::count(log.begin(), log.end(), call));
}

// A failure planted at one step: it fires the first `times` times that step is reached.
struct Fault {
  int64_t at = 0;
  Status status;
  int times = 1 << 30;

  bool Fires(int64_t step) {
    if (step != at || times == 0) return false;
    --times;
    return true;
  }
};

// Logs every call, with its step, into a log shared by all hooks and the step function so
// that tests can assert the exact interleaving. Failures and stops are set per step.
class RecordingHook : public SessionRunHook {
 public:
  RecordingHook(std::string name, CallLog* log) : name_(std::move(name)), log_(log) {}

  Status begin() override {
    Record("begin");
    return begin_status;
  }
  Status after_create_session(int64_t global_step) override {
    Record("after_create_session " + std::to_string(global_step));
    if (after_create_session_fault && after_create_session_fault->Fires(global_step)) {
      return after_create_session_fault->status;
    }
    return Status::OK();
  }
  Result<RunArgs> before_run(RunContext& context) override {
    Record("before_run " + std::to_string(context.step()));
    if (stop_in_before_run_at == context.step()) context.request_stop();
    if (before_run_fault && before_run_fault->Fires(context.step()))
      return before_run_fault->status;
    return RunArgs{fetches};
  }
  Status after_run(RunContext& context, const RunValues& values) override {
    Record("after_run " + std::to_string(context.step()));
    received[context.step()] = values;
    if (throw_in_after_run_at == context.step()) throw std::runtime_error("hook exploded");
    if (after_run_fault && after_run_fault->Fires(context.step())) return after_run_fault->status;
    if (stop_in_after_run_at == context.step()) context.request_stop();
    return Status::OK();
  }
  Status before_recovery() override {
    Record("before_recovery");
    return before_recovery_status;
  }
  Status end(int64_t global_step) override {
    Record("end " + std::to_string(global_step));
    return end_status;
  }

  std::vector<std::string> fetches;
  Status before_recovery_status;
  Status begin_status;
  Status end_status;
  std::optional<Fault> after_create_session_fault;
  std::optional<Fault> before_run_fault;
  std::optional<Fault> after_run_fault;
  std::optional<int64_t> throw_in_after_run_at;
  std::optional<int64_t> stop_in_before_run_at;
  std::optional<int64_t> stop_in_after_run_at;
  // Step -> the values after_run was given.
  std::map<int64_t, RunValues> received;

 private:
  void Record(const std::string& call) { log_->push_back(name_ + "." + call); }

  std::string name_;
  CallLog* log_;
};

// Answers create_session() with `results` in order, then with `then`; logs each answer when
// given a log.
class FakeCreator : public SessionCreator {
 public:
  explicit FakeCreator(CallLog* log = nullptr, int64_t then = 0) : log_(log), then_(then) {}

  Result<int64_t> create_session() override {
    ++calls;
    if (throw_next) {
      throw_next = false;
      throw std::runtime_error("restore exploded");
    }
    Result<int64_t> result = then_;
    if (!results.empty()) {
      result = results.front();
      results.pop_front();
    }
    if (log_ != nullptr) {
      log_->push_back(result.ok() ? "create_session -> " + std::to_string(*result)
                                  : "create_session failed: " + result.status().ToString());
    }
    return result;
  }

  std::deque<Result<int64_t>> results;
  bool throw_next = false;
  int calls = 0;

 private:
  CallLog* log_;
  int64_t then_;
};

// A step that logs itself and succeeds.
StepFn LoggingStep(CallLog* log) {
  return [log](StepContext& context) {
    log->push_back("step " + std::to_string(context.step()));
    return Status::OK();
  };
}

// A step that logs itself and fails with `fault`'s status while the fault fires.
StepFn FaultyStep(CallLog* log, Fault fault) {
  return [log, fault](StepContext& context) mutable {
    log->push_back("step " + std::to_string(context.step()));
    return fault.Fires(context.step()) ? fault.status : Status::OK();
  };
}

// ---- what both sessions share -------------------------------------------------------------------

enum class Kind { kSingular, kRecoverable };

// Every test of this suite runs against SingularMonitoredSession and against MonitoredSession
// (with a creator that restores nothing and starts at the initial step): without pre-emption
// errors they behave alike.
class SessionTest : public ::testing::TestWithParam<Kind> {
 protected:
  Result<std::unique_ptr<MonitoredSessionBase>> Create(std::vector<SessionRunHook*> hooks,
                                                       int64_t initial_step = 0) {
    if (GetParam() == Kind::kSingular) {
      auto session = SingularMonitoredSession::Create(std::move(hooks), initial_step);
      if (!session.ok()) return session.status();
      return std::unique_ptr<MonitoredSessionBase>(std::move(session).value());
    }
    creator_ = std::make_unique<FakeCreator>(nullptr, initial_step);
    auto session = MonitoredSession::Create(std::move(hooks), creator_.get());
    if (!session.ok()) return session.status();
    return std::unique_ptr<MonitoredSessionBase>(std::move(session).value());
  }

  std::unique_ptr<MonitoredSessionBase> MakeSession(int64_t initial_step = 0) {
    auto session = Create({&a_, &b_}, initial_step);
    EXPECT_TRUE(session.ok()) << session.status().ToString();
    log_.clear();  // Tests about steps start with an empty log.
    return std::move(session).value();
  }

  StepFn LoggingStep() { return asyncckpt::LoggingStep(&log_); }

  // A step that logs itself and returns `failure` at step `at`.
  StepFn StepFailingAt(int64_t at, Status failure) {
    return FaultyStep(&log_, Fault{at, std::move(failure)});
  }

  CallLog log_;
  RecordingHook a_{"a", &log_};
  RecordingHook b_{"b", &log_};
  std::unique_ptr<FakeCreator> creator_;
};

void PrintTo(Kind kind, std::ostream* os) {
  *os << (kind == Kind::kSingular ? "SingularMonitoredSession" : "MonitoredSession");
}

INSTANTIATE_TEST_SUITE_P(BothSessions, SessionTest,
                         ::testing::Values(Kind::kSingular, Kind::kRecoverable),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return info.param == Kind::kSingular ? "Singular" : "Recoverable";
                         });

TEST_P(SessionTest, CreateCallsBeginOnEveryHookThenAfterCreateSession) {
  auto session = Create({&a_, &b_});
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  EXPECT_THAT(log_, ElementsAre("a.begin", "b.begin", "a.after_create_session 0",
                                "b.after_create_session 0"));
  EXPECT_EQ((*session)->global_step(), 0);
  EXPECT_FALSE((*session)->should_stop());
}

TEST_P(SessionTest, CreateReturnsFirstBeginFailureAndSkipsLaterHooks) {
  a_.begin_status = Status::NotFound("a has no checkpoint dir");
  auto session = Create({&a_, &b_});
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(session.status().message(), "a has no checkpoint dir");
  EXPECT_THAT(log_, ElementsAre("a.begin"));
}

TEST_P(SessionTest, CreateRejectsNullHook) {
  auto session = Create({&a_, nullptr});
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(session.status().message(), HasSubstr("hook #1"));
  EXPECT_THAT(log_, IsEmpty());
}

TEST_P(SessionTest, InitialStepReachesAfterCreateSessionAndStepsContinueFromIt) {
  auto session = Create({&a_}, 100);
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  EXPECT_THAT(log_, ElementsAre("a.begin", "a.after_create_session 100"));
  log_.clear();
  EXPECT_TRUE((*session)->run_until(102, LoggingStep()).ok());
  EXPECT_THAT(log_, ElementsAre("a.before_run 101", "step 101", "a.after_run 101",
                                "a.before_run 102", "step 102", "a.after_run 102", "a.end 102"));
  EXPECT_EQ((*session)->global_step(), 102);
}

TEST_P(SessionTest, EachStepRunsBeforeRunThenStepThenAfterRunInHookOrder) {
  auto session = MakeSession();
  ASSERT_TRUE(session->run(LoggingStep()).ok());
  ASSERT_TRUE(session->run(LoggingStep()).ok());
  EXPECT_THAT(log_, ElementsAre("a.before_run 1", "b.before_run 1", "step 1", "a.after_run 1",
                                "b.after_run 1", "a.before_run 2", "b.before_run 2", "step 2",
                                "a.after_run 2", "b.after_run 2"));
  EXPECT_EQ(session->global_step(), 2);
  EXPECT_FALSE(session->should_stop());
}

TEST_P(SessionTest, FetchesFromHooksReachTheStepAndProvidedValuesReachAfterRun) {
  a_.fetches = {"loss"};
  b_.fetches = {"loss", "learning_rate"};
  auto session = MakeSession();
  std::set<std::string> seen_fetches;
  ASSERT_TRUE(session
                  ->run([&](StepContext& context) {
                    seen_fetches = context.fetches();
                    EXPECT_TRUE(context.wants("loss"));
                    EXPECT_FALSE(context.wants("accuracy"));
                    context.provide("loss", 0.25);
                    context.provide("learning_rate", 1e-3f);
                    context.provide("accuracy", 0.9);  // Nobody asked: dropped.
                    return Status::OK();
                  })
                  .ok());
  EXPECT_THAT(seen_fetches, ElementsAre("learning_rate", "loss"));
  for (RecordingHook* hook : {&a_, &b_}) {
    ASSERT_EQ(hook->received.count(1), 1u);
    const auto& results = hook->received[1].results;
    ASSERT_EQ(results.size(), 2u);
    EXPECT_EQ(std::any_cast<double>(results.at("loss")), 0.25);
    EXPECT_EQ(std::any_cast<float>(results.at("learning_rate")), 1e-3f);
  }
}

TEST_P(SessionTest, RunUntilLastStepCallsEndWithTheLastStep) {
  auto session = MakeSession();
  EXPECT_TRUE(session->run_until(3, LoggingStep()).ok());
  EXPECT_EQ(session->global_step(), 3);
  EXPECT_THAT(Tail(log_, 3), ElementsAre("b.after_run 3", "a.end 3", "b.end 3"));
  EXPECT_THAT(log_, Not(Contains("step 4")));
}

TEST_P(SessionTest, RunUntilAtOrPastLastStepRunsNothingButCloses) {
  auto session = MakeSession(5);
  EXPECT_TRUE(session->run_until(5, LoggingStep()).ok());
  EXPECT_THAT(log_, ElementsAre("a.end 5", "b.end 5"));
}

TEST_P(SessionTest, EndOfDataIsNormalFinishWithoutAfterRunForThatStep) {
  auto session = MakeSession();
  Status status = session->run_until(10, StepFailingAt(3, Status::OutOfRange("input exhausted")));
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(session->global_step(), 2);
  EXPECT_TRUE(session->should_stop());
  EXPECT_THAT(Tail(log_, 5),
              ElementsAre("a.before_run 3", "b.before_run 3", "step 3", "a.end 2", "b.end 2"));
  EXPECT_THAT(log_, Not(Contains("a.after_run 3")));
}

TEST_P(SessionTest, RunReturnsOutOfRangeAndCloseStillCallsEnd) {
  auto session = MakeSession();
  Status status = session->run(StepFailingAt(1, Status::OutOfRange("input exhausted")));
  EXPECT_EQ(status.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(status.message(), "input exhausted");
  EXPECT_TRUE(session->should_stop());
  EXPECT_EQ(session->global_step(), 0);
  EXPECT_TRUE(session->close().ok());
  EXPECT_THAT(log_,
              ElementsAre("a.before_run 1", "b.before_run 1", "step 1", "a.end 0", "b.end 0"));
}

TEST_P(SessionTest, StepErrorSkipsAfterRunAndEnd) {
  auto session = MakeSession();
  Status status = session->run_until(10, StepFailingAt(2, Status::IOError("device lost")));
  EXPECT_EQ(status.code(), StatusCode::kIOError);
  EXPECT_EQ(status.message(), "device lost");
  EXPECT_TRUE(session->should_stop());
  EXPECT_EQ(session->global_step(), 1);
  EXPECT_THAT(Tail(log_, 3), ElementsAre("a.before_run 2", "b.before_run 2", "step 2"));
  EXPECT_THAT(log_, Not(Contains("a.after_run 2")));
  EXPECT_THAT(log_, Not(Contains(HasSubstr(".end"))));
}

TEST_P(SessionTest, StepExceptionIsInternalAndSkipsAfterRunAndEnd) {
  auto session = MakeSession();
  Status status = session->run_until(10, [this](StepContext& context) -> Status {
    log_.push_back("step " + std::to_string(context.step()));
    if (context.step() == 2) throw std::runtime_error("out of device memory");
    return Status::OK();
  });
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_EQ(status.message(), "step 2 threw: out of device memory");
  EXPECT_EQ(session->global_step(), 1);
  EXPECT_EQ(log_.back(), "step 2");
  EXPECT_THAT(log_, Not(Contains(HasSubstr(".end"))));
}

TEST_P(SessionTest, StepThrowingNonStandardExceptionIsInternal) {
  auto session = MakeSession();
  Status status = session->run([](StepContext&) -> Status { throw 42; });
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("step 1 threw"));
  EXPECT_TRUE(session->close().ok());
  EXPECT_THAT(log_, Not(Contains(HasSubstr(".end"))));
}

TEST_P(SessionTest, RequestStopFromAfterRunStopsAfterThatStepAndEndRuns) {
  b_.stop_in_after_run_at = 2;
  auto session = MakeSession();
  EXPECT_TRUE(session->run_until(10, LoggingStep()).ok());
  EXPECT_EQ(session->global_step(), 2);
  EXPECT_TRUE(session->should_stop());
  EXPECT_THAT(Tail(log_, 5),
              ElementsAre("step 2", "a.after_run 2", "b.after_run 2", "a.end 2", "b.end 2"));
  EXPECT_THAT(log_, Not(Contains("step 3")));
}

TEST_P(SessionTest, RequestStopFromBeforeRunStopsOnceTheStepCompletes) {
  a_.stop_in_before_run_at = 1;
  auto session = MakeSession();
  EXPECT_TRUE(session->run_until(10, LoggingStep()).ok());
  EXPECT_THAT(log_, ElementsAre("a.before_run 1", "b.before_run 1", "step 1", "a.after_run 1",
                                "b.after_run 1", "a.end 1", "b.end 1"));
}

TEST_P(SessionTest, RequestStopOnSessionStopsTheLoop) {
  auto session = MakeSession();
  MonitoredSessionBase* raw = session.get();
  EXPECT_TRUE(session
                  ->run_until(10,
                              [raw](StepContext& context) {
                                if (context.step() == 3) raw->request_stop();
                                return Status::OK();
                              })
                  .ok());
  EXPECT_EQ(session->global_step(), 3);
  EXPECT_EQ(log_.back(), "b.end 3");
}

TEST_P(SessionTest, BeforeRunFailureFailsSessionWithoutRunningTheStep) {
  a_.before_run_fault = Fault{2, Status::IOError("a before_run")};
  auto session = MakeSession();
  Status status = session->run_until(10, LoggingStep());
  EXPECT_EQ(status.code(), StatusCode::kIOError);
  EXPECT_EQ(status.message(), "a before_run");
  EXPECT_TRUE(session->should_stop());
  EXPECT_EQ(session->global_step(), 1);
  EXPECT_EQ(log_.back(), "a.before_run 2");
}

TEST_P(SessionTest, AfterRunFailureFailsSessionAndSkipsLaterHooksAndEnd) {
  a_.after_run_fault = Fault{2, Status::IOError("a after_run")};
  auto session = MakeSession();
  Status status = session->run_until(10, LoggingStep());
  EXPECT_EQ(status.code(), StatusCode::kIOError);
  EXPECT_EQ(status.message(), "a after_run");
  EXPECT_EQ(session->global_step(), 2);  // The step itself completed.
  EXPECT_EQ(log_.back(), "a.after_run 2");
  EXPECT_THAT(log_, Not(Contains(HasSubstr(".end"))));
}

TEST_P(SessionTest, HookExceptionIsInternalNamingTheHook) {
  b_.throw_in_after_run_at = 1;
  auto session = MakeSession();
  Status status = session->run(LoggingStep());
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_EQ(status.message(), "hook #1 after_run() threw: hook exploded");
  EXPECT_TRUE(session->should_stop());
}

TEST_P(SessionTest, RunAfterFailureIsFailedPreconditionAndDoesNotRunTheStep) {
  auto session = MakeSession();
  ASSERT_EQ(session->run(StepFailingAt(1, Status::Corruption("bad batch"))).code(),
            StatusCode::kCorruption);
  log_.clear();
  EXPECT_EQ(session->run(LoggingStep()).code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(log_, IsEmpty());
}

TEST_P(SessionTest, RunAfterCloseIsFailedPrecondition) {
  auto session = MakeSession();
  ASSERT_TRUE(session->close().ok());
  log_.clear();
  EXPECT_EQ(session->run(LoggingStep()).code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(log_, IsEmpty());
}

TEST_P(SessionTest, CloseIsIdempotent) {
  auto session = MakeSession();
  ASSERT_TRUE(session->run(LoggingStep()).ok());
  EXPECT_TRUE(session->close().ok());
  EXPECT_TRUE(session->close().ok());
  session.reset();  // The destructor must not close again either.
  EXPECT_THAT(log_, ElementsAre("a.before_run 1", "b.before_run 1", "step 1", "a.after_run 1",
                                "b.after_run 1", "a.end 1", "b.end 1"));
}

TEST_P(SessionTest, EndFailureStillCallsLaterHooksAndReturnsTheFirst) {
  a_.end_status = Status::IOError("a could not flush");
  b_.end_status = Status::IOError("b could not flush");
  auto session = MakeSession();
  Status status = session->run_until(1, LoggingStep());
  EXPECT_EQ(status.code(), StatusCode::kIOError);
  EXPECT_EQ(status.message(), "a could not flush");
  EXPECT_THAT(Tail(log_, 2), ElementsAre("a.end 1", "b.end 1"));
}

TEST_P(SessionTest, DestructorClosesAnOpenSession) {
  auto session = MakeSession();
  ASSERT_TRUE(session->run(LoggingStep()).ok());
  session.reset();
  EXPECT_THAT(Tail(log_, 2), ElementsAre("a.end 1", "b.end 1"));
}

TEST_P(SessionTest, DestructorAfterFailureDoesNotCallEnd) {
  auto session = MakeSession();
  ASSERT_FALSE(session->run(StepFailingAt(1, Status::Internal("nan loss"))).ok());
  session.reset();
  EXPECT_THAT(log_, Not(Contains(HasSubstr(".end"))));
}

TEST_P(SessionTest, RunAfterAHookRequestedAStopFailsAndRunsNothing) {
  b_.stop_in_after_run_at = 1;
  auto session = MakeSession();
  ASSERT_TRUE(session->run(LoggingStep()).ok());
  ASSERT_TRUE(session->should_stop());
  log_.clear();
  Status status = session->run(LoggingStep());
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("should_stop"));
  EXPECT_THAT(status.message(), HasSubstr("step 2 not run"));
  EXPECT_THAT(log_, IsEmpty());
  EXPECT_EQ(session->global_step(), 1);
  // The refused run is the caller's mistake, not a failure of the job: end() still runs.
  EXPECT_TRUE(session->close().ok());
  EXPECT_THAT(log_, ElementsAre("a.end 1", "b.end 1"));
}

TEST_P(SessionTest, RunAfterRequestStopOnTheSessionFailsAndRunsNothing) {
  auto session = MakeSession();
  session->request_stop();
  EXPECT_EQ(session->run(LoggingStep()).code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(log_, IsEmpty());
  EXPECT_EQ(session->global_step(), 0);
}

TEST_P(SessionTest, RunAfterEndOfDataFailsAndRunsNothing) {
  auto session = MakeSession();
  ASSERT_EQ(session->run(StepFailingAt(1, Status::OutOfRange("input exhausted"))).code(),
            StatusCode::kOutOfRange);
  log_.clear();
  EXPECT_EQ(session->run(LoggingStep()).code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(log_, IsEmpty());
}

// ---- SingularMonitoredSession: no recovery --------------------------------------------------

TEST(SingularMonitoredSessionTest, PreemptionErrorsEndTheSessionLikeAnyOtherWithoutEnd) {
  for (const Status& preempted : {Status::Unavailable("device lost"), Status::Aborted("gone")}) {
    CallLog log;
    RecordingHook hook("a", &log);
    auto session = SingularMonitoredSession::Create({&hook}, 0);
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    log.clear();
    Status status = (*session)->run_until(10, FaultyStep(&log, Fault{2, preempted}));
    EXPECT_EQ(status.code(), preempted.code());
    EXPECT_EQ(status.message(), preempted.message());
    EXPECT_EQ((*session)->global_step(), 1);
    EXPECT_EQ(log.back(), "step 2");
    EXPECT_EQ(Count(log, "a.after_create_session 0"), 0u);
    EXPECT_THAT(log, Not(Contains(HasSubstr(".end"))));
  }
}

// ---- MonitoredSession: recovery from pre-emption --------------------------------------------

// Where a pre-emption error is planted, and which one.
enum class Where { kStep, kBeforeRun, kAfterRun };

struct RecoveryCase {
  Where where;
  StatusCode code;
};

void PrintTo(const RecoveryCase& c, std::ostream* os) {
  *os << (c.where == Where::kStep        ? "step"
          : c.where == Where::kBeforeRun ? "before_run"
                                         : "after_run")
      << " " << StatusCodeName(c.code);
}

// Collects log lines for the life of the object.
class LogCapture {
 public:
  LogCapture() {
    previous_ = SetLogSink([this](LogLevel, std::string_view line) { lines_.emplace_back(line); });
  }
  ~LogCapture() { SetLogSink(previous_); }
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  LogSinkFunction previous_;
  std::vector<std::string> lines_;
};

class MonitoredSessionTest : public ::testing::Test {
 protected:
  // A session over hooks a and b whose creator starts it at step 0 and restores step
  // `restored` at every re-creation.
  std::unique_ptr<MonitoredSession> MakeSession(int64_t restored,
                                                MonitoredSessionOptions options = {}) {
    creator_ = FakeCreator(&log_, restored);
    creator_.results = {int64_t{0}};
    auto session = MonitoredSession::Create({&a_, &b_}, &creator_, options);
    EXPECT_TRUE(session.ok()) << session.status().ToString();
    log_.clear();
    return session.ok() ? std::move(session).value() : nullptr;
  }

  static Status Preemption(StatusCode code, const std::string& what) {
    return Status(code, what + " pre-empted");
  }

  CallLog log_;
  RecordingHook a_{"a", &log_};
  RecordingHook b_{"b", &log_};
  FakeCreator creator_{&log_};
};

class MonitoredSessionRecoveryTest : public MonitoredSessionTest,
                                     public ::testing::WithParamInterface<RecoveryCase> {};

TEST_P(MonitoredSessionRecoveryTest, RecreatesTheSessionCallsAfterCreateSessionAgainAndRetries) {
  const RecoveryCase& c = GetParam();
  LogCapture logs;
  auto session = MakeSession(/*restored=*/2);
  ASSERT_NE(session, nullptr);
  const Fault once{4, Preemption(c.code, "step 4"), 1};
  StepFn step = LoggingStep(&log_);
  if (c.where == Where::kStep) step = FaultyStep(&log_, once);
  if (c.where == Where::kBeforeRun) b_.before_run_fault = once;
  if (c.where == Where::kAfterRun) a_.after_run_fault = once;

  for (int i = 0; i < 3; ++i) ASSERT_TRUE(session->run(step).ok());
  log_.clear();
  // Step 4 is pre-empted; the session comes back at step 2 and run() returns the retried step,
  // which makes step 3 again.
  Status status = session->run(step);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(session->global_step(), 3);
  EXPECT_EQ(session->recoveries(), 1);
  EXPECT_FALSE(session->should_stop());
  CallLog failed_attempt = {"a.before_run 4", "b.before_run 4"};
  if (c.where != Where::kBeforeRun) failed_attempt.push_back("step 4");
  if (c.where == Where::kAfterRun) failed_attempt.push_back("a.after_run 4");
  CallLog expected = failed_attempt;
  // Every hook finishes what it has in flight before the creator restores.
  for (const char* call : {"a.before_recovery", "b.before_recovery", "create_session -> 2",
                           "a.after_create_session 2", "b.after_create_session 2", "a.before_run 3",
                           "b.before_run 3", "step 3", "a.after_run 3", "b.after_run 3"}) {
    expected.push_back(call);
  }
  EXPECT_EQ(log_, expected);
  EXPECT_EQ(Count(log_, "a.begin"), 0u);
  ASSERT_FALSE(logs.lines().empty());
  EXPECT_THAT(logs.lines().front(), HasSubstr("step 4 pre-empted"));
  EXPECT_THAT(logs.lines().back(), HasSubstr("from step 2"));

  // The job then goes on to its last step; end() runs once, at close.
  log_.clear();
  EXPECT_TRUE(session->run_until(6, step).ok());
  EXPECT_THAT(Tail(log_, 2), ElementsAre("a.end 6", "b.end 6"));
  EXPECT_EQ(Count(log_, "a.end 6"), 1u);
  EXPECT_EQ(creator_.calls, 2);
}

INSTANTIATE_TEST_SUITE_P(StepAndHooks, MonitoredSessionRecoveryTest,
                         ::testing::Values(RecoveryCase{Where::kStep, StatusCode::kUnavailable},
                                           RecoveryCase{Where::kStep, StatusCode::kAborted},
                                           RecoveryCase{Where::kBeforeRun,
                                                        StatusCode::kUnavailable},
                                           RecoveryCase{Where::kBeforeRun, StatusCode::kAborted},
                                           RecoveryCase{Where::kAfterRun, StatusCode::kUnavailable},
                                           RecoveryCase{Where::kAfterRun, StatusCode::kAborted}),
                         [](const ::testing::TestParamInfo<RecoveryCase>& info) {
                           const char* where = info.param.where == Where::kStep        ? "Step"
                                               : info.param.where == Where::kBeforeRun ? "BeforeRun"
                                                                                       : "AfterRun";
                           return std::string(where) + std::string(StatusCodeName(info.param.code));
                         });

TEST_F(MonitoredSessionTest, CreateCallsBeginThenTheCreatorThenAfterCreateSessionWithItsStep) {
  FakeCreator creator(&log_, 7);
  auto session = MonitoredSession::Create({&a_, &b_}, &creator);
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  EXPECT_THAT(log_, ElementsAre("a.begin", "b.begin", "create_session -> 7",
                                "a.after_create_session 7", "b.after_create_session 7"));
  EXPECT_EQ((*session)->global_step(), 7);
  EXPECT_EQ((*session)->recoveries(), 0);
}

TEST_F(MonitoredSessionTest, AFailedBeforeRecoveryIsLoggedAndTheRecoveryGoesOn) {
  LogCapture logs;
  auto session = MakeSession(/*restored=*/1);
  ASSERT_NE(session, nullptr);
  a_.before_recovery_status = Status::IOError("draining failed");
  StepFn step = FaultyStep(&log_, Fault{2, Preemption(StatusCode::kUnavailable, "step 2"), 1});
  ASSERT_TRUE(session->run(step).ok());
  ASSERT_TRUE(session->run(step).ok());  // pre-empted, recovered at 1, step 2 retried
  EXPECT_EQ(session->global_step(), 2);
  EXPECT_EQ(session->recoveries(), 1);
  EXPECT_EQ(Count(log_, "b.before_recovery"), 1u);
  bool logged = false;
  for (const std::string& line : logs.lines()) {
    logged = logged || line.find("draining failed") != std::string::npos;
  }
  EXPECT_TRUE(logged);
}

TEST_F(MonitoredSessionTest, OtherErrorsAreNotRecovered) {
  for (const Status& error : {Status::IOError("disk"), Status::Internal("nan loss"),
                              Status::FailedPrecondition("no input checkpoint")}) {
    log_.clear();
    auto session = MakeSession(/*restored=*/0);
    ASSERT_NE(session, nullptr);
    Status status = session->run_until(5, FaultyStep(&log_, Fault{2, error}));
    EXPECT_EQ(status.code(), error.code());
    EXPECT_EQ(session->recoveries(), 0);
    EXPECT_EQ(creator_.calls, 1) << error.ToString();
    EXPECT_THAT(log_, Not(Contains(HasSubstr("create_session"))));
    EXPECT_THAT(log_, Not(Contains(HasSubstr(".end"))));
  }
}

TEST_F(MonitoredSessionTest, AThrowingStepIsInternalAndNotRecovered) {
  auto session = MakeSession(/*restored=*/0);
  ASSERT_NE(session, nullptr);
  Status status = session->run([](StepContext&) -> Status { throw std::runtime_error("boom"); });
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_EQ(creator_.calls, 1);
}

TEST_F(MonitoredSessionTest, EndOfDataIsNotRecoveredButFinishes) {
  auto session = MakeSession(/*restored=*/0);
  ASSERT_NE(session, nullptr);
  EXPECT_TRUE(
      session->run_until(9, FaultyStep(&log_, Fault{3, Status::OutOfRange("input exhausted")}))
          .ok());
  EXPECT_EQ(creator_.calls, 1);
  EXPECT_THAT(Tail(log_, 2), ElementsAre("a.end 2", "b.end 2"));
}

TEST_F(MonitoredSessionTest, GivesUpAfterTheBoundOfConsecutiveRecoveriesNamingIt) {
  LogCapture logs;
  auto session = MakeSession(/*restored=*/0, {.max_consecutive_recoveries = 3});
  ASSERT_NE(session, nullptr);
  // Step 1 is pre-empted every time: no step completes between the recoveries.
  Status status =
      session->run_until(5, FaultyStep(&log_, Fault{1, Status::Unavailable("device lost")}));
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("gave up after 3 consecutive recoveries"));
  EXPECT_THAT(status.message(), HasSubstr("max_consecutive_recoveries 3"));
  EXPECT_THAT(status.message(), HasSubstr("device lost"));
  EXPECT_EQ(session->recoveries(), 3);
  EXPECT_EQ(creator_.calls, 4);
  EXPECT_EQ(Count(log_, "step 1"), 4u);
  EXPECT_TRUE(session->should_stop());
  EXPECT_THAT(log_, Not(Contains(HasSubstr(".end"))));
  EXPECT_EQ(session->run(LoggingStep(&log_)).code(), StatusCode::kFailedPrecondition);
  size_t recovery_lines = 0;
  for (const std::string& line : logs.lines()) {
    if (line.find("re-creating the session") != std::string::npos) ++recovery_lines;
  }
  EXPECT_EQ(recovery_lines, 3u);
}

TEST_F(MonitoredSessionTest, ReplayedStepsBeforeTheStruckStepDoNotResetTheBound) {
  auto session = MakeSession(/*restored=*/0, {.max_consecutive_recoveries = 3});
  ASSERT_NE(session, nullptr);
  // Steps 1 and 2 complete after each recovery, but step 3 is pre-empted every time.
  Status status =
      session->run_until(5, FaultyStep(&log_, Fault{3, Status::Unavailable("device lost")}));
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("gave up after 3 consecutive recoveries without getting past "
                                  "step 3"),
            std::string::npos)
      << status.ToString();
  EXPECT_EQ(session->recoveries(), 3);
  EXPECT_EQ(Count(log_, "step 3"), 4u);
}

TEST_F(MonitoredSessionTest, ZeroRecoveriesFailsAtTheFirstPreemption) {
  auto session = MakeSession(/*restored=*/0, {.max_consecutive_recoveries = 0});
  ASSERT_NE(session, nullptr);
  Status status = session->run(FaultyStep(&log_, Fault{1, Status::Aborted("pre-empted")}));
  EXPECT_EQ(status.code(), StatusCode::kAborted);
  EXPECT_THAT(status.message(), HasSubstr("gave up after 0 consecutive recoveries"));
  EXPECT_EQ(creator_.calls, 1);
}

TEST_F(MonitoredSessionTest, ACompletedStepResetsTheBound) {
  auto session = MakeSession(/*restored=*/1, {.max_consecutive_recoveries = 1});
  ASSERT_NE(session, nullptr);
  // Steps 2 and 3 are each pre-empted once; step 2 completes in between (twice: the session
  // goes back to step 1 after each recovery).
  a_.before_run_fault = Fault{2, Status::Unavailable("first"), 1};
  b_.after_run_fault = Fault{3, Status::Aborted("second"), 1};
  Status status = session->run_until(4, LoggingStep(&log_));
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(session->recoveries(), 2);
  EXPECT_EQ(session->global_step(), 4);
}

TEST_F(MonitoredSessionTest, PreemptionWhileRecreatingIsRetriedWithinTheBound) {
  auto session = MakeSession(/*restored=*/5);
  ASSERT_NE(session, nullptr);
  creator_.results = {Status::Unavailable("restore pre-empted")};
  a_.after_create_session_fault = Fault{5, Status::Aborted("hook pre-empted"), 1};
  Status status = session->run(FaultyStep(&log_, Fault{1, Status::Unavailable("step"), 1}));
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(session->global_step(), 6);
  EXPECT_EQ(session->recoveries(), 1);
  EXPECT_EQ(creator_.calls, 4);
  EXPECT_THAT(
      log_,
      ElementsAre("a.before_run 1", "b.before_run 1", "step 1", "a.before_recovery",
                  "b.before_recovery", "create_session failed: Unavailable: restore pre-empted",
                  "a.before_recovery", "b.before_recovery", "create_session -> 5",
                  "a.after_create_session 5", "a.before_recovery", "b.before_recovery",
                  "create_session -> 5", "a.after_create_session 5", "b.after_create_session 5",
                  "a.before_run 6", "b.before_run 6", "step 6", "a.after_run 6", "b.after_run 6"));
}

TEST_F(MonitoredSessionTest, AFailureWhileRecreatingThatIsNoPreemptionFailsTheSession) {
  auto session = MakeSession(/*restored=*/0);
  ASSERT_NE(session, nullptr);
  creator_.results = {Status::Corruption("model.ckpt-4/index: bad checksum")};
  Status status = session->run_until(5, FaultyStep(&log_, Fault{2, Status::Unavailable("x"), 1}));
  EXPECT_EQ(status.code(), StatusCode::kCorruption);
  EXPECT_THAT(status.message(), HasSubstr("model.ckpt-4/index"));
  EXPECT_TRUE(session->should_stop());
  EXPECT_THAT(log_, Not(Contains(HasSubstr(".end"))));
}

TEST_F(MonitoredSessionTest, ACreatorThatThrowsIsInternal) {
  auto session = MakeSession(/*restored=*/0);
  ASSERT_NE(session, nullptr);
  creator_.throw_next = true;
  Status status = session->run(FaultyStep(&log_, Fault{1, Status::Unavailable("x"), 1}));
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("restore exploded"));
}

TEST_F(MonitoredSessionTest, CreateRetriesAPreemptedFirstSession) {
  FakeCreator creator(&log_, 7);
  creator.results = {Status::Unavailable("not yet")};
  auto session = MonitoredSession::Create({&a_}, &creator);
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  EXPECT_THAT(log_,
              ElementsAre("a.begin", "create_session failed: Unavailable: not yet",
                          "a.before_recovery", "create_session -> 7", "a.after_create_session 7"));
  EXPECT_EQ((*session)->global_step(), 7);
  EXPECT_EQ((*session)->recoveries(), 1);
}

TEST_F(MonitoredSessionTest, CreateFailsWithTheCreatorsOtherErrors) {
  FakeCreator creator(&log_);
  creator.results = {Status::FailedPrecondition("model.ckpt-8 has no input partner")};
  auto session = MonitoredSession::Create({&a_}, &creator);
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(session.status().message(), HasSubstr("model.ckpt-8 has no input partner"));
  EXPECT_THAT(log_, Not(Contains(HasSubstr("after_create_session"))));
}

TEST_F(MonitoredSessionTest, CreateRejectsANullCreatorANullHookAndANegativeBound) {
  FakeCreator creator;
  EXPECT_EQ(MonitoredSession::Create({&a_}, nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MonitoredSession::Create({nullptr}, &creator).status().code(),
            StatusCode::kInvalidArgument);
  auto negative = MonitoredSession::Create({&a_}, &creator, {.max_consecutive_recoveries = -1});
  EXPECT_EQ(negative.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.status().message(), HasSubstr("-1"));
  EXPECT_THAT(log_, IsEmpty());
}

TEST_F(MonitoredSessionTest, AStopRequestedOnTheSessionDuringAFailedAttemptEndsAtTheRestoredStep) {
  auto session = MakeSession(/*restored=*/1);
  ASSERT_NE(session, nullptr);
  ASSERT_TRUE(session->run(LoggingStep(&log_)).ok());
  ASSERT_TRUE(session->run(LoggingStep(&log_)).ok());
  MonitoredSession* raw = session.get();
  log_.clear();
  Status status = session->run([&](StepContext&) {
    raw->request_stop();
    return Status::Unavailable("pre-empted while stopping");
  });
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_TRUE(session->should_stop());
  EXPECT_EQ(session->global_step(), 1);
  EXPECT_TRUE(session->close().ok());
  EXPECT_THAT(log_,
              ElementsAre("a.before_run 3", "b.before_run 3", "a.before_recovery",
                          "b.before_recovery", "create_session -> 1", "a.after_create_session 1",
                          "b.after_create_session 1", "a.end 1", "b.end 1"));
}

TEST_F(MonitoredSessionTest, AStopAHookRequestedDuringAFailedAttemptIsDroppedWithIt) {
  auto session = MakeSession(/*restored=*/1);
  ASSERT_NE(session, nullptr);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(session->run(LoggingStep(&log_)).ok());
  a_.stop_in_before_run_at = 4;
  b_.before_run_fault = Fault{4, Status::Unavailable("pre-empted"), 1};
  Status status = session->run(LoggingStep(&log_));
  ASSERT_TRUE(status.ok()) << status.ToString();
  // The retried run made step 2, where nobody asks to stop.
  EXPECT_EQ(session->global_step(), 2);
  EXPECT_FALSE(session->should_stop());
}

}  // namespace
}  // namespace asyncckpt
