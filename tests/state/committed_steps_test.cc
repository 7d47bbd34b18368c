// Tests of src/state/committed_steps.cc: the committed steps a reader may trust, from the state
// file or a scan (ListCommittedSteps with an injected validator, and CommittedCheckpointSteps on
// real checkpoints written by the format's writer).

#include "src/state/committed_steps.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"
#include "src/format/format.h"
#include "tests/state/checkpoint_state_fixture.h"
#include "tests/support/checkpoint_dir_test.h"

namespace asyncckpt {
namespace {

using namespace state_testing;  // NOLINT(build/namespaces): the shared fixture
using ::testing::ElementsAre;

// The shared fixture, named after the unit these tests cover.
class CommittedStepsTest : public StateDirTest {};

TEST_F(CommittedStepsTest, CommittedStepsComeFromAHealthyStateFile) {
  for (int step : {1, 2, 3}) MakeCheckpointDir(Name(step), "complete 0");
  CheckpointState state;
  state.all_model_checkpoint_paths = {Name(2), Name(3)};
  state.model_checkpoint_path = Name(3);
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());
  Result<std::vector<int64_t>> steps =
      ListCommittedSteps(*posix_, dir_, kBasename, "checkpoint", ContentValidator());
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  EXPECT_THAT(*steps, ElementsAre(2, 3));
}

TEST_F(CommittedStepsTest, CommittedStepsFallBackToTheDirectoryWhenTheStateFileIsBroken) {
  for (int step : {1, 2, 3}) MakeCheckpointDir(Name(step), "complete 0");
  MakeCheckpointDir(Name(4), "torn");
  for (const std::string& text : {std::string(), std::string("garbage\n"),
                                  "model_checkpoint_path: \"" + Name(4) + "\"\n",     // incomplete
                                  "model_checkpoint_path: \"" + Name(9) + "\"\n"}) {  // missing
    SCOPED_TRACE(text);
    WriteText("checkpoint", text);
    Result<std::vector<int64_t>> steps =
        ListCommittedSteps(*posix_, dir_, kBasename, "checkpoint", ContentValidator());
    ASSERT_TRUE(steps.ok()) << steps.status().ToString();
    EXPECT_THAT(*steps, ElementsAre(1, 2, 3));
  }
  fs::remove(Path("checkpoint"));
  EXPECT_THAT(
      ListCommittedSteps(*posix_, dir_, kBasename, "checkpoint", ContentValidator()).value(),
      ElementsAre(1, 2, 3));
  EXPECT_TRUE(
      ListCommittedSteps(*posix_, dir_ + "/none", kBasename, "checkpoint", {}).value().empty());
}

// ---- over the savers' validator ----------------------------------------------------------------

class CommittedCheckpointStepsTest : public testing_support::CheckpointDirTest {};

TEST_F(CommittedCheckpointStepsTest, ValidateWhatTheStateFileNames) {
  for (int step = 1; step <= 3; ++step) WriteCheckpoint(step);
  WriteState({2, 3});
  EXPECT_THAT(CommittedCheckpointSteps(dir_, kBasename).value(), ElementsAre(2, 3));
  fs::resize_file(Path(Name(3) + "/" + format::DataFileName(0, 2)), 1);  // 3 goes bad
  EXPECT_THAT(CommittedCheckpointSteps(dir_, kBasename).value(), ElementsAre(1, 2));
  EXPECT_TRUE(CommittedCheckpointSteps(dir_ + "/missing", kBasename).value().empty());
}

}  // namespace
}  // namespace asyncckpt
