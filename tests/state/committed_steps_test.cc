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

// ---- the checkpoint a resume uses --------------------------------------------------------------

// Issue 32 item 1 and D6 of issue 31: "latest" is the step the last successful save wrote, as
// the state file records it (save order), and a damaged one is passed over, saying why.
TEST_F(CommittedStepsTest, TheResumeUsesTheStateFilesLatestInSaveOrderPassingOverDamage) {
  for (int step : {5, 6, 7}) MakeCheckpointDir(Name(step), "complete 0");
  CheckpointState state;
  state.all_model_checkpoint_paths = {Name(5), Name(7), Name(6)};  // 6 forced after 7
  state.model_checkpoint_path = Name(6);
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());
  Result<ResumeCheckpoints> resume =
      ResolveResumeCheckpoints(*posix_, dir_, kBasename, "checkpoint", ContentValidator(), 0);
  ASSERT_TRUE(resume.ok()) << resume.status().ToString();
  EXPECT_THAT(resume->steps, ElementsAre(5, 7, 6));
  EXPECT_EQ(resume->latest_path, Path(Name(6)));
  EXPECT_TRUE(resume->skipped.empty());

  MakeCheckpointDir(Name(6), "torn");  // what start-up would quarantine
  MakeCheckpointDir("model.ckpt-2.corrupt-0123456789abcdef");
  resume = ResolveResumeCheckpoints(*posix_, dir_, kBasename, "checkpoint", ContentValidator(), 0);
  ASSERT_TRUE(resume.ok()) << resume.status().ToString();
  EXPECT_THAT(resume->steps, ElementsAre(5, 7));
  EXPECT_EQ(resume->latest_path, Path(Name(7)));
  ASSERT_EQ(resume->skipped.size(), 2u);
  EXPECT_THAT(resume->skipped[0], ::testing::HasSubstr(Path(Name(6)) + ": "));
  EXPECT_THAT(resume->skipped[1], ::testing::HasSubstr("model.ckpt-2.corrupt-"));
}

// D6: after a commit whose state-file write failed (a full disk), the state file names nothing
// or an older step; the complete newer checkpoint is what a start lists again and resumes.
TEST_F(CommittedStepsTest, TheResumeFindsWhatAFailedStateFileWriteLeftUnlisted) {
  MakeCheckpointDir(Name(3), "complete 0");
  Result<ResumeCheckpoints> resume =
      ResolveResumeCheckpoints(*posix_, dir_, kBasename, "checkpoint", ContentValidator(), 5);
  ASSERT_TRUE(resume.ok()) << resume.status().ToString();
  EXPECT_EQ(resume->latest_path, Path(Name(3)));
  EXPECT_THAT(resume->state_file_problem, ::testing::HasSubstr("there is no state file"));

  CheckpointState state;
  state.all_model_checkpoint_paths = {Name(3)};
  state.model_checkpoint_path = Name(3);
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());
  MakeCheckpointDir(Name(4), "complete 0");  // committed; the state file's update failed
  resume = ResolveResumeCheckpoints(*posix_, dir_, kBasename, "checkpoint", ContentValidator(), 5);
  ASSERT_TRUE(resume.ok()) << resume.status().ToString();
  EXPECT_THAT(resume->steps, ElementsAre(3, 4));
  EXPECT_EQ(resume->latest_path, Path(Name(4)));
}

// Nothing to resume: NotFound when there was never anything, FailedPrecondition naming them
// when only damaged checkpoints are there, as a start refuses to train afresh beside them.
TEST_F(CommittedStepsTest, NothingToResumeTellsAbsenceFromDamage) {
  Result<ResumeCheckpoints> resume =
      ResolveResumeCheckpoints(*posix_, dir_, kBasename, "checkpoint", ContentValidator(), 0);
  EXPECT_EQ(resume.status().code(), StatusCode::kNotFound) << resume.status().ToString();
  resume = ResolveResumeCheckpoints(*posix_, "", kBasename, "checkpoint", ContentValidator(), 0);
  EXPECT_EQ(resume.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(resume.status().message(), ::testing::HasSubstr("checkpoint directory '' does"));

  MakeCheckpointDir(Name(8), "torn");
  WriteText("checkpoint", "model_checkpoint_path: \"" + Name(8) + "\"\n");
  resume = ResolveResumeCheckpoints(*posix_, dir_, kBasename, "checkpoint", ContentValidator(), 0);
  EXPECT_EQ(resume.status().code(), StatusCode::kFailedPrecondition) << resume.status().ToString();
  EXPECT_THAT(resume.status().message(), ::testing::HasSubstr(Path(Name(8)) + ": "));
}

TEST_F(CommittedStepsTest, QuarantinedCheckpointsOfEveryBasenameAreListedWithTheirBytes) {
  MakeCheckpointDir("model.ckpt-3.corrupt-0123456789abcdef", std::string(100, 'x'));
  MakeCheckpointDir("input.ckpt-3.corrupt-00ff", "12345");
  MakeCheckpointDir(Name(3), "complete 0");
  MakeCheckpointDir("model.ckpt-4.tmp-0123456789abcdef");
  WriteText("model.ckpt-5.corrupt-00ff", "a file, not a checkpoint");
  MakeCheckpointDir("model.ckpt-x.corrupt-00ff");
  Result<std::vector<QuarantinedCheckpoint>> found = ListQuarantinedCheckpoints(*posix_, dir_);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_EQ(found->size(), 2u);
  EXPECT_EQ((*found)[0].name, "input.ckpt-3.corrupt-00ff");
  EXPECT_EQ((*found)[0].bytes, 5u);
  EXPECT_EQ((*found)[1].name, "model.ckpt-3.corrupt-0123456789abcdef");
  EXPECT_EQ((*found)[1].bytes, 100u);
}

}  // namespace
}  // namespace asyncckpt
