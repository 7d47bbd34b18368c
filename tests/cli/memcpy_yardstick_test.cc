#include "src/cli/memcpy_yardstick.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "tests/support/heap_in_use.h"

namespace asyncckpt::cli {
namespace {

// Two host tensors, one spanning several 4 MiB pieces with a ragged end, filled with a pattern.
class MemcpyYardstickTest : public ::testing::Test {
 protected:
  void SetUp() override {
    big_.resize((9 << 20) / 4 + 3);
    small_.resize(5);
    for (size_t i = 0; i < big_.size(); ++i) big_[i] = static_cast<float>(i) * 0.5f;
    for (size_t i = 0; i < small_.size(); ++i) small_[i] = -static_cast<float>(i);
    Add("a/big", big_);
    Add("b/small", small_);
  }
  void Add(const std::string& name, std::vector<float>& values) {
    ASSERT_TRUE(registry_
                    .add(TensorRef{name,
                                   DType::kF32,
                                   {static_cast<int64_t>(values.size())},
                                   values.data(),
                                   values.size() * sizeof(float),
                                   nullptr,
                                   {},
                                   {}})
                    .ok());
  }
  std::vector<int64_t> MeasuredSteps(const MemcpyYardstickHook& hook) {
    std::vector<int64_t> steps;
    for (const auto& [step, seconds] : hook.seconds_by_step()) {
      EXPECT_GT(seconds, 0.0) << "step " << step;
      steps.push_back(step);
    }
    return steps;
  }

  static SaverOptions Schedule(std::optional<int64_t> steps, std::optional<double> secs) {
    SaverOptions options;
    options.save_steps = steps;
    options.save_secs = secs;
    return options;
  }

  std::vector<float> big_, small_;
  TensorRegistry registry_;
};

TEST_F(MemcpyYardstickTest, CopiesEveryTensorBackToBackInRegistryOrder) {
  std::vector<uint8_t> destination(registry_.total_bytes(), 0);
  EXPECT_GT(TimeStateMemcpy(registry_, destination.data()), 0.0);
  EXPECT_EQ(std::memcmp(destination.data(), big_.data(), big_.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(destination.data() + big_.size() * sizeof(float), small_.data(),
                        small_.size() * sizeof(float)),
            0);
}

TEST_F(MemcpyYardstickTest, MeasuresExactlyWhereTheSaverSavesOnItsStepSchedule) {
  auto hook = MemcpyYardstickHook::Create(&registry_, Schedule(3, std::nullopt));
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  ASSERT_TRUE((*hook)->after_create_session(0).ok());
  for (int64_t step = 1; step <= 7; ++step) {
    RunContext context(step);
    ASSERT_TRUE((*hook)->after_run(context, RunValues{}).ok());
  }
  // The saver saves at 0 (session start), 3 and 6 (every 3 steps), and 7 at the end.
  ASSERT_TRUE((*hook)->end(7).ok());
  EXPECT_EQ(MeasuredSteps(**hook), (std::vector<int64_t>{0, 3, 6, 7}));
}

TEST_F(MemcpyYardstickTest, EndAtASaveStepDoesNotMeasureTwice) {
  auto hook = MemcpyYardstickHook::Create(&registry_, Schedule(2, std::nullopt));
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  ASSERT_TRUE((*hook)->after_create_session(10).ok());  // a resumed job
  for (int64_t step = 11; step <= 12; ++step) {
    RunContext context(step);
    ASSERT_TRUE((*hook)->after_run(context, RunValues{}).ok());
  }
  const double at_12 = (*hook)->seconds_by_step().at(12);
  ASSERT_TRUE((*hook)->end(12).ok());
  EXPECT_EQ(MeasuredSteps(**hook), (std::vector<int64_t>{10, 12}));
  EXPECT_EQ((*hook)->seconds_by_step().at(12), at_12);
}

TEST_F(MemcpyYardstickTest, RejectsAScheduleTheSaverWouldReject) {
  auto both = MemcpyYardstickHook::Create(&registry_, Schedule(3, 1.0));
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.status().code(), StatusCode::kInvalidArgument);
  auto neither = MemcpyYardstickHook::Create(&registry_, Schedule(std::nullopt, std::nullopt));
  EXPECT_FALSE(neither.ok());
}

// D5 of issue 31 (train-sim's part): the yardstick kept one record per save for the whole run.
// It keeps the newest kSaverTotalsWindow, the saves the saver's totals keep, and over 5,000
// saves the heap in use (trimmed) grows by less than 16 bytes a save.
TEST(MemcpyYardstickMemoryTest, FiveThousandSavesKeepTheNewestWindowAndTheHeapFlat) {
  std::vector<float> values(16, 1.0f);
  TensorRegistry registry;
  ASSERT_TRUE(
      registry.add(TensorRef{"w", DType::kF32, {16}, values.data(), 64, nullptr, {}, {}}).ok());
  SaverOptions options;
  options.save_steps = 1;
  auto hook = MemcpyYardstickHook::Create(&registry, options);
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  ASSERT_TRUE((*hook)->after_create_session(0).ok());
  constexpr int kSaves = 5000;
  constexpr int kWarmUp = 1000;
  int64_t at_warm_up = 0;
  for (int64_t step = 1; step <= kSaves; ++step) {
    RunContext context(step);
    ASSERT_TRUE((*hook)->after_run(context, RunValues{}).ok());
    if (step == kWarmUp) at_warm_up = testing_support::TrimmedHeapInUse();
  }
  const int64_t growth = testing_support::TrimmedHeapInUse() - at_warm_up;
  EXPECT_LT(static_cast<double>(growth) / (kSaves - kWarmUp), 16.0) << growth << " bytes";
  EXPECT_EQ((*hook)->seconds_by_step().size(), kSaverTotalsWindow);
  EXPECT_EQ((*hook)->seconds_by_step().rbegin()->first, kSaves);
}

}  // namespace
}  // namespace asyncckpt::cli
