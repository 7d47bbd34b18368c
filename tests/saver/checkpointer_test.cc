#include "asyncckpt/checkpointer.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/state.h"
#include "asyncckpt/xtensor.h"
#include "io/fault_injection_file_system.h"
#include "src/state/state_file.h"
#include "tests/io/gated_file_system.h"
#include "tests/support/tensor_ref.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;

using testing_support::GatedFileSystem;

// Runs every test on the asynchronous engine and on the synchronous writer.
class CheckpointerTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/checkpointer_test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    weights_.resize(10 * 1600);
    steps_seen_.resize(3);
  }
  void TearDown() override { fs::remove_all(dir_); }

  bool asynchronous() const { return GetParam(); }
  SaveMode mode() const {
    return asynchronous() ? SaveMode::kAsynchronous : SaveMode::kSynchronous;
  }

  SaverOptions Options() {
    SaverOptions options;
    options.checkpoint_dir = dir_;
    options.save_steps = 3;
    options.max_to_keep = 0;
    options.chunk_bytes = 4096;  // 16 chunks per save (64000 bytes of weights)
    options.background_threads = 2;
    options.file_system = fs_under_test_.get();  // null: the default backend
    return options;
  }

  std::unique_ptr<Checkpointer> Make(const SaverOptions& options) {
    auto made = Checkpointer::Create(options, mode());
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    return made.ok() ? std::move(made).value() : nullptr;
  }

  // The state of `step`: every element differs from every other step's.
  void SetState(int64_t step) {
    for (size_t i = 0; i < weights_.size(); ++i) weights_[i] = float(step * 10000 + int64_t(i));
    for (size_t i = 0; i < steps_seen_.size(); ++i) steps_seen_[i] = step + int64_t(i);
  }
  TensorRegistry Registry(bool with_optimizer = false) {
    TensorRegistry registry;
    EXPECT_TRUE(registry
                    .add({"model/w",
                          DType::kF32,
                          {10, 1600},
                          weights_.data(),
                          weights_.size() * sizeof(float),
                          nullptr,
                          {},
                          {}})
                    .ok());
    if (with_optimizer) {
      EXPECT_TRUE(registry
                      .add({"optimizer/steps",
                            DType::kI64,
                            {3},
                            steps_seen_.data(),
                            steps_seen_.size() * sizeof(int64_t),
                            nullptr,
                            {},
                            {}})
                      .ok());
    }
    return registry;
  }

  // Makes the file system of the checkpointers that Options() configures from now on inject
  // faults (over POSIX).
  io::FaultInjectionFileSystem* InstallFaults() {
    posix_ = io::NewPosixFileSystem();
    auto faults = std::make_unique<io::FaultInjectionFileSystem>(posix_.get());
    io::FaultInjectionFileSystem* raw = faults.get();
    fs_under_test_ = std::move(faults);
    return raw;
  }

  std::string Path(int64_t step) const { return dir_ + "/model.ckpt-" + std::to_string(step); }

  void ExpectHoldsStep(int64_t step, bool with_optimizer = false) {
    SCOPED_TRACE("step " + std::to_string(step));
    auto reader = CheckpointReader::Open(Path(step));
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    EXPECT_EQ((*reader)->metadata().step, step);
    auto w = ReadXarray<float>(**reader, "model/w");
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_EQ(w->size(), weights_.size());
    for (size_t i = 0; i < weights_.size(); ++i) {
      ASSERT_EQ(w->data()[i], float(step * 10000 + int64_t(i))) << i;
    }
    EXPECT_EQ((*reader)->find("optimizer/steps") != nullptr, with_optimizer);
    if (with_optimizer) {
      auto steps = ReadXarray<int64_t>(**reader, "optimizer/steps");
      ASSERT_TRUE(steps.ok());
      EXPECT_EQ(steps->data()[2], step + 2);
    }
  }

  std::string dir_;
  std::vector<float> weights_;
  std::vector<int64_t> steps_seen_;
  std::unique_ptr<io::FileSystem> posix_;
  std::unique_ptr<io::FileSystem> fs_under_test_;  // declared after posix_: destroyed first
};

