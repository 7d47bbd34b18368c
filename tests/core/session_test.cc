#include "asyncckpt/session.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <any>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "asyncckpt/hooks.h"

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
    return Status::OK();
  }
  Result<RunArgs> before_run(RunContext& context) override {
    Record("before_run " + std::to_string(context.step()));
    if (fail_before_run_at == context.step()) return Status::Unavailable(name_ + " before_run");
    if (stop_in_before_run_at == context.step()) context.request_stop();
    return RunArgs{fetches};
  }
  Status after_run(RunContext& context, const RunValues& values) override {
    Record("after_run " + std::to_string(context.step()));
    received[context.step()] = values;
    if (throw_in_after_run_at == context.step()) throw std::runtime_error("hook exploded");
    if (fail_after_run_at == context.step()) return Status::IOError(name_ + " after_run");
    if (stop_in_after_run_at == context.step()) context.request_stop();
    return Status::OK();
  }
  Status end(int64_t global_step) override {
    Record("end " + std::to_string(global_step));
    return end_status;
  }

  std::vector<std::string> fetches;
  Status begin_status;
  Status end_status;
  std::optional<int64_t> fail_before_run_at;
  std::optional<int64_t> fail_after_run_at;
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

class MonitoredSessionTest : public ::testing::Test {
 protected:
  std::unique_ptr<MonitoredSession> MakeSession(int64_t initial_step = 0) {
    auto session = MonitoredSession::Create({&a_, &b_}, initial_step);
    EXPECT_TRUE(session.ok()) << session.status().ToString();
    log_.clear();  // Tests about steps start with an empty log.
    return std::move(session).value();
  }

  // A step that logs itself and succeeds.
  StepFn LoggingStep() {
    return [this](StepContext& context) {
      log_.push_back("step " + std::to_string(context.step()));
      return Status::OK();
    };
  }

  // A step that logs itself and returns `failure` at step `at`.
  StepFn StepFailingAt(int64_t at, Status failure) {
    return [this, at, failure](StepContext& context) {
      log_.push_back("step " + std::to_string(context.step()));
      return context.step() == at ? failure : Status::OK();
    };
  }

  CallLog log_;
  RecordingHook a_{"a", &log_};
  RecordingHook b_{"b", &log_};
};

TEST_F(MonitoredSessionTest, CreateCallsBeginOnEveryHookThenAfterCreateSession) {
  auto session = MonitoredSession::Create({&a_, &b_});
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  EXPECT_THAT(log_, ElementsAre("a.begin", "b.begin", "a.after_create_session 0",
                                "b.after_create_session 0"));
  EXPECT_EQ((*session)->global_step(), 0);
  EXPECT_FALSE((*session)->should_stop());
}

TEST_F(MonitoredSessionTest, CreateReturnsFirstBeginFailureAndSkipsLaterHooks) {
  a_.begin_status = Status::NotFound("a has no checkpoint dir");
  auto session = MonitoredSession::Create({&a_, &b_});
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(session.status().message(), "a has no checkpoint dir");
  EXPECT_THAT(log_, ElementsAre("a.begin"));
}

TEST_F(MonitoredSessionTest, CreateRejectsNullHook) {
  auto session = MonitoredSession::Create({&a_, nullptr});
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(session.status().message(), HasSubstr("hook #1"));
  EXPECT_THAT(log_, IsEmpty());
}

TEST_F(MonitoredSessionTest, InitialStepReachesAfterCreateSessionAndStepsContinueFromIt) {
  auto session = MonitoredSession::Create({&a_}, 100);
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  EXPECT_THAT(log_, ElementsAre("a.begin", "a.after_create_session 100"));
  log_.clear();
  EXPECT_TRUE((*session)->run_until(102, LoggingStep()).ok());
  EXPECT_THAT(log_, ElementsAre("a.before_run 101", "step 101", "a.after_run 101",
                                "a.before_run 102", "step 102", "a.after_run 102", "a.end 102"));
  EXPECT_EQ((*session)->global_step(), 102);
}

