#include "asyncckpt/timer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace asyncckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;
using ::testing::Pair;

class SecondOrStepTimerTest : public ::testing::Test {
 protected:
  // A clock the test moves by hand.
  Clock FakeClock() {
    return [this] { return now_; };
  }

  SecondOrStepTimer StepTimer(int64_t every_steps) {
    auto timer = SecondOrStepTimer::Create(every_steps, std::nullopt, FakeClock());
    EXPECT_TRUE(timer.ok()) << timer.status().ToString();
    return std::move(timer).value();
  }

  SecondOrStepTimer SecondTimer(double every_secs) {
    auto timer = SecondOrStepTimer::Create(std::nullopt, every_secs, FakeClock());
    EXPECT_TRUE(timer.ok()) << timer.status().ToString();
    return std::move(timer).value();
  }

  // Asks at each step in `steps` and fires when due, as a saver hook does; returns the
  // steps it fired at.
  static std::vector<int64_t> FiringSteps(SecondOrStepTimer& timer,
                                          const std::vector<int64_t>& steps) {
    std::vector<int64_t> fired;
    for (int64_t step : steps) {
      if (!timer.should_trigger_for_step(step)) continue;
      (void)timer.update_last_triggered_step(step);
      fired.push_back(step);
    }
    return fired;
  }

  double now_ = 1000.0;
};

TEST_F(SecondOrStepTimerTest, FiresOnTheFirstStepItSees) {
  SecondOrStepTimer steps = StepTimer(100);
  EXPECT_TRUE(steps.should_trigger_for_step(37));
  EXPECT_EQ(steps.last_triggered_step(), std::nullopt);
  SecondOrStepTimer secs = SecondTimer(3600);
  EXPECT_TRUE(secs.should_trigger_for_step(0));
}

TEST_F(SecondOrStepTimerTest, NeverFiresTwiceForTheSameStep) {
  SecondOrStepTimer steps = StepTimer(1);
  (void)steps.update_last_triggered_step(4);
  EXPECT_FALSE(steps.should_trigger_for_step(4));
  EXPECT_TRUE(steps.should_trigger_for_step(5));

  SecondOrStepTimer secs = SecondTimer(1);
  (void)secs.update_last_triggered_step(4);
  now_ += 1000;  // Long overdue, but still the same step.
  EXPECT_FALSE(secs.should_trigger_for_step(4));
  EXPECT_TRUE(secs.should_trigger_for_step(5));
}

TEST_F(SecondOrStepTimerTest, EveryNStepsFiresExactlyEveryNSteps) {
  SecondOrStepTimer timer = StepTimer(5);
  std::vector<int64_t> steps;
  for (int64_t step = 0; step <= 20; ++step) steps.push_back(step);
  EXPECT_THAT(FiringSteps(timer, steps), ElementsAre(0, 5, 10, 15, 20));
  EXPECT_EQ(timer.last_triggered_step(), 20);
}

TEST_F(SecondOrStepTimerTest, EveryNStepsCountsFromTheLastFiringWhenStepsSkip) {
  SecondOrStepTimer timer = StepTimer(5);
  EXPECT_THAT(FiringSteps(timer, {0, 3, 6, 9, 12, 13, 17}), ElementsAre(0, 6, 12, 17));
}

TEST_F(SecondOrStepTimerTest, EveryNStepsIgnoresTheClock) {
  SecondOrStepTimer timer = StepTimer(10);
  (void)timer.update_last_triggered_step(0);
  now_ += 1e9;
  EXPECT_FALSE(timer.should_trigger_for_step(9));
  EXPECT_TRUE(timer.should_trigger_for_step(10));
}

TEST_F(SecondOrStepTimerTest, HugeEveryStepsDoesNotOverflow) {
  SecondOrStepTimer timer = StepTimer(std::numeric_limits<int64_t>::max());
  (void)timer.update_last_triggered_step(1000);
  EXPECT_FALSE(timer.should_trigger_for_step(std::numeric_limits<int64_t>::max() / 2));
}

TEST_F(SecondOrStepTimerTest, EveryNSecondsFiresWhenTheFakeClockPassesTheInterval) {
  SecondOrStepTimer timer = SecondTimer(10);
  ASSERT_TRUE(timer.should_trigger_for_step(1));
  (void)timer.update_last_triggered_step(1);  // At t=1000.
  now_ = 1005;
  EXPECT_FALSE(timer.should_trigger_for_step(2));
  now_ = 1009.999;
  EXPECT_FALSE(timer.should_trigger_for_step(500));  // Steps do not matter.
  now_ = 1010;
  EXPECT_TRUE(timer.should_trigger_for_step(3));
  (void)timer.update_last_triggered_step(3);
  now_ = 1015;
  EXPECT_FALSE(timer.should_trigger_for_step(4));
  now_ = 1020;
  EXPECT_TRUE(timer.should_trigger_for_step(4));
}

