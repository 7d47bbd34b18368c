// Tests of train-sim's flag checks (src/cli/train_sim_flags.h): defaults, ranges, messages that
// quote the value as given, --shard's extra rules, and the state layout the flags imply.

#include "src/cli/train_sim_flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace asyncckpt::cli {
namespace {

using ::testing::HasSubstr;

// ConfigFromFlags over a command line of train-sim's flags.
Result<TrainSimConfig> Config(std::vector<std::string> args, const ShardContext* shard = nullptr) {
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  auto flags = ParseFlags(TrainSimFlags(), static_cast<int>(argv.size()), argv.data());
  if (!flags.ok()) return flags.status();
  return ConfigFromFlags(*flags, shard);
}

TEST(TrainSimFlagsTest, DefaultsSaveEvery50StepsWithTheAsyncSaverIntoATemporaryDirectory) {
  auto config = Config({});
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->steps, 200);
  EXPECT_EQ(config->saver_kind, "async");
  ASSERT_TRUE(config->saver.save_steps.has_value());
  EXPECT_EQ(*config->saver.save_steps, 50);
  EXPECT_FALSE(config->saver.save_secs.has_value());
  EXPECT_EQ(config->saver.chunk_bytes, 4u << 20);
  EXPECT_EQ(config->saver.queue_depth, 64u);
  EXPECT_FALSE(config->dir_was_given);
  EXPECT_TRUE(config->saver.checkpoint_dir.empty());
  EXPECT_TRUE(config->memcpy_yardstick);
}

TEST(TrainSimFlagsTest, SaveSecsAloneTurnsOffTheDefaultStepSchedule) {
  auto config = Config({"--save_secs", "2.5"});
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_FALSE(config->saver.save_steps.has_value());
  EXPECT_DOUBLE_EQ(*config->saver.save_secs, 2.5);
}

TEST(TrainSimFlagsTest, AnOutOfRangeValueIsQuotedAsGiven) {
  auto config = Config({"--queue_depth", "0x10"});
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  config = Config({"--queue_depth", "4097"});
  EXPECT_EQ(config.status().message(), "--queue_depth must be in [1, 4096], got '4097'");
}

TEST(TrainSimFlagsTest, DeviceCudaTurnsTheYardstickIntoTheModelsAndStreamOrderedNeedsIt) {
  auto config = Config({"--device", "cuda", "--saver", "async", "--stream_ordered"});
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_TRUE(config->cuda);
  EXPECT_FALSE(config->memcpy_yardstick) << "the state is not in host memory";
  EXPECT_TRUE(config->saver.cuda_stream_ordered);
  EXPECT_TRUE(config->saver.cuda_defer_compute_wait) << "the model waits before its update";
  EXPECT_THAT(Config({"--stream_ordered"}).status().message(),
              HasSubstr("--stream_ordered needs --device cuda and --saver async"));
  EXPECT_THAT(
      Config({"--device", "cuda", "--saver", "sync", "--stream_ordered"}).status().message(),
      HasSubstr("--stream_ordered needs"));
  EXPECT_EQ(Config({"--device", "tpu"}).status().message(),
            "--device must be host or cuda, got 'tpu'");
  EXPECT_FALSE(Config({})->cuda);
}

TEST(TrainSimFlagsTest, ChunksSmallerThanAPageAreRefusedWithTheReason) {
  auto config = Config({"--chunk_bytes", "1KiB"});
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("--chunk_bytes must be at least 4KiB, got "
                                                   "'1KiB': every chunk takes at least one"));
}

TEST(TrainSimFlagsTest, StagingSmallerThanTheLargestChunkNamesTheChunkSize) {
  auto config = Config({"--staging_bytes", "64KiB", "--chunk_bytes", "1MiB"});
  EXPECT_THAT(config.status().message(), HasSubstr("here 1048576 bytes (--chunk_bytes 1MiB)"));
  EXPECT_TRUE(Config({"--staging_bytes", "1MiB", "--chunk_bytes", "1MiB"}).ok());
}

