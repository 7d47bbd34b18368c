// Unit tests of the start-up comparison of train-sim --shard (src/cli/shard_startup.h): what
// differs is named with each rank's value, every flag is either compared or known to be a
// rank's own business, and the dataset is described by what ranks must share. The MPMD jobs
// that differ in each option run in tests/e2e/train_sim_mpirun_test.cc.

#include "src/cli/shard_startup.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "asyncckpt/input_pipeline.h"
#include "src/cli/train_sim_flags.h"

namespace asyncckpt::cli {
namespace {

TEST(ShardStartupTest, DisagreementNamesTheOptionAndEachRanksValue) {
  using Options = std::vector<std::pair<std::string, std::string>>;
  const Options lead = {{"--steps", "10"}, {"--seed", "42"}};
  const Options other = {{"--steps", "12"}, {"--seed", "42"}};
  EXPECT_EQ(DescribeDisagreement({lead, lead, lead}), "");
  EXPECT_EQ(DescribeDisagreement({lead, lead, other, other}),
            "--steps differs across ranks: rank 0 has 10, rank 2 has 12, rank 3 has 12");
}

TEST(ShardStartupTest, EveryFlagIsComparedOrARanksOwn) {
  // A new flag must be placed: compared, or listed with why it need not be.
  std::set<std::string> compared;
  for (const auto& [flag, value] : SharedOptions(TrainSimConfig{})) compared.insert(flag.substr(2));
  compared.insert("dataset");  // AgreeOnDataset, once the path is resolved and the file opened
  std::set<std::string> local;
  for (const auto& [flag, why] : RankLocalFlags()) {
    EXPECT_FALSE(why.empty()) << flag;
    EXPECT_TRUE(local.insert(flag).second) << flag << " listed twice";
    EXPECT_FALSE(compared.contains(flag)) << flag << " is compared and listed as local";
  }
  for (const FlagSpec& spec : TrainSimFlags()) {
    EXPECT_TRUE(compared.contains(spec.name) || local.contains(spec.name))
        << "--" << spec.name << " is neither compared at start-up nor listed in RankLocalFlags";
  }
  // The options the issue found uncompared, which shape the state or the job's course.
  for (const char* flag : {"shuffle_buffer", "epochs", "num_data_files", "batch_size", "prefetch",
                           "on_error", "keep_checkpoint_every_n_hours"}) {
    EXPECT_TRUE(compared.contains(flag)) << flag;
  }
}

TEST(ShardStartupTest, ADatasetIsDescribedByItsPathSizeAndFirstBytes) {
  const std::string dir = ::testing::TempDir() + "/shard_startup_dataset";
  std::filesystem::create_directories(dir);
  const std::string a = dir + "/a.bin", b = dir + "/b.bin";
  ASSERT_TRUE(WriteRecordDataset(a, 100, 32, 1).ok());
  ASSERT_TRUE(WriteRecordDataset(b, 100, 32, 2).ok());
  auto first = DescribeDataset(a);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->rfind(a + " (", 0), 0u) << *first;
  EXPECT_NE(first->find(std::to_string(std::filesystem::file_size(a)) + " bytes"),
            std::string::npos)
      << *first;
  // Same path and size, other records: the digest tells them apart.
  std::filesystem::copy_file(b, a, std::filesystem::copy_options::overwrite_existing);
  auto second = DescribeDataset(a);
  ASSERT_TRUE(second.ok());
  EXPECT_NE(*first, *second);
  auto missing = DescribeDataset(dir + "/none.bin");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("none.bin"), std::string::npos)
      << missing.status().ToString();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace asyncckpt::cli
