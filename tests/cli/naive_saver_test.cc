#include "src/cli/naive_saver.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace asyncckpt::cli {
namespace {

namespace fs = std::filesystem;

// Records what a listener hears.
class Recorder final : public CheckpointSaverListener {
 public:
  void before_save(int64_t step) override { before.push_back(step); }
  bool after_save(int64_t step, const SaveStats& stats) override {
    after.push_back(step);
    EXPECT_TRUE(stats.status.ok()) << stats.status.ToString();
    return true;  // ignored by the naive saver
  }
  std::vector<int64_t> before, after;
};

class NaiveSaverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() /
        ("naive_saver_test-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    a_ = {1.5f, -2.0f, 3.25f};
    b_.assign(1000, 7.0f);
    Add("a", a_);
    Add("b", b_);
  }
  void TearDown() override { fs::remove_all(dir_); }
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
  SaverOptions Options(int64_t every, int max_to_keep) const {
    SaverOptions options;
    options.checkpoint_dir = dir_.string();
    options.save_steps = every;
    options.max_to_keep = max_to_keep;
    return options;
  }
  static std::vector<float> ReadFloats(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<float> values(bytes.size() / sizeof(float));
    std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
    return values;
  }
  std::vector<std::string> Saved() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
  std::vector<float> a_, b_;
  TensorRegistry registry_;
};

TEST_F(NaiveSaverTest, WritesOneFilePerTensorWithItsBytesInRegistryOrder) {
  auto hook = NaiveSaverHook::Create(Options(10, 0), &registry_);
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  ASSERT_TRUE((*hook)->after_create_session(0).ok());
  const fs::path saved = (*hook)->DirectoryOf(0);
  EXPECT_EQ(saved, dir_ / "naive-0");
  EXPECT_EQ(ReadFloats(saved / "00000000.bin"), a_);
  EXPECT_EQ(ReadFloats(saved / "00000001.bin"), b_);
  const SaverTotals& totals = (*hook)->totals();
  EXPECT_EQ(totals.saves_committed, 1);
  EXPECT_EQ(totals.bytes_raw, registry_.total_bytes());
  ASSERT_EQ(totals.saves.size(), 1u);
  // The whole save happens on the training thread.
  EXPECT_EQ(totals.saves[0].blocked_seconds, totals.saves[0].seconds_to_durable);
}

TEST_F(NaiveSaverTest, SavesOnScheduleAtTheEndOnceAndKeepsTheNewest) {
  Recorder recorder;
  auto hook = NaiveSaverHook::Create(Options(3, 2), &registry_, {&recorder});
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  ASSERT_TRUE((*hook)->after_create_session(0).ok());
  for (int64_t step = 1; step <= 7; ++step) {
    a_[0] = static_cast<float>(step);
    RunContext context(step);
    ASSERT_TRUE((*hook)->after_run(context, RunValues{}).ok());
  }
  ASSERT_TRUE((*hook)->end(7).ok());
  EXPECT_EQ(recorder.before, (std::vector<int64_t>{0, 3, 6, 7}));
  EXPECT_EQ(recorder.after, recorder.before);
  EXPECT_EQ(Saved(), (std::vector<std::string>{"naive-6", "naive-7"}));
  EXPECT_EQ(ReadFloats(dir_ / "naive-6" / "00000000.bin")[0], 6.0f);
  EXPECT_EQ((*hook)->totals().saves_committed, 4);
}

TEST_F(NaiveSaverTest, KeepPeriodKeepsTheMultiplesAsTheRealSaversDo) {
  SaverOptions options = Options(1, 2);
  options.keep_period = 4;
  auto hook = NaiveSaverHook::Create(options, &registry_);
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  ASSERT_TRUE((*hook)->after_create_session(1).ok());
  for (int64_t step = 2; step <= 8; ++step) {
    RunContext context(step);
    ASSERT_TRUE((*hook)->after_run(context, RunValues{}).ok());
  }
  EXPECT_EQ(Saved(), (std::vector<std::string>{"naive-4", "naive-7", "naive-8"}));
}

TEST_F(NaiveSaverTest, AFailedWriteFailsTheSessionAndCountsAsFailed) {
  // A regular file where the checkpoint directory should be: nothing can be created under it.
  fs::create_directories(dir_.parent_path());
  std::ofstream(dir_).put('x');
  auto hook = NaiveSaverHook::Create(Options(1, 0), &registry_);
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  Status status = (*hook)->after_create_session(0);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ((*hook)->totals().saves_failed, 1);
  EXPECT_EQ((*hook)->totals().saves_committed, 0);
  fs::remove(dir_);
}

TEST_F(NaiveSaverTest, RejectsAnInvalidSchedule) {
  SaverOptions options = Options(1, 0);
  options.save_secs = 1.0;  // both
  EXPECT_EQ(NaiveSaverHook::Create(options, &registry_).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace asyncckpt::cli
