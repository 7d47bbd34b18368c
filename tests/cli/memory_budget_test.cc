#include "src/cli/memory_budget.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace asyncckpt::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kGiB = 1ull << 30;

std::vector<MemoryPart> Parts(uint64_t state, uint64_t staging, uint64_t input) {
  return {{"state", "--model_bytes 16GiB", state},
          {"pinned staging", "--staging_bytes 8GiB", staging},
          {"input buffers", "--shuffle_buffer 1024 and --prefetch 64", input}};
}

TEST(MemoryBudgetTest, TotalSaturatesInsteadOfWrapping) {
  EXPECT_EQ(TotalBytes(Parts(1, 2, 3)), 6u);
  EXPECT_EQ(TotalBytes(Parts(UINT64_MAX - 1, 5, 0)), UINT64_MAX);
  EXPECT_EQ(TotalBytes({}), 0u);
}

TEST(MemoryBudgetTest, WhatFitsIsAccepted) {
  EXPECT_TRUE(CheckMemoryFits(Parts(16 * kGiB, 4 * kGiB, kGiB), {21 * kGiB, "test"}, "").ok());
}

TEST(MemoryBudgetTest, WhatDoesNotFitNamesTheLargestPartsFlagsEveryPartAndTheSource) {
  const Status status =
      CheckMemoryFits(Parts(16 * kGiB, 8 * kGiB, kGiB), {22 * kGiB, "--max_memory 22GiB"},
                      "--staging_bytes 4GiB would make it fit");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("not enough memory for --model_bytes 16GiB"));
  EXPECT_THAT(status.message(), HasSubstr("needs 25.0 GiB (state 16.0 GiB + pinned staging 8.0 "
                                          "GiB [--staging_bytes 8GiB] + input buffers 1.0 GiB"));
  EXPECT_THAT(status.message(), HasSubstr("but --max_memory 22GiB says 22.0 GiB are available"));
  EXPECT_THAT(status.message(), HasSubstr("; --staging_bytes 4GiB would make it fit"));
  // The largest part's own flags are in the headline, not repeated beside it.
  EXPECT_THAT(status.message(), Not(HasSubstr("[--model_bytes 16GiB]")));
}

TEST(MemoryBudgetTest, PartsOfNoBytesAreLeftOut) {
  const Status status = CheckMemoryFits(
      {{"state", "--model_bytes 1TiB", 1024 * kGiB}, {"yardstick", "x", 0}}, {kGiB, "test"}, "");
  EXPECT_THAT(status.message(), Not(HasSubstr("yardstick")));
}

TEST(MemoryBudgetTest, TheMachineReportsSomeMemoryAndWhereTheFigureComesFrom) {
  const AvailableMemory available = MachineAvailableMemory();
  EXPECT_GT(available.bytes, 0u);
  EXPECT_FALSE(available.source.empty());
}

}  // namespace
}  // namespace asyncckpt::cli