TEST_P(CheckpointerTest, DeferredStartReadsOnlyUntilTheFirstSaveThenQuarantines) {
  SaverOptions options = Options();
  options.max_to_keep = 1;
  {
    auto checkpointer = Make(options);
    SetState(10);
    ASSERT_TRUE(checkpointer->save(10, Registry()).ok());
    ASSERT_TRUE(checkpointer->close().ok());
  }
  const fs::path data = fs::path(Path(10)) / "data-00000-of-00002";
  fs::resize_file(data, fs::file_size(data) / 2);
  std::set<std::string> before;
  for (const auto& entry : fs::directory_iterator(dir_)) before.insert(entry.path().filename());

  auto made = Checkpointer::Create(options, mode(), CheckpointerStart::kAtFirstSave);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Checkpointer& deferred = **made;
  std::set<std::string> after;
  for (const auto& entry : fs::directory_iterator(dir_)) after.insert(entry.path().filename());
  EXPECT_EQ(after, before) << "creating it changed the directory";
  EXPECT_TRUE(deferred.all_steps().empty()) << "a damaged checkpoint is not a step to resume";
  Result<std::vector<std::string>> damaged = deferred.damaged();
  ASSERT_TRUE(damaged.ok()) << damaged.status().ToString();
  ASSERT_EQ(damaged->size(), 1u);
  EXPECT_EQ(damaged->front().rfind(Path(10) + ": ", 0), 0u) << damaged->front();

  const Status saved = deferred.save(11, Registry());
  EXPECT_EQ(saved.code(), StatusCode::kFailedPrecondition) << saved.ToString();
  EXPECT_NE(saved.message().find(Path(10) + ".corrupt-"), std::string::npos) << saved.ToString();
  EXPECT_FALSE(fs::exists(Path(10)));
  damaged = deferred.damaged();
  ASSERT_TRUE(damaged.ok() && damaged->size() == 1u);
  EXPECT_NE(damaged->front().find("quarantined"), std::string::npos) << damaged->front();
}

