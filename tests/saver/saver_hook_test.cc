#include "asyncckpt/saver_hook.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "asyncckpt/reader.h"
#include "asyncckpt/session.h"
#include "asyncckpt/state.h"
#include "asyncckpt/xtensor.h"
#include "io/fault_injection_file_system.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;

// Records every listener call as text, in order.
class RecordingListener : public CheckpointSaverListener {
 public:
  void begin() override { calls.push_back("begin"); }
  void before_save(int64_t step) override {
    calls.push_back("before_save " + std::to_string(step));
  }
  bool after_save(int64_t step, const SaveStats& stats) override {
    calls.push_back("after_save " + std::to_string(step) + (stats.status.ok() ? "" : " failed"));
    stats_seen.push_back(stats);
    return step == stop_after_step;
  }
  void end(int64_t step) override { calls.push_back("end " + std::to_string(step)); }

  std::vector<std::string> calls;
  std::vector<SaveStats> stats_seen;
  int64_t stop_after_step = -1;
};

class CheckpointSaverHookTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/saver_hook_test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    weights_.resize(12000);
    bias_.resize(7);
    ASSERT_TRUE(registry_
                    .add({"dense/weights",
                          DType::kF32,
                          {30, 400},
                          weights_.data(),
                          weights_.size() * sizeof(float),
                          nullptr,
                          {},
                          {}})
                    .ok());
    ASSERT_TRUE(registry_
                    .add({"dense/bias",
                          DType::kI64,
                          {7},
                          bias_.data(),
                          bias_.size() * sizeof(int64_t),
                          nullptr,
                          {},
                          {}})
                    .ok());
  }
  void TearDown() override { fs::remove_all(dir_); }

  SaverOptions Options(int64_t save_steps) {
    SaverOptions options;
    options.checkpoint_dir = dir_;
    options.save_steps = save_steps;
    options.chunk_bytes = 4096;  // 12 chunks of weights (48000 bytes), one of bias
    return options;
  }

  // Runs `steps` steps; every step changes every element, as a real optimizer would.
  Status Train(SessionRunHook* hook, int64_t steps) {
    auto session = SingularMonitoredSession::Create({hook});
    if (!session.ok()) return session.status();
    return (*session)->run_until(steps, [&](StepContext& ctx) {
      for (size_t i = 0; i < weights_.size(); ++i) weights_[i] = float(ctx.step() * 1000 + i);
      for (size_t i = 0; i < bias_.size(); ++i) bias_[i] = ctx.step() * 10 + int64_t(i);
      return Status::OK();
    });
  }

  std::vector<std::string> CheckpointDirs() {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      if (entry.is_directory()) names.push_back(entry.path().filename());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string dir_;
  std::vector<float> weights_;
  std::vector<int64_t> bias_;
  TensorRegistry registry_;
};

TEST_F(CheckpointSaverHookTest, SavesAtStartEveryNStepsAndAtEndWhenLastStepUnsaved) {
  RecordingListener listener;
  SaverOptions options = Options(5);
  options.max_to_keep = 0;
  auto hook = CheckpointSaverHook::Create(options, &registry_, {&listener});
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  ASSERT_TRUE(Train(hook->get(), 12).ok());
  EXPECT_EQ(listener.calls,
            (std::vector<std::string>{"begin", "before_save 0", "after_save 0", "before_save 5",
                                      "after_save 5", "before_save 10", "after_save 10",
                                      "before_save 12", "after_save 12", "end 12"}));
  EXPECT_EQ(CheckpointDirs(), (std::vector<std::string>{"model.ckpt-0", "model.ckpt-10",
                                                        "model.ckpt-12", "model.ckpt-5"}));
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, dir_ + "/model.ckpt-12");
}

TEST_F(CheckpointSaverHookTest, AKeptStartCheckpointIsNeitherReplacedNorSavedAgainAtEnd) {
  // Step 0 stands for a checkpoint another number of processes saved: kept as it is.
  auto sync = CheckpointSaverHook::Create(Options(5), &registry_);
  ASSERT_TRUE(sync.ok()) << sync.status().ToString();
  (*sync)->set_keep_start_checkpoint([](int64_t step) { return step == 0; });
  ASSERT_TRUE(Train(sync->get(), 5).ok());
  EXPECT_EQ(CheckpointDirs(), std::vector<std::string>{"model.ckpt-5"});
  fs::remove_all(dir_ + "/model.ckpt-5");
  fs::remove(dir_ + "/checkpoint");
  RecordingListener listener;
  auto async = AsyncCheckpointSaverHook::Create(Options(5), &registry_, {&listener});
  ASSERT_TRUE(async.ok()) << async.status().ToString();
  (*async)->set_keep_start_checkpoint([](int64_t step) { return step == 0; });
  ASSERT_TRUE(Train(async->get(), 3).ok());
  // No save at the start; the end saves step 3, which is not saved.
  EXPECT_EQ(listener.calls,
            (std::vector<std::string>{"begin", "before_save 3", "after_save 3", "end 3"}));
}

