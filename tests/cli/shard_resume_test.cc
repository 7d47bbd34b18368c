// Unit tests of the world-size rules of train-sim --shard (src/cli/shard_resume.h) and of the
// start-up comparison of the options every rank must share (src/cli/shard_startup.h); the jobs
// themselves run under mpirun in tests/e2e/train_sim_mpirun_test.cc.

#include "src/cli/shard_resume.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "src/cli/shard_startup.h"

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
  const std::vector<std::string> grow = DescribeWorldSizeChange({150, 2}, 4, true);
  ASSERT_EQ(grow.size(), 3u);
  EXPECT_NE(grow[0].find("step 150 was saved by 2 rank(s); this job has 4"), std::string::npos);
  EXPECT_NE(grow[2].find("rank 3 has no input state of its own at step 150: it takes rank 1's"),
            std::string::npos)
      << grow[2];
  const std::vector<std::string> shrink = DescribeWorldSizeChange({60, 4}, 2, true);
  ASSERT_EQ(shrink.size(), 2u);
  EXPECT_NE(shrink[1].find("WARNING: the input positions of rank(s) 2, 3"), std::string::npos)
      << shrink[1];
  // A model-only restore has no input to speak of.
  EXPECT_EQ(DescribeWorldSizeChange({60, 4}, 2, false).size(), 1u);
}

TEST(ShardStartupTest, DisagreementNamesTheOptionAndEachRanksValue) {
  using Options = std::vector<std::pair<std::string, std::string>>;
  const Options lead = {{"--steps", "10"}, {"--seed", "42"}};
  const Options other = {{"--steps", "12"}, {"--seed", "42"}};
  EXPECT_EQ(DescribeDisagreement({lead, lead, lead}), "");
  EXPECT_EQ(DescribeDisagreement({lead, lead, other, other}),
            "--steps differs across ranks: rank 0 has 10, rank 2 has 12, rank 3 has 12");
}

}  // namespace
}  // namespace asyncckpt::cli