INSTANTIATE_TEST_SUITE_P(AsyncAndSync, CheckpointerTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Async" : "Sync"; });

TEST_P(CheckpointerTest, SaveReturnsOnceTheStateMayChangeAndTheCheckpointHoldsItsState) {
  auto checkpointer = Make(Options());
  ASSERT_NE(checkpointer, nullptr);
  SetState(7);
  TensorRegistry registry = Registry();
  ASSERT_TRUE(checkpointer->save(7, registry).ok());
  SetState(8);  // the save above must already hold its own copy
  ASSERT_TRUE(checkpointer->save(8, registry).ok());
  ASSERT_TRUE(checkpointer->close().ok());
  ExpectHoldsStep(7);
  ExpectHoldsStep(8);
  EXPECT_EQ(checkpointer->all_steps(), (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(checkpointer->latest_step(), std::optional<int64_t>(8));
  const SaverTotals totals = checkpointer->totals();
  EXPECT_EQ(totals.saves_committed, 2);
  ASSERT_EQ(totals.saves.size(), 2u);
  EXPECT_EQ(totals.saves[1].path, Path(8));
  EXPECT_EQ(totals.saves[1].bytes_raw, weights_.size() * sizeof(float));
  // Both modes write through the engine, which stages the snapshot.
  EXPECT_GT(totals.staging_high_water_bytes, 0u);
}

TEST_P(CheckpointerTest, ANegativeStepIsRefusedBeforeAnythingIsWrittenAndSavesGoOn) {
  auto checkpointer = Make(Options());
  ASSERT_NE(checkpointer, nullptr);
  SetState(1);
  TensorRegistry registry = Registry();
  const Status refused = checkpointer->save(-1, registry);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.ToString();
  EXPECT_NE(refused.message().find("step -1"), std::string::npos) << refused.ToString();
  const Result<bool> maybe = checkpointer->maybe_save(-4, registry);
  EXPECT_EQ(maybe.status().code(), StatusCode::kInvalidArgument);
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().find("--"), std::string::npos) << entry.path();
  }
  ASSERT_TRUE(checkpointer->save(1, registry).ok());
  ASSERT_TRUE(checkpointer->close().ok());
  EXPECT_EQ(checkpointer->all_steps(), (std::vector<int64_t>{1}));
}

TEST_P(CheckpointerTest, MaybeSaveFollowsTheStepTimerFromTheFirstStepItSees) {
  auto checkpointer = Make(Options());  // every 3 steps
  ASSERT_NE(checkpointer, nullptr);
  TensorRegistry registry = Registry();
  std::vector<int64_t> saved;
  for (int64_t step = 5; step <= 15; ++step) {
    SetState(step);
    EXPECT_EQ(checkpointer->due(step), step == 5 || step == 8 || step == 11 || step == 14);
    auto taken = checkpointer->maybe_save(step, registry);
    ASSERT_TRUE(taken.ok()) << taken.status().ToString();
    if (*taken) saved.push_back(step);
  }
  ASSERT_TRUE(checkpointer->close().ok());
  EXPECT_EQ(saved, (std::vector<int64_t>{5, 8, 11, 14}));
  EXPECT_EQ(checkpointer->all_steps(), saved);
  for (int64_t step : saved) ExpectHoldsStep(step);
}

TEST_P(CheckpointerTest, AnExplicitSaveRestartsTheTimer) {
  auto checkpointer = Make(Options());  // every 3 steps
  ASSERT_NE(checkpointer, nullptr);
  TensorRegistry registry = Registry();
  ASSERT_TRUE(checkpointer->save(10, registry).ok());
  EXPECT_FALSE(checkpointer->due(10));
  EXPECT_FALSE(checkpointer->due(12));
  EXPECT_TRUE(checkpointer->due(13));
  ASSERT_TRUE(checkpointer->close().ok());
}

TEST_P(CheckpointerTest, TensorsAddedBetweenSavesAreSavedWithTheRest) {
  auto checkpointer = Make(Options());
  ASSERT_NE(checkpointer, nullptr);
  SetState(1);
  ASSERT_TRUE(checkpointer->save(1, Registry()).ok());
  // An optimizer's state appears after its first step: the next snapshot is larger.
  SetState(2);
  ASSERT_TRUE(checkpointer->save(2, Registry(/*with_optimizer=*/true)).ok());
  SetState(3);
  ASSERT_TRUE(checkpointer->save(3, Registry(/*with_optimizer=*/true)).ok());
  ASSERT_TRUE(checkpointer->close().ok());
  ExpectHoldsStep(1);
  ExpectHoldsStep(2, /*with_optimizer=*/true);
  ExpectHoldsStep(3, /*with_optimizer=*/true);
}

TEST_P(CheckpointerTest, PrepareCreatesStagingOnceAndTheSavesOfAGrowingStateReuseIt) {
  auto checkpointer = Make(Options());
  ASSERT_NE(checkpointer, nullptr);
  SetState(1);
  ASSERT_TRUE(checkpointer->prepare(Registry(), /*reserve_bytes=*/1 << 20).ok());
  ASSERT_TRUE(checkpointer->wait_until_finished().ok());  // the engine is made in the background
  const double startup = checkpointer->totals().startup_seconds;
  EXPECT_GT(startup, 0);
  ASSERT_TRUE(checkpointer->save(1, Registry()).ok());
  // The optimizer's state appears: the reserve holds it, so no engine is created again.
  SetState(2);
  ASSERT_TRUE(checkpointer->save(2, Registry(/*with_optimizer=*/true)).ok());
  ASSERT_TRUE(checkpointer->close().ok());
  EXPECT_EQ(checkpointer->totals().startup_seconds, startup);
  ExpectHoldsStep(1);
  ExpectHoldsStep(2, /*with_optimizer=*/true);
  EXPECT_EQ(checkpointer->prepare(Registry()).code(), StatusCode::kFailedPrecondition);
}

TEST_P(CheckpointerTest, PrepareLikeLatestSizesStagingFromTheCheckpointAResumeWillSave) {
  {
    auto fresh = Make(Options());
    ASSERT_NE(fresh, nullptr);
    Result<bool> prepared = fresh->prepare_like_latest();
    ASSERT_TRUE(prepared.ok()) << prepared.status().ToString();
    EXPECT_FALSE(*prepared);  // nothing to resume from: nothing made, no lock taken
    SetState(1);
    ASSERT_TRUE(fresh->save(1, Registry()).ok());
    ASSERT_TRUE(fresh->close().ok());
  }
  auto resumed = Make(Options());
  ASSERT_NE(resumed, nullptr);
  Result<bool> prepared = resumed->prepare_like_latest();
  ASSERT_TRUE(prepared.ok()) << prepared.status().ToString();
  EXPECT_TRUE(*prepared);
  ASSERT_TRUE(resumed->wait_until_finished().ok());
  const double startup = resumed->totals().startup_seconds;
  EXPECT_GT(startup, 0);
  SetState(2);
  ASSERT_TRUE(resumed->save(2, Registry()).ok());  // the same state: the staging made fits
  EXPECT_EQ(resumed->totals().startup_seconds, startup);
  SetState(3);
  ASSERT_TRUE(resumed->save(3, Registry(/*with_optimizer=*/true)).ok());  // a larger one
  ASSERT_TRUE(resumed->close().ok());
  if (asynchronous()) {
    EXPECT_GT(resumed->totals().startup_seconds, startup);
  }
  ExpectHoldsStep(2);
  ExpectHoldsStep(3, /*with_optimizer=*/true);
  EXPECT_EQ(resumed->prepare_like_latest().status().code(), StatusCode::kFailedPrecondition);
}

TEST_P(CheckpointerTest, AFirstSaveThatCreatesTheEngineCountsItAsBlocked) {
  auto checkpointer = Make(Options());
  ASSERT_NE(checkpointer, nullptr);
  SetState(1);
  ASSERT_TRUE(checkpointer->save(1, Registry()).ok());
  ASSERT_TRUE(checkpointer->close().ok());
  const SaverTotals totals = checkpointer->totals();
  ASSERT_EQ(totals.saves.size(), 1u);
  EXPECT_GT(totals.startup_seconds, 0);
  EXPECT_GE(totals.saves[0].blocked_seconds, totals.startup_seconds);
}

TEST_P(CheckpointerTest, PerSaveMetadataIsStoredBesideTheOptionsMetadataAndWins) {
  SaverOptions options = Options();
  options.user_metadata = {{"job", "digits"}, {"epoch", "options"}};
  auto checkpointer = Make(options);
  ASSERT_NE(checkpointer, nullptr);
  ASSERT_TRUE(checkpointer->save(4, Registry(), {{"epoch", "2"}, {"tree", "{}"}}).ok());
  ASSERT_TRUE(checkpointer->close().ok());
  auto reader = CheckpointReader::Open(Path(4));
  ASSERT_TRUE(reader.ok());
  const std::map<std::string, std::string> want = {
      {"epoch", "2"}, {"job", "digits"}, {"tree", "{}"}};
  EXPECT_EQ((*reader)->metadata().user, want);
}

TEST_P(CheckpointerTest, BadInputIsRefusedByTheCallAndNothingIsWritten) {
  auto checkpointer = Make(Options());
  ASSERT_NE(checkpointer, nullptr);
  const std::string too_long(2u << 20, 'x');
  Status status = checkpointer->save(1, Registry(), {{"big", too_long}});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_NE(status.message().find("model.ckpt-1"), std::string::npos) << status.message();
  // Not a background failure: the checkpointer goes on.
  ASSERT_TRUE(checkpointer->save(2, Registry()).ok());
  ASSERT_TRUE(checkpointer->close().ok());
  EXPECT_EQ(checkpointer->all_steps(), (std::vector<int64_t>{2}));
  EXPECT_FALSE(fs::exists(Path(1)));
}

TEST_P(CheckpointerTest, AFailedSaveStopsTheCheckpointerAndEveryLaterCallReportsIt) {
  io::FaultInjectionFileSystem* faults = InstallFaults();
  auto checkpointer = Make(Options());
  ASSERT_NE(checkpointer, nullptr);
  SetState(1);
  ASSERT_TRUE(checkpointer->save(1, Registry()).ok());
  ASSERT_TRUE(checkpointer->wait_until_finished().ok());
  faults->fail_ops_matching("model.ckpt-2", ENOSPC, io::FaultOp::kWrite);
  SetState(2);
  Status first = checkpointer->save(2, Registry());
  if (asynchronous()) {
    ASSERT_TRUE(first.ok()) << "the write fails in the background";
    first = checkpointer->wait_until_finished();
  }
  EXPECT_FALSE(first.ok());
  EXPECT_NE(first.message().find("model.ckpt-2"), std::string::npos) << first.ToString();
  faults->clear_faults();
  Status later = checkpointer->save(3, Registry());
  EXPECT_EQ(later.ToString(), first.ToString());
  auto maybe = checkpointer->maybe_save(4, Registry());
  EXPECT_EQ(maybe.status().ToString(), first.ToString());
  EXPECT_EQ(checkpointer->close().ToString(), first.ToString());
  EXPECT_EQ(checkpointer->all_steps(), (std::vector<int64_t>{1}));
  EXPECT_FALSE(fs::exists(Path(3)));
  ExpectHoldsStep(1);
  EXPECT_EQ(checkpointer->totals().saves_failed, 1);
}

TEST_P(CheckpointerTest, WithOnErrorContinueAFailedSaveIsCountedAndSavingGoesOn) {
  io::FaultInjectionFileSystem* faults = InstallFaults();
  SaverOptions options = Options();
  options.on_error = OnError::kContinue;
  auto checkpointer = Make(options);
  ASSERT_NE(checkpointer, nullptr);
  faults->fail_ops_matching("model.ckpt-1", EIO, io::FaultOp::kWrite);
  SetState(1);
  EXPECT_TRUE(checkpointer->save(1, Registry()).ok());
  EXPECT_TRUE(checkpointer->wait_until_finished().ok());
  SetState(2);
  EXPECT_TRUE(checkpointer->save(2, Registry()).ok());
  EXPECT_TRUE(checkpointer->close().ok());
  const SaverTotals totals = checkpointer->totals();
  EXPECT_EQ(totals.saves_failed, 1);
  EXPECT_EQ(totals.saves_committed, 1);
  ASSERT_EQ(totals.saves.size(), 2u);
  EXPECT_FALSE(totals.saves[0].status.ok());
  EXPECT_EQ(checkpointer->all_steps(), (std::vector<int64_t>{2}));
  ExpectHoldsStep(2);
}

TEST_P(CheckpointerTest, SavesAfterCloseAreRefused) {
  auto checkpointer = Make(Options());
  ASSERT_NE(checkpointer, nullptr);
  ASSERT_TRUE(checkpointer->close().ok());
  ASSERT_TRUE(checkpointer->close().ok());
  EXPECT_EQ(checkpointer->save(1, Registry()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(checkpointer->maybe_save(1, Registry()).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST_P(CheckpointerTest, CloseHandsTheDirectoryToTheNextCheckpointerAndKeepsReadsWorking) {
  auto first = Make(Options());
  ASSERT_NE(first, nullptr);
  SetState(1);
  ASSERT_TRUE(first->save(1, Registry()).ok());
  // While the first holds checkpoint_dir, a second is refused naming the lock.
  auto refused = Checkpointer::Create(Options(), mode());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(first->close().ok());
  auto second = Make(Options());
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->all_steps(), (std::vector<int64_t>{1}));
  EXPECT_EQ(first->all_steps(), (std::vector<int64_t>{1}));
  auto reader = first->open(1);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->metadata().step, 1);
}

TEST_P(CheckpointerTest, ANewCheckpointerFindsTheStepsOfAnEarlierOneAndRetentionApplies) {
  SaverOptions options = Options();
  options.max_to_keep = 2;
  {
    auto first = Make(options);
    ASSERT_NE(first, nullptr);
    for (int64_t step : {1, 2, 3}) {
      SetState(step);
      ASSERT_TRUE(first->save(step, Registry()).ok());
    }
    ASSERT_TRUE(first->close().ok());
    EXPECT_EQ(first->all_steps(), (std::vector<int64_t>{2, 3}));
  }
  EXPECT_FALSE(fs::exists(Path(1)));
  auto second = Make(options);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->all_steps(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(second->latest_step(), std::optional<int64_t>(3));
  auto reader = second->open(std::nullopt);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->metadata().step, 3);
  EXPECT_EQ(second->open(1).status().code(), StatusCode::kNotFound);
}

// Issue 32 item 4: best-N by each save's score, through the real index. The scores come back
// from the checkpoints' metadata at a new checkpointer's start: one that lost them would keep
// 1 and 3 as unscored and step 4 besides.
TEST_P(CheckpointerTest, BestModeKeepsTheBestScoresAcrossANewCheckpointer) {
  SaverOptions options = Options();
  options.max_to_keep = 2;
  options.best_mode = BestMode::kMax;
  options.keep_period = 10;
  const std::map<int64_t, std::string> scores = {
      {1, "0.9"}, {2, "0.1"}, {3, "0.5"}, {4, "0.2"}, {5, "0.95"}};
  {
    auto first = Make(options);
    ASSERT_NE(first, nullptr);
    for (int64_t step : {1, 2, 3}) {
      SetState(step);
      ASSERT_TRUE(first->save(step, Registry(), {{kRetentionScoreKey, scores.at(step)}}).ok());
    }
    ASSERT_TRUE(first->close().ok());
    EXPECT_EQ(first->all_steps(), (std::vector<int64_t>{1, 3}));
  }
  auto second = Make(options);
  ASSERT_NE(second, nullptr);
  SetState(4);
  ASSERT_TRUE(second->save(4, Registry(), {{kRetentionScoreKey, scores.at(4)}}).ok());
  ASSERT_TRUE(second->wait_until_finished().ok());
  EXPECT_EQ(second->all_steps(), (std::vector<int64_t>{1, 3}));
  SetState(5);
  ASSERT_TRUE(second->save(5, Registry(), {{kRetentionScoreKey, scores.at(5)}}).ok());
  SetState(10);
  ASSERT_TRUE(second->save(10, Registry(), {{kRetentionScoreKey, "0.0"}}).ok());
  ASSERT_TRUE(second->close().ok());
  EXPECT_EQ(second->all_steps(), (std::vector<int64_t>{1, 5, 10}));
  for (int64_t gone : {2, 3, 4}) EXPECT_FALSE(fs::exists(Path(gone))) << gone;
  ExpectHoldsStep(5);
}

TEST_P(CheckpointerTest, AScoreThatIsNoFiniteNumberIsRefusedBeforeAnythingIsWritten) {
  SaverOptions options = Options();
  options.max_to_keep = 1;
  options.best_mode = BestMode::kMin;
  auto checkpointer = Make(options);
  ASSERT_NE(checkpointer, nullptr);
  const Status status = checkpointer->save(1, Registry(), {{kRetentionScoreKey, "nan"}});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_NE(status.message().find(kRetentionScoreKey), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("model.ckpt-1"), std::string::npos) << status.message();
  ASSERT_TRUE(checkpointer->close().ok());
  EXPECT_TRUE(checkpointer->all_steps().empty());
  EXPECT_FALSE(fs::exists(Path(1)));
}

// Issue 32 item 1: after save(5), save(7), save(6), the latest is 6, the step the last save
// wrote, as the state file records it; a new checkpointer said 7 and restored 7. Every call
// agrees now: all_steps() in save order, latest_step() its last, open() of the latest.
TEST_P(CheckpointerTest, TheLatestIsTheLastSavedStepBeforeAndAfterAStartAndInANewCheckpointer) {
  SaverOptions options = Options();
  options.max_to_keep = 5;
  {
    auto first = Make(options);
    ASSERT_NE(first, nullptr);
    for (int64_t step : {5, 7, 6}) {
      SetState(step);
      ASSERT_TRUE(first->save(step, Registry()).ok());
    }
    ASSERT_TRUE(first->close().ok());
    EXPECT_EQ(first->all_steps(), (std::vector<int64_t>{5, 7, 6}));
    EXPECT_EQ(first->latest_step(), std::optional<int64_t>(6));
  }
  auto second = Checkpointer::Create(options, mode(), CheckpointerStart::kAtFirstSave);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ((*second)->all_steps(), (std::vector<int64_t>{5, 7, 6})) << "before its start";
  EXPECT_EQ((*second)->latest_step(), std::optional<int64_t>(6));
  {
    auto reader = (*second)->open(std::nullopt);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    EXPECT_EQ((*reader)->metadata().step, 6);
  }
  SetState(8);
  ASSERT_TRUE((*second)->save(8, Registry()).ok());
  ASSERT_TRUE((*second)->wait_until_finished().ok());
  EXPECT_EQ((*second)->all_steps(), (std::vector<int64_t>{5, 7, 6, 8}));
}

// Item 2 of issue 31: a checkpoint a restore finds damaged is quarantined, and the newest good
// one becomes the latest, before and after the start.
TEST_P(CheckpointerTest, AQuarantinedCheckpointLeavesTheListAndTheOneBeforeIsTheLatest) {
  SaverOptions options = Options();
  {
    auto first = Make(options);
    ASSERT_NE(first, nullptr);
    for (int64_t step : {1, 2, 3}) {
      SetState(step);
      ASSERT_TRUE(first->save(step, Registry()).ok());
    }
    ASSERT_TRUE(first->wait_until_finished().ok());
    ASSERT_TRUE(first->quarantine(3, "a chunk fails its checksum").ok());
    EXPECT_EQ(first->latest_step(), std::optional<int64_t>(2));
    ASSERT_TRUE(first->close().ok());
  }
  auto second = Checkpointer::Create(options, mode(), CheckpointerStart::kAtFirstSave);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_TRUE((*second)->quarantine(2, "a chunk fails its checksum").ok()) << "before the start";
  EXPECT_EQ((*second)->all_steps(), (std::vector<int64_t>{1}));
  size_t quarantined = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    quarantined += entry.path().filename().string().find(".corrupt-") != std::string::npos;
  }
  EXPECT_EQ(quarantined, 2u);
}

// D4 of issue 31: a deferred start found another state file's basename only at the first save,
// after the training. The refusal comes at Create, read-only.
TEST_P(CheckpointerTest, ABasenameAnotherStateFileListsIsRefusedAtCreate) {
  SaverOptions options = Options();
  options.basename = "input.ckpt";
  CheckpointState state;
  state.all_model_checkpoint_paths = {"input.ckpt-3"};
  state.model_checkpoint_path = "input.ckpt-3";
  auto posix = io::NewPosixFileSystem();
  ASSERT_TRUE(WriteCheckpointState(*posix, dir_, state, "checkpoint_input").ok());
  auto made = Checkpointer::Create(options, mode(), CheckpointerStart::kAtFirstSave);
  EXPECT_EQ(made.status().code(), StatusCode::kFailedPrecondition) << made.status().ToString();
  EXPECT_NE(made.status().message().find(dir_ + "/checkpoint_input"), std::string::npos);
  options.basename = "";
  made = Checkpointer::Create(options, mode(), CheckpointerStart::kAtFirstSave);
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument) << "D10: an empty basename";
}

TEST_P(CheckpointerTest, AnOpenReaderKeepsItsCheckpointFromRetentionUntilItIsDestroyed) {
  SaverOptions options = Options();
  options.max_to_keep = 1;
  auto checkpointer = Make(options);
  ASSERT_NE(checkpointer, nullptr);
  SetState(1);
  ASSERT_TRUE(checkpointer->save(1, Registry()).ok());
  ASSERT_TRUE(checkpointer->wait_until_finished().ok());
  auto reader = checkpointer->open(1);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  SetState(2);
  ASSERT_TRUE(checkpointer->save(2, Registry()).ok());
  ASSERT_TRUE(checkpointer->wait_until_finished().ok());
  EXPECT_EQ(checkpointer->all_steps(), (std::vector<int64_t>{2}));
  ASSERT_TRUE(fs::exists(Path(1))) << "retention deleted a checkpoint being read";
  std::vector<float> w(weights_.size());
  ASSERT_TRUE((*reader)->read("model/w", w.data(), w.size() * sizeof(float)).ok());
  EXPECT_EQ(w[3], 10003.f);
  reader->reset();
  EXPECT_FALSE(fs::exists(Path(1)));
  ASSERT_TRUE(checkpointer->close().ok());
}

TEST_P(CheckpointerTest, BadOptionsAreRefusedWithTheFieldNamed) {
  SaverOptions options = Options();
  options.save_steps.reset();
  auto made = Checkpointer::Create(options, mode());
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("save_steps or save_secs"), std::string::npos);
  options = Options();
  options.max_to_keep = -1;
  made = Checkpointer::Create(options, mode());
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("max_to_keep"), std::string::npos);
}