TEST_F(CheckpointSaverHookTest, BothHooksRefuseANegativeStep) {
  {
    auto hook = CheckpointSaverHook::Create(Options(5), &registry_);
    ASSERT_TRUE(hook.ok()) << hook.status().ToString();
    ASSERT_TRUE((*hook)->begin().ok());
    EXPECT_EQ((*hook)->after_create_session(-1).code(), StatusCode::kInvalidArgument);
  }
  auto async = AsyncCheckpointSaverHook::Create(Options(5), &registry_);
  ASSERT_TRUE(async.ok()) << async.status().ToString();
  ASSERT_TRUE((*async)->begin().ok());
  EXPECT_EQ((*async)->after_create_session(-3).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckpointDirs(), std::vector<std::string>{});
}

TEST_F(CheckpointSaverHookTest, DoesNotSaveTwiceAtEndWhenLastStepWasSaved) {
  RecordingListener listener;
  auto hook = CheckpointSaverHook::Create(Options(5), &registry_, {&listener});
  ASSERT_TRUE(hook.ok());
  ASSERT_TRUE(Train(hook->get(), 10).ok());
  EXPECT_EQ(listener.calls.back(), "end 10");
  EXPECT_EQ(listener.calls[listener.calls.size() - 2], "after_save 10");
  EXPECT_EQ((*hook)->totals().saves_committed, 3);
}

TEST_F(CheckpointSaverHookTest, SavedStateEqualsStateAtThatStepBitForBit) {
  auto hook = CheckpointSaverHook::Create(Options(4), &registry_);
  ASSERT_TRUE(hook.ok());
  ASSERT_TRUE(Train(hook->get(), 8).ok());
  auto reader = CheckpointReader::Open(dir_ + "/model.ckpt-4");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->metadata().step, 4);
  auto weights = ReadXarray<float>(**reader, "dense/weights");
  ASSERT_TRUE(weights.ok());
  ASSERT_EQ(weights->size(), 12000u);
  for (size_t i = 0; i < 12000; ++i) ASSERT_EQ((*weights).data()[i], float(4000 + i));
  EXPECT_EQ((*weights).shape()[0], 30u);
  EXPECT_TRUE((*reader)->verify().problems.empty());
}

TEST_F(CheckpointSaverHookTest, WritesByteForByteWhatTheAsynchronousHookWrites) {
  // Large chunks (written alone) and small ones (packed) beside each other.
  std::vector<float> large(100000);
  ASSERT_TRUE(registry_
                  .add({"dense/large",
                        DType::kF32,
                        {100000},
                        large.data(),
                        large.size() * sizeof(float),
                        nullptr,
                        {},
                        {}})
                  .ok());
  auto write_with = [&](bool asynchronous, const std::string& dir) {
    SaverOptions options = Options(3);
    options.checkpoint_dir = dir;
    options.chunk_bytes = 256 << 10;
    options.num_data_files = 3;
    options.compression.kind = CompressionKind::kNone;  // no level that load could lower
    std::iota(large.begin(), large.end(), 0.5f);
    if (asynchronous) {
      auto hook = AsyncCheckpointSaverHook::Create(options, &registry_);
      ASSERT_TRUE(hook.ok());
      ASSERT_TRUE(Train(hook->get(), 3).ok());
    } else {
      auto hook = CheckpointSaverHook::Create(options, &registry_);
      ASSERT_TRUE(hook.ok());
      ASSERT_TRUE(Train(hook->get(), 3).ok());
    }
  };
  write_with(false, dir_ + "/sync");
  write_with(true, dir_ + "/async");
  const std::string sync_ckpt = dir_ + "/sync/model.ckpt-3";
  const std::string async_ckpt = dir_ + "/async/model.ckpt-3";
  for (uint32_t i = 0; i < 3; ++i) {
    const std::string name = "/data-0000" + std::to_string(i) + "-of-00003";
    SCOPED_TRACE(name);
    std::ifstream a(sync_ckpt + name, std::ios::binary);
    std::ifstream b(async_ckpt + name, std::ios::binary);
    const std::string sync_bytes{std::istreambuf_iterator<char>(a), {}};
    const std::string async_bytes{std::istreambuf_iterator<char>(b), {}};
    EXPECT_FALSE(sync_bytes.empty());
    EXPECT_TRUE(sync_bytes == async_bytes);
  }
  // The indexes differ only in the metadata's timestamp, which is as long in both.
  EXPECT_EQ(fs::file_size(sync_ckpt + "/index"), fs::file_size(async_ckpt + "/index"));
}

