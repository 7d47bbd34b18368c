// Unit tests of the world-size rules of train-sim --shard (src/cli/shard_resume.h): input
// basenames, what a change prints, what a resume skips, the removal of the state of ranks a job
// no longer has, and what a fresh start moves aside. The jobs themselves run under mpirun in
// tests/e2e/train_sim_mpirun_test.cc.

#include "src/cli/shard_resume.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/checkpoint_dir_test.h"
#include "tests/support/files.h"

namespace asyncckpt::cli {
namespace {

TEST(ShardResumeTest, InputBasenamesFollowTheSavedWorldSize) {
  EXPECT_EQ(WorkerInputBasename(1, 0), "input.ckpt");
  EXPECT_EQ(WorkerInputBasename(4, 3), "input_worker_3.ckpt");
  // Growing from 2 to 4: ranks 2 and 3 take ranks 0 and 1's positions.
  EXPECT_EQ(InputSourceBasename(2, 0), "input_worker_0.ckpt");
  EXPECT_EQ(InputSourceBasename(2, 3), "input_worker_1.ckpt");
  // From one rank, every rank takes the single position; onto one rank, rank 0 takes worker 0's.
  EXPECT_EQ(InputSourceBasename(1, 2), "input.ckpt");
  EXPECT_EQ(InputSourceBasename(4, 0), "input_worker_0.ckpt");
}

TEST(ShardResumeTest, AWorldSizeChangeIsDescribed) {
  EXPECT_TRUE(DescribeWorldSizeChange({150, 4}, 4, true).empty());
  const std::vector<ChangeLine> grow = DescribeWorldSizeChange({150, 2}, 4, true);
  ASSERT_EQ(grow.size(), 3u);
  EXPECT_NE(grow[0].text.find("step 150 was saved by 2 rank(s); this job has 4"),
            std::string::npos);
  EXPECT_NE(grow[0].text.find("which stays as it is"), std::string::npos) << grow[0].text;
  EXPECT_NE(
      grow[2].text.find("rank 3 has no input state of its own at step 150: it takes rank 1's"),
      std::string::npos)
      << grow[2].text;
  EXPECT_FALSE(grow[2].warning);
  const std::vector<ChangeLine> shrink = DescribeWorldSizeChange({60, 4}, 2, true);
  ASSERT_EQ(shrink.size(), 2u);
  EXPECT_TRUE(shrink[1].warning);
  EXPECT_EQ(shrink[1].text.find("the input positions of rank(s) 2, 3"), 0u) << shrink[1].text;
  // A model-only restore has no input to speak of.
  EXPECT_EQ(DescribeWorldSizeChange({60, 4}, 2, false).size(), 1u);
}

using testing_support::CheckpointDirTest;
using testing_support::WriteFile;

class ShardResumeDirTest : public CheckpointDirTest {
 protected:
  bool Exists(const std::string& name) const { return std::filesystem::exists(Path(name)); }
  void MakeDir(const std::string& name) const {
    ASSERT_TRUE(std::filesystem::create_directory(Path(name))) << name;
  }
  static bool Has(const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  }
};

TEST_F(ShardResumeDirTest, AResumePastNewerModelCheckpointsNamesWhatEachLacks) {
  // One process saved model and input at 10; at 20 and 30 only the model is committed.
  for (int step : {10, 20, 30}) WriteCheckpoint(step);
  WriteState({10, 20, 30});
  WriteCheckpoint(10, 0, "input.ckpt");
  WriteState({10}, "input.ckpt", "checkpoint_input");
  auto point = NewestResumePoint(dir_, "model.ckpt", true);
  ASSERT_TRUE(point.ok()) << point.status().ToString();
  ASSERT_TRUE(point->has_value());
  EXPECT_EQ((*point)->step, 10);
  const std::vector<std::string> skipped = SkippedNewerCheckpoints(dir_, "model.ckpt", 10);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped[0], "model.ckpt-20, saved by 1 rank(s), has no committed input.ckpt-20");
  EXPECT_EQ(skipped[1], "model.ckpt-30, saved by 1 rank(s), has no committed input.ckpt-30");
  EXPECT_TRUE(SkippedNewerCheckpoints(dir_, "model.ckpt", 30).empty());
  EXPECT_EQ(WhyNoResumePoint(dir_, "model.ckpt"),
            "the newest, model.ckpt-30, saved by 1 rank(s), has no committed input.ckpt-30");
}

TEST_F(ShardResumeDirTest, WhatRanksTheJobDoesNotHaveLeftBehindIsRemoved) {
  // Worker 3 of an earlier job of 4: a save in flight, a removal cut short, a state file being
  // rewritten, and the lock of its state file. Worker 1 is in this job of 2: its are kept.
  const std::vector<std::string> gone = {"input_worker_3.ckpt-10.tmp-00112233445566ff",
                                         "input_worker_3.ckpt-5.deleting-0a0b0c0d0e0f0102",
                                         "checkpoint_input_worker_3.tmp-1234567890abcdef"};
  MakeDir(gone[0]);
  MakeDir(gone[1]);
  WriteFile(Path(gone[1] + "/index"), "left");
  WriteFile(Path(gone[2]), "half a state file");
  WriteFile(Path("checkpoint_input_worker_3.lock"), "");
  MakeDir("input_worker_1.ckpt-10.tmp-00112233445566ff");
  WriteFile(Path("checkpoint_input_worker_1.lock"), "");
  auto removed = RemoveOrphanedInputCheckpoints(*posix_, dir_, "model.ckpt", 2);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  for (const std::string& name : gone) {
    EXPECT_TRUE(Has(*removed, name)) << name;
    EXPECT_FALSE(Exists(name)) << name;
  }
  EXPECT_TRUE(Has(*removed, "checkpoint_input_worker_3.lock"));
  EXPECT_FALSE(Exists("checkpoint_input_worker_3.lock"));
  // Worker 1's temporary is its own saver's business (its start removes it), and so is its lock.
  EXPECT_TRUE(Exists("input_worker_1.ckpt-10.tmp-00112233445566ff"));
  EXPECT_TRUE(Exists("checkpoint_input_worker_1.lock"));
}

TEST_F(ShardResumeDirTest, ALockSomeoneHoldsIsLeft) {
  WriteFile(Path("checkpoint_input_worker_3.lock"), "");
  std::unique_ptr<io::FileLock> held;
  ASSERT_TRUE(posix_->lock_file(Path("checkpoint_input_worker_3.lock"), &held).ok());
  auto removed = RemoveOrphanedInputCheckpoints(*posix_, dir_, "model.ckpt", 2);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_TRUE(removed->empty());
  EXPECT_TRUE(Exists("checkpoint_input_worker_3.lock"));
}

TEST_F(ShardResumeDirTest, InputCheckpointsOfAWholeSetAreKeptForTheRanksThatSavedIt) {
  // One process saved step 10 with input.ckpt; a job of 2 has no use for input.ckpt, but the
  // set of step 10 is still a resume point: kept. Worker 0's lone checkpoint of step 20, of no
  // set, goes.
  WriteCheckpoint(10);
  WriteState({10});
  WriteCheckpoint(10, 0, "input.ckpt");
  WriteState({10}, "input.ckpt", "checkpoint_input");
  auto removed = RemoveOrphanedInputCheckpoints(*posix_, dir_, "model.ckpt", 2);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_TRUE(removed->empty());
  EXPECT_TRUE(Exists("input.ckpt-10"));
  EXPECT_TRUE(Exists("checkpoint_input"));
  // A job of one process has no use for worker 0's input of a step no model checkpoint has.
  WriteCheckpoint(20, 0, "input_worker_0.ckpt");
  WriteState({20}, "input_worker_0.ckpt", "checkpoint_input_worker_0");
  removed = RemoveOrphanedInputCheckpoints(*posix_, dir_, "model.ckpt", 1);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(*removed, std::vector<std::string>{"input_worker_0.ckpt-20"});
  EXPECT_FALSE(Exists("input_worker_0.ckpt-20"));
  EXPECT_FALSE(Exists("checkpoint_input_worker_0"));
  EXPECT_TRUE(Exists("input.ckpt-10"));
}

TEST_F(ShardResumeDirTest, AFreshStartMovesEveryCheckpointAsideWhole) {
  WriteCheckpoint(40);
  WriteState({40});
  for (int worker : {0, 1, 2}) {
    WriteCheckpoint(40, 0, "input_worker_" + std::to_string(worker) + ".ckpt");
  }
  MakeDir("unrelated-7");
  auto moved = SetAsideCheckpoints(*posix_, dir_, "model.ckpt");
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_EQ(moved->names,
            (std::vector<std::string>{"input_worker_0.ckpt-40", "input_worker_1.ckpt-40",
                                      "input_worker_2.ckpt-40", "model.ckpt-40"}));
  EXPECT_EQ(moved->subdir.rfind("set-aside-", 0), 0u) << moved->subdir;
  for (const std::string& name : moved->names) {
    EXPECT_FALSE(Exists(name)) << name;
    EXPECT_TRUE(Exists(moved->subdir + "/" + name + "/index")) << name;
  }
  EXPECT_TRUE(Exists("unrelated-7"));
  EXPECT_TRUE(Exists("checkpoint"));
  // Nothing left to move: no subdirectory either.
  auto again = SetAsideCheckpoints(*posix_, dir_, "model.ckpt");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->names.empty());
  EXPECT_TRUE(again->subdir.empty());
}

}  // namespace
}  // namespace asyncckpt::cli