// An asynchronous Checkpointer's job of one tensor whose writes a gate holds, in a temporary
// directory removed after the test.
class GatedCheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "checkpointer_gated_test-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    ASSERT_TRUE(registry_
                    .add(testing_support::Ref("w", DType::kF32, {1000}, weights_.data(),
                                              weights_.size() * sizeof(float)))
                    .ok());
    options_.checkpoint_dir = dir_;
    options_.save_steps = 1;
    options_.file_system = &gate_;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string dir_;
  GatedFileSystem gate_{io::NewPosixFileSystem()};
  std::vector<float> weights_ = std::vector<float>(1000, 1.f);
  TensorRegistry registry_;
  SaverOptions options_;
};

class CheckpointerBusyTest : public GatedCheckpointerTest {};
class CheckpointerFinishedSavesTest : public GatedCheckpointerTest {};

// Asynchronous only: staging held by a save whose writes are stuck makes maybe_save skip, and
// save() wait.
TEST_F(CheckpointerBusyTest, WithOnBusySkipMaybeSaveSkipsWhileStagingIsHeld) {
  options_.on_busy = OnBusy::kSkip;
  options_.background_threads = 2;
  auto made = Checkpointer::Create(options_, SaveMode::kAsynchronous);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Checkpointer& checkpointer = **made;
  auto first = checkpointer.maybe_save(1, registry_);
  ASSERT_TRUE(first.ok() && *first);
  gate_.WaitForWaiting(1);  // step 1's write holds the whole staging budget
  auto second = checkpointer.maybe_save(2, registry_);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_FALSE(*second);
  EXPECT_EQ(checkpointer.totals().saves_skipped, 1);
  EXPECT_TRUE(checkpointer.due(3));
  gate_.Open();
  ASSERT_TRUE(checkpointer.close().ok());
  EXPECT_EQ(checkpointer.all_steps(), (std::vector<int64_t>{1}));
}