// The synchronous hook's caller waits for the whole save anyway: a state larger than
// kSynchronousStagingBytes streams through that window instead of a second copy of the state,
// and restores bit for bit. The asynchronous hook, beside it, stages the whole snapshot.
TEST_F(CheckpointSaverHookTest, AStateLargerThanTheWindowStreamsThroughBoundedStaging) {
  const uint64_t state_bytes = kSynchronousStagingBytes + (16ull << 20);
  std::vector<float> big(state_bytes / sizeof(float));
  ASSERT_TRUE(registry_
                  .add({"dense/big",
                        DType::kF32,
                        {static_cast<int64_t>(big.size())},
                        big.data(),
                        big.size() * sizeof(float),
                        nullptr,
                        {},
                        {}})
                  .ok());
  std::iota(big.begin(), big.end(), 0.25f);
  SaverOptions options = Options(100);
  options.chunk_bytes = 1 << 20;
  options.compression.kind = CompressionKind::kNone;
  auto sync = CheckpointSaverHook::Create(options, &registry_);
  ASSERT_TRUE(sync.ok());
  ASSERT_TRUE((*sync)->begin().ok());
  ASSERT_TRUE((*sync)->after_create_session(7).ok());
  ASSERT_TRUE((*sync)->end(7).ok());
  const SaverTotals totals = (*sync)->totals();
  EXPECT_EQ(totals.saves_committed, 1);
  EXPECT_GT(totals.staging_high_water_bytes, 0u);
  EXPECT_LE(totals.staging_high_water_bytes, kSynchronousStagingBytes);

  auto reader = CheckpointReader::Open(dir_ + "/model.ckpt-7");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<float> restored(big.size());
  ASSERT_TRUE((*reader)->read("dense/big", restored.data(), state_bytes).ok());
  EXPECT_TRUE(restored == big);

  options.checkpoint_dir = dir_ + "/async";
  auto async = AsyncCheckpointSaverHook::Create(options, &registry_);
  ASSERT_TRUE(async.ok());
  ASSERT_TRUE((*async)->begin().ok());
  ASSERT_TRUE((*async)->after_create_session(7).ok());
  ASSERT_TRUE((*async)->end(7).ok());
  EXPECT_GE((*async)->totals().staging_high_water_bytes, state_bytes);
}

TEST_F(CheckpointSaverHookTest, ListenerAskingToStopEndsTheLoop) {
  RecordingListener listener;
  listener.stop_after_step = 3;
  auto hook = CheckpointSaverHook::Create(Options(3), &registry_, {&listener});
  ASSERT_TRUE(hook.ok());
  auto session = SingularMonitoredSession::Create({hook->get()});
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE((*session)->run_until(100, [](StepContext&) { return Status::OK(); }).ok());
  EXPECT_EQ((*session)->global_step(), 3);
  EXPECT_EQ(listener.calls.back(), "end 3");
}

TEST_F(CheckpointSaverHookTest, RetentionKeepsTheNewestMaxToKeep) {
  SaverOptions options = Options(1);
  options.max_to_keep = 2;
  auto hook = CheckpointSaverHook::Create(options, &registry_);
  ASSERT_TRUE(hook.ok());
  ASSERT_TRUE(Train(hook->get(), 6).ok());
  EXPECT_EQ(CheckpointDirs(), (std::vector<std::string>{"model.ckpt-5", "model.ckpt-6"}));
  auto state = GetCheckpointState(dir_);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->all_model_checkpoint_paths,
            (std::vector<std::string>{"model.ckpt-5", "model.ckpt-6"}));
}

