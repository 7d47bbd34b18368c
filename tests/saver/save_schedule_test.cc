// Tests of src/saver/save_schedule.cc: when a saver saves (TensorFlow CheckpointSaverHook's rules)
// and whether the end of a session must still save.

#include "src/saver/save_schedule.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "asyncckpt/coordinator.h"
#include "asyncckpt/saver_options.h"

namespace asyncckpt {
namespace {

SaverOptions Every(int64_t steps) {
  SaverOptions options;
  options.checkpoint_dir = "/tmp/x";
  options.save_steps = steps;
  return options;
}

TEST(SaveScheduleTest, TheFirstStepSeenIsDueThenEveryNStepsAfterTheLastAttempt) {
  Result<SaveSchedule> schedule = SaveSchedule::Create(Every(3));
  ASSERT_TRUE(schedule.ok()) << schedule.status().ToString();
  EXPECT_TRUE(schedule->due(5));  // TensorFlow's rule: not step % N, the first step seen
  schedule->mark(5);
  EXPECT_FALSE(schedule->due(5));
  EXPECT_FALSE(schedule->due(7));
  EXPECT_TRUE(schedule->due(8));
  schedule->mark(8);  // attempted (say skipped): the next is due 3 steps later all the same
  EXPECT_FALSE(schedule->due(10));
  EXPECT_TRUE(schedule->due(11));
}

TEST(SaveScheduleTest, OnlyASavedStepSparesTheFinalSave) {
  Result<SaveSchedule> schedule = SaveSchedule::Create(Every(10));
  ASSERT_TRUE(schedule.ok());
  EXPECT_TRUE(schedule->final_save_needed(0));
  schedule->mark(4);  // attempted, not saved
  EXPECT_TRUE(schedule->final_save_needed(4));
  schedule->mark_saved(4);
  EXPECT_FALSE(schedule->final_save_needed(4));
  EXPECT_TRUE(schedule->final_save_needed(5));
}

TEST(SaveScheduleTest, AKeptStartCheckpointCountsAsSavedAndOnlyForItsStep) {
  Result<SaveSchedule> schedule = SaveSchedule::Create(Every(5));
  ASSERT_TRUE(schedule.ok());
  EXPECT_TRUE(schedule->start_save_needed(10));  // unset: every start saves, TensorFlow's rule
  schedule->set_keep_start([](int64_t step) { return step == 10; });
  EXPECT_TRUE(schedule->start_save_needed(7));
  EXPECT_FALSE(schedule->start_save_needed(10));
  // Kept as it is: the end need not save step 10 again, and the next save is 5 steps later.
  EXPECT_FALSE(schedule->final_save_needed(10));
  EXPECT_FALSE(schedule->due(14));
  EXPECT_TRUE(schedule->due(15));
}

TEST(SaveScheduleTest, OneProcessDecidesAloneUnderSaveSecs) {
  double now = 100;
  SaverOptions options = Every(1);
  options.save_steps.reset();
  options.save_secs = 10;
  options.clock = [&now] { return now; };
  std::unique_ptr<Coordinator> single = NewSingleProcessCoordinator();
  options.coordinator = single.get();
  Result<SaveSchedule> schedule = SaveSchedule::Create(options);
  ASSERT_TRUE(schedule.ok());
  EXPECT_TRUE(*schedule->due_everywhere(1));
  schedule->mark(1);
  now += 5;
  EXPECT_FALSE(*schedule->due_everywhere(2));
  now += 5;
  EXPECT_TRUE(*schedule->due_everywhere(3));
}

}  // namespace
}  // namespace asyncckpt