// Holds every remove_tree (retention's removal of a renamed checkpoint) until Open().
class RemovalGate final : public io::FileSystemWrapper {
 public:
  explicit RemovalGate(io::FileSystem* target) : FileSystemWrapper(target) {}
  io::IoStatus remove_tree(const std::string& path) override {
    std::unique_lock lock(mu_);
    ++entered_;
    changed_.notify_all();
    changed_.wait(lock, [&] { return open_; });
    lock.unlock();
    return target()->remove_tree(path);
  }
  void WaitForEntered(int n) {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return entered_ >= n; });
  }
  void Open() {
    std::lock_guard lock(mu_);
    open_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  int entered_ = 0;
  bool open_ = false;
};

// A save is reported finished once durable: retention's removal of what it dropped goes on in
// the background, and only close() waits for it.
TEST_P(CheckpointerTest, WaitUntilFinishedReturnsOnceDurableWhileRetentionStillRemoves) {
  std::unique_ptr<io::FileSystem> posix = io::NewPosixFileSystem();
  RemovalGate gate(posix.get());
  SaverOptions options = Options();
  options.max_to_keep = 1;
  options.file_system = &gate;
  auto checkpointer = Make(options);
  SetState(1);
  ASSERT_TRUE(checkpointer->save(1, Registry()).ok());
  ASSERT_TRUE(checkpointer->wait_until_finished().ok());
  SetState(2);
  ASSERT_TRUE(checkpointer->save(2, Registry()).ok());
  gate.WaitForEntered(1);  // the removal of step 1 is under way, and held
  auto waited = std::async(std::launch::async, [&] { return checkpointer->wait_until_finished(); });
  const bool returned = waited.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  gate.Open();  // lets a wait that is stuck behind the removal go, so the test ends either way
  EXPECT_TRUE(returned) << "wait_until_finished waited for retention's removal";
  EXPECT_TRUE(waited.get().ok());
  EXPECT_EQ(checkpointer->all_steps(), (std::vector<int64_t>{2}));
  ExpectHoldsStep(2);
  ASSERT_TRUE(checkpointer->close().ok());
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().find(".deleting-"), std::string::npos)
        << "close() returned before the removal was done: " << entry.path();
  }
}

// Asynchronous only: the n-th save is done once n saves have finished, and a wait for it ends at
// its timeout while its writes are held.
TEST_F(CheckpointerFinishedSavesTest, WaitsForTheNthSaveOrTheTimeout) {
  auto made = Checkpointer::Create(options_, SaveMode::kAsynchronous);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Checkpointer& checkpointer = **made;
  ASSERT_TRUE(checkpointer.save(1, registry_).ok());
  gate_.WaitForWaiting(1);
  EXPECT_FALSE(checkpointer.wait_for_finished_saves(1, 0.05));
  gate_.Open();
  EXPECT_TRUE(checkpointer.wait_for_finished_saves(1, -1));
  EXPECT_EQ(checkpointer.totals().saves_committed, 1);
  EXPECT_TRUE(checkpointer.wait_for_finished_saves(0, 0));
  ASSERT_TRUE(checkpointer.close().ok());
}

}  // namespace
}  // namespace asyncckpt