TEST(TrainSimFlagsTest, PreemptionStepsAreParsedAndABadOneIsNamed) {
  auto config = Config({"--preempt_at_steps", "81,37,81"});
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->preempt_at_steps, (std::set<int64_t>{37, 81}));
  config = Config({"--preempt_at_steps", "3,,4"});
  EXPECT_EQ(config.status().message(),
            "--preempt_at_steps takes steps >= 1 separated by commas; '' in '3,,4' is not one");
}

TEST(TrainSimFlagsTest, SaverNoneTurnsOffTheYardstick) {
  auto config = Config({"--saver", "none"});
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_FALSE(config->memcpy_yardstick);
}

TEST(TrainSimFlagsTest, ShardNeedsACheckpointDirAndRefusesTheNaiveSaver) {
  const ShardContext shard{1, 4};
  EXPECT_THAT(Config({}, &shard).status().message(), HasSubstr("--shard needs --checkpoint_dir"));
  EXPECT_THAT(Config({"--checkpoint_dir", "/tmp/x", "--saver", "naive"}, &shard).status().message(),
              HasSubstr("--saver naive has no multi-process form"));
  auto config = Config({"--checkpoint_dir", "/tmp/x", "--coordination_timeout_secs", "7"}, &shard);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_TRUE(config->model.shard);
  EXPECT_EQ(config->model.rank, 1);
  EXPECT_EQ(config->model.world_size, 4);
  EXPECT_DOUBLE_EQ(config->coordination_timeout_secs, 7);
  // Rank 1's retention pairs with its own input checkpoints, not worker 0's.
  EXPECT_NE(config->saver.paired_input_basename, InputCheckpointBasename(InputPipelineOptions{}));
}

TEST(TrainSimFlagsTest, LayoutPadsEachChunkToWholePages) {
  SimConfig model;
  model.state_bytes = 3 * 10000 * 4;  // adam: 3 arrays of 10000 f32 per tensor
  model.num_tensors = 1;
  const StateLayout layout = LayoutOf(model, 4096);
  EXPECT_EQ(layout.tensors, 3u);
  EXPECT_EQ(layout.tensor_bytes, 40000u);
  // 9 full chunks of 4096 bytes and a tail of 3136 bytes, each on its own page.
  EXPECT_EQ(layout.snapshot(), 3u * 10 * 4096);
  EXPECT_EQ(layout.largest_chunk(), 4096u);
}

TEST(TrainSimFlagsTest, TinyPositiveSaveSecsIsAcceptedAndOnlyNonPositiveOrInfiniteRefused) {
  auto config = Config({"--save_secs", "1e-300"});
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_DOUBLE_EQ(*config->saver.save_secs, 1e-300);
  for (const char* bad : {"0", "-1", "inf", "nan", "1e400"}) {
    SCOPED_TRACE(bad);
    config = Config({"--save_secs", bad});
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << config.status().ToString();
  }
}

TEST(TrainSimFlagsTest, PreemptAtStepsMustBeNonEmptyNumericAndReachable) {
  auto config = Config({"--steps", "100", "--preempt_at_steps", "10,100"});
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  config = Config({"--steps", "100", "--preempt_at_steps", ""});
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("--preempt_at_steps"));
  EXPECT_THAT(config.status().message(), HasSubstr("empty"));
  config = Config({"--steps", "100", "--preempt_at_steps", "abc"});
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  config = Config({"--steps", "100", "--preempt_at_steps", "99999"});
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("99999"));
  EXPECT_THAT(config.status().message(), HasSubstr("never reached"));
}

TEST(TrainSimFlagsTest, KeepPeriodReachesTheSaverAndANegativeOneIsRefused) {
  auto config = Config({"--keep_period", "4"});
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->saver.keep_period, 4);
  EXPECT_EQ(Config({})->saver.keep_period, 0);
  auto negative = Config({"--keep_period", "-1"});
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(negative.status().message(), HasSubstr("keep_period"));
}

TEST(TrainSimFlagsTest, AllowFreshStartReachesTheSaver) {
  auto config = Config({"--allow_fresh_start"});
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_TRUE(config->saver.allow_fresh_start);
  EXPECT_FALSE(Config({})->saver.allow_fresh_start);
}

}  // namespace
}  // namespace asyncckpt::cli