TEST_F(MonitoredSessionTest, EachStepRunsBeforeRunThenStepThenAfterRunInHookOrder) {
  auto session = MakeSession();
  ASSERT_TRUE(session->run(LoggingStep()).ok());
  ASSERT_TRUE(session->run(LoggingStep()).ok());
  EXPECT_THAT(log_, ElementsAre("a.before_run 1", "b.before_run 1", "step 1", "a.after_run 1",
                                "b.after_run 1", "a.before_run 2", "b.before_run 2", "step 2",
                                "a.after_run 2", "b.after_run 2"));
  EXPECT_EQ(session->global_step(), 2);
  EXPECT_FALSE(session->should_stop());
}

TEST_F(MonitoredSessionTest, FetchesFromHooksReachTheStepAndProvidedValuesReachAfterRun) {
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

TEST_F(MonitoredSessionTest, RunUntilLastStepCallsEndWithTheLastStep) {
  auto session = MakeSession();
  EXPECT_TRUE(session->run_until(3, LoggingStep()).ok());
  EXPECT_EQ(session->global_step(), 3);
  EXPECT_THAT(Tail(log_, 3), ElementsAre("b.after_run 3", "a.end 3", "b.end 3"));
  EXPECT_THAT(log_, Not(Contains("step 4")));
}

TEST_F(MonitoredSessionTest, RunUntilAtOrPastLastStepRunsNothingButCloses) {
  auto session = MakeSession(5);
  EXPECT_TRUE(session->run_until(5, LoggingStep()).ok());
  EXPECT_THAT(log_, ElementsAre("a.end 5", "b.end 5"));
}

TEST_F(MonitoredSessionTest, EndOfDataIsNormalFinishWithoutAfterRunForThatStep) {
  auto session = MakeSession();
  Status status = session->run_until(10, StepFailingAt(3, Status::OutOfRange("input exhausted")));
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(session->global_step(), 2);
  EXPECT_TRUE(session->should_stop());
  EXPECT_THAT(Tail(log_, 5),
              ElementsAre("a.before_run 3", "b.before_run 3", "step 3", "a.end 2", "b.end 2"));
  EXPECT_THAT(log_, Not(Contains("a.after_run 3")));
}

TEST_F(MonitoredSessionTest, RunReturnsOutOfRangeAndCloseStillCallsEnd) {
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

TEST_F(MonitoredSessionTest, StepErrorSkipsAfterRunAndEnd) {
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

TEST_F(MonitoredSessionTest, StepExceptionIsInternalAndSkipsAfterRunAndEnd) {
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

TEST_F(MonitoredSessionTest, StepThrowingNonStandardExceptionIsInternal) {
  auto session = MakeSession();
  Status status = session->run([](StepContext&) -> Status { throw 42; });
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("step 1 threw"));
  EXPECT_TRUE(session->close().ok());
  EXPECT_THAT(log_, Not(Contains(HasSubstr(".end"))));
}

TEST_F(MonitoredSessionTest, RequestStopFromAfterRunStopsAfterThatStepAndEndRuns) {
  b_.stop_in_after_run_at = 2;
  auto session = MakeSession();
  EXPECT_TRUE(session->run_until(10, LoggingStep()).ok());
  EXPECT_EQ(session->global_step(), 2);
  EXPECT_TRUE(session->should_stop());
  EXPECT_THAT(Tail(log_, 5),
              ElementsAre("step 2", "a.after_run 2", "b.after_run 2", "a.end 2", "b.end 2"));
  EXPECT_THAT(log_, Not(Contains("step 3")));
}

TEST_F(MonitoredSessionTest, RequestStopFromBeforeRunStopsOnceTheStepCompletes) {
  a_.stop_in_before_run_at = 1;
  auto session = MakeSession();
  EXPECT_TRUE(session->run_until(10, LoggingStep()).ok());
  EXPECT_THAT(log_, ElementsAre("a.before_run 1", "b.before_run 1", "step 1", "a.after_run 1",
                                "b.after_run 1", "a.end 1", "b.end 1"));
}

TEST_F(MonitoredSessionTest, RequestStopOnSessionStopsTheLoop) {
  auto session = MakeSession();
  MonitoredSession* raw = session.get();
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

TEST_F(MonitoredSessionTest, BeforeRunFailureFailsSessionWithoutRunningTheStep) {
  a_.fail_before_run_at = 2;
  auto session = MakeSession();
  Status status = session->run_until(10, LoggingStep());
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(status.message(), "a before_run");
  EXPECT_TRUE(session->should_stop());
  EXPECT_EQ(session->global_step(), 1);
  EXPECT_EQ(log_.back(), "a.before_run 2");
}

TEST_F(MonitoredSessionTest, AfterRunFailureFailsSessionAndSkipsLaterHooksAndEnd) {
  a_.fail_after_run_at = 2;
  auto session = MakeSession();
  Status status = session->run_until(10, LoggingStep());
  EXPECT_EQ(status.code(), StatusCode::kIOError);
  EXPECT_EQ(status.message(), "a after_run");
  EXPECT_EQ(session->global_step(), 2);  // The step itself completed.
  EXPECT_EQ(log_.back(), "a.after_run 2");
  EXPECT_THAT(log_, Not(Contains(HasSubstr(".end"))));
}

TEST_F(MonitoredSessionTest, HookExceptionIsInternalNamingTheHook) {
  b_.throw_in_after_run_at = 1;
  auto session = MakeSession();
  Status status = session->run(LoggingStep());
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_EQ(status.message(), "hook #1 after_run() threw: hook exploded");
  EXPECT_TRUE(session->should_stop());
}

TEST_F(MonitoredSessionTest, RunAfterFailureIsFailedPreconditionAndDoesNotRunTheStep) {
  auto session = MakeSession();
  ASSERT_EQ(session->run(StepFailingAt(1, Status::Corruption("bad batch"))).code(),
            StatusCode::kCorruption);
  log_.clear();
  EXPECT_EQ(session->run(LoggingStep()).code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(log_, IsEmpty());
}

TEST_F(MonitoredSessionTest, RunAfterCloseIsFailedPrecondition) {
  auto session = MakeSession();
  ASSERT_TRUE(session->close().ok());
  log_.clear();
  EXPECT_EQ(session->run(LoggingStep()).code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(log_, IsEmpty());
}

TEST_F(MonitoredSessionTest, CloseIsIdempotent) {
  auto session = MakeSession();
  ASSERT_TRUE(session->run(LoggingStep()).ok());
  EXPECT_TRUE(session->close().ok());
  EXPECT_TRUE(session->close().ok());
  session.reset();  // The destructor must not close again either.
  EXPECT_THAT(log_, ElementsAre("a.before_run 1", "b.before_run 1", "step 1", "a.after_run 1",
                                "b.after_run 1", "a.end 1", "b.end 1"));
}

TEST_F(MonitoredSessionTest, EndFailureStillCallsLaterHooksAndReturnsTheFirst) {
  a_.end_status = Status::IOError("a could not flush");
  b_.end_status = Status::IOError("b could not flush");
  auto session = MakeSession();
  Status status = session->run_until(1, LoggingStep());
  EXPECT_EQ(status.code(), StatusCode::kIOError);
  EXPECT_EQ(status.message(), "a could not flush");
  EXPECT_THAT(Tail(log_, 2), ElementsAre("a.end 1", "b.end 1"));
}

TEST_F(MonitoredSessionTest, DestructorClosesAnOpenSession) {
  auto session = MakeSession();
  ASSERT_TRUE(session->run(LoggingStep()).ok());
  session.reset();
  EXPECT_THAT(Tail(log_, 2), ElementsAre("a.end 1", "b.end 1"));
}

TEST_F(MonitoredSessionTest, DestructorAfterFailureDoesNotCallEnd) {
  auto session = MakeSession();
  ASSERT_FALSE(session->run(StepFailingAt(1, Status::Internal("nan loss"))).ok());
  session.reset();
  EXPECT_THAT(log_, Not(Contains(HasSubstr(".end"))));
}

}  // namespace
}  // namespace asyncckpt