TEST_F(CheckpointSaverHookTest, FailedSaveFailsTheSessionAndKeepsEarlierCheckpoints) {
  auto posix = io::NewPosixFileSystem();
  auto faulty = std::make_unique<io::FaultInjectionFileSystem>(posix.get());
  RecordingListener listener;
  SaverOptions options = Options(2);
  options.file_system = faulty.get();
  auto hook = CheckpointSaverHook::Create(options, &registry_, {&listener});
  ASSERT_TRUE(hook.ok());
  auto session = SingularMonitoredSession::Create({hook->get()});
  ASSERT_TRUE(session.ok());
  ASSERT_NE(faulty, nullptr);
  faulty->fail_ops_matching("model.ckpt-2.tmp", ENOSPC);
  Status status = (*session)->run_until(4, [](StepContext&) { return Status::OK(); });
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("model.ckpt-2"), std::string::npos) << status.ToString();
  EXPECT_NE(status.message().find(std::strerror(ENOSPC)), std::string::npos) << status.ToString();
  faulty->clear_faults();
  EXPECT_EQ(CheckpointDirs(), (std::vector<std::string>{"model.ckpt-0"}));
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, dir_ + "/model.ckpt-0");
  EXPECT_EQ(listener.calls.back(), "after_save 2 failed");  // end() is not called after a failure
  EXPECT_EQ((*hook)->totals().saves_failed, 1);
}

TEST_F(CheckpointSaverHookTest, StaleTemporariesAreRemovedAtBegin) {
  fs::create_directories(dir_ + "/model.ckpt-7.tmp-0123456789abcdef");
  fs::create_directories(dir_ + "/unrelated");
  auto hook = CheckpointSaverHook::Create(Options(5), &registry_);
  ASSERT_TRUE(hook.ok());
  ASSERT_TRUE((*hook)->begin().ok());
  EXPECT_EQ((*hook)->totals().stale_temporaries_removed,
            (std::vector<std::string>{"model.ckpt-7.tmp-0123456789abcdef"}));
  EXPECT_FALSE(fs::exists(dir_ + "/model.ckpt-7.tmp-0123456789abcdef"));
  EXPECT_TRUE(fs::exists(dir_ + "/unrelated"));
}

TEST_F(CheckpointSaverHookTest, InvalidOptionsAreRejectedWithClearMessages) {
  SaverOptions both = Options(5);
  both.save_secs = 10;
  auto hook = CheckpointSaverHook::Create(both, &registry_);
  ASSERT_FALSE(hook.ok());
  EXPECT_NE(hook.status().message().find("save_steps or save_secs"), std::string::npos);

  SaverOptions neither = Options(5);
  neither.save_steps.reset();
  EXPECT_FALSE(CheckpointSaverHook::Create(neither, &registry_).ok());

  SaverOptions bad_name = Options(5);
  bad_name.basename = "../escape";
  hook = CheckpointSaverHook::Create(bad_name, &registry_);
  ASSERT_FALSE(hook.ok());
  EXPECT_NE(hook.status().message().find("basename"), std::string::npos);

  SaverOptions bad_keep = Options(5);
  bad_keep.max_to_keep = -1;
  hook = CheckpointSaverHook::Create(bad_keep, &registry_);
  ASSERT_FALSE(hook.ok());
  EXPECT_NE(hook.status().message().find("max_to_keep"), std::string::npos);

  SaverOptions no_dir = Options(5);
  no_dir.checkpoint_dir.clear();
  EXPECT_FALSE(CheckpointSaverHook::Create(no_dir, &registry_).ok());
  EXPECT_FALSE(CheckpointSaverHook::Create(Options(5), nullptr).ok());
}

TEST_F(CheckpointSaverHookTest, EachSaveReportsItsStats) {
  RecordingListener listener;
  auto hook = CheckpointSaverHook::Create(Options(5), &registry_, {&listener});
  ASSERT_TRUE(hook.ok());
  ASSERT_TRUE(Train(hook->get(), 5).ok());
  ASSERT_EQ(listener.stats_seen.size(), 2u);
  const SaveStats& stats = listener.stats_seen[1];
  EXPECT_EQ(stats.step, 5);
  EXPECT_EQ(stats.bytes_raw, 12000 * sizeof(float) + 7 * sizeof(int64_t));
  EXPECT_GT(stats.bytes_stored, 0u);
  EXPECT_GT(stats.seconds_to_durable, 0);
  EXPECT_EQ(stats.blocked_seconds, stats.seconds_to_durable);
  EXPECT_EQ(stats.path, dir_ + "/model.ckpt-5");
}

}  // namespace
}  // namespace asyncckpt