TEST_F(SecondOrStepTimerTest, UpdateReturnsNothingFirstThenElapsedSecondsAndSteps) {
  SecondOrStepTimer timer = SecondTimer(10);
  EXPECT_EQ(timer.update_last_triggered_step(1), std::nullopt);
  EXPECT_EQ(timer.last_triggered_step(), 1);
  now_ = 1012.5;
  EXPECT_THAT(timer.update_last_triggered_step(8), Optional(Pair(12.5, 7)));
  now_ = 1020;
  EXPECT_THAT(timer.update_last_triggered_step(9), Optional(Pair(7.5, 1)));
  EXPECT_EQ(timer.last_triggered_step(), 9);
}

TEST_F(SecondOrStepTimerTest, ResetForgetsTheLastFiring) {
  SecondOrStepTimer timer = StepTimer(100);
  (void)timer.update_last_triggered_step(7);
  EXPECT_FALSE(timer.should_trigger_for_step(8));
  timer.reset();
  EXPECT_EQ(timer.last_triggered_step(), std::nullopt);
  EXPECT_TRUE(timer.should_trigger_for_step(7));
  EXPECT_TRUE(timer.should_trigger_for_step(8));
  EXPECT_EQ(timer.update_last_triggered_step(8), std::nullopt);
}

TEST_F(SecondOrStepTimerTest, BothIntervalsIsInvalidArgument) {
  auto timer = SecondOrStepTimer::Create(10, 60.0, FakeClock());
  ASSERT_FALSE(timer.ok());
  EXPECT_EQ(timer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(timer.status().message(),
              HasSubstr("exactly one of every_steps and every_secs should be provided"));
  EXPECT_THAT(timer.status().message(), HasSubstr("got both (every_steps=10, every_secs=60)"));
}

TEST_F(SecondOrStepTimerTest, NeitherIntervalIsInvalidArgument) {
  auto timer = SecondOrStepTimer::Create(std::nullopt, std::nullopt, FakeClock());
  ASSERT_FALSE(timer.ok());
  EXPECT_EQ(timer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(timer.status().message(),
              HasSubstr("exactly one of every_steps and every_secs should be provided"));
  EXPECT_THAT(timer.status().message(), HasSubstr("got neither"));
}

TEST_F(SecondOrStepTimerTest, NonPositiveEveryStepsIsInvalidArgumentNamingTheValue) {
  for (int64_t bad : {int64_t{0}, int64_t{-3}}) {
    auto timer = SecondOrStepTimer::Create(bad, std::nullopt, FakeClock());
    ASSERT_FALSE(timer.ok()) << bad;
    EXPECT_EQ(timer.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(timer.status().message(),
                HasSubstr("every_steps must be positive, got " + std::to_string(bad)));
  }
}

TEST_F(SecondOrStepTimerTest, NonPositiveOrNonFiniteEverySecsIsInvalidArgumentNamingTheValue) {
  struct Case {
    double value;
    const char* shown;
  };
  for (const Case& bad : {Case{0.0, "got 0"}, Case{-1.5, "got -1.5"}, Case{std::nan(""), "got nan"},
                          Case{std::numeric_limits<double>::infinity(), "got inf"}}) {
    auto timer = SecondOrStepTimer::Create(std::nullopt, bad.value, FakeClock());
    ASSERT_FALSE(timer.ok()) << bad.shown;
    EXPECT_EQ(timer.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(timer.status().message(), HasSubstr("every_secs must be positive"));
    EXPECT_THAT(timer.status().message(), HasSubstr(bad.shown));
  }
}

TEST_F(SecondOrStepTimerTest, EmptyClockIsInvalidArgument) {
  auto timer = SecondOrStepTimer::Create(std::nullopt, 5.0, Clock());
  ASSERT_FALSE(timer.ok());
  EXPECT_EQ(timer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(timer.status().message(), HasSubstr("clock"));
}

TEST_F(SecondOrStepTimerTest, SystemClockSecondsIsSecondsSinceTheEpoch) {
  const double expected =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_NEAR(SystemClockSeconds(), expected, 5.0);
  EXPECT_GT(SystemClockSeconds(), 1.6e9);  // After 2020: seconds, not milli- or microseconds.
  auto timer = SecondOrStepTimer::Create(std::nullopt, 3600.0);
  ASSERT_TRUE(timer.ok()) << timer.status().ToString();
  (void)timer->update_last_triggered_step(1);
  EXPECT_FALSE(timer->should_trigger_for_step(2));  // An hour has not passed.
}

}  // namespace
}  // namespace asyncckpt
