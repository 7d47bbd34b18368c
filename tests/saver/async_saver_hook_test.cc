#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/session.h"
#include "asyncckpt/state.h"
#include "asyncckpt/xtensor.h"
#include "io/fault_injection_file_system.h"
#include "tests/device/flaky_device.h"
#include "tests/io/gated_file_system.h"
#include "tests/io/slow_file_system.h"
#include "tests/io/throwing_file_system.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kPage = 4096;
// The fixture's weights: 12 x 6400 floats, 75 one-page chunks at the fixture's chunk_bytes.
constexpr size_t kWeightRows = 12;
constexpr size_t kWeightColumns = 6400;

// Records every listener call. after_save comes from the engine's commit thread, so everything
// is guarded, and a test can wait for the n-th save to finish.
class RecordingListener : public CheckpointSaverListener {
 public:
  // With a directory, after_save also notes what the state file names at that moment.
  explicit RecordingListener(std::string dir = "") : dir_(std::move(dir)) {}

  void begin() override {
    std::lock_guard lock(mu_);
    ++begins_;
  }
  void before_save(int64_t step) override {
    std::lock_guard lock(mu_);
    before_.push_back(step);
  }
  bool after_save(int64_t step, const SaveStats& stats) override {
    std::string latest;
    if (!dir_.empty() && stats.status.ok()) {
      auto found = LatestCheckpoint(dir_);
      latest = found.ok() ? *found : found.status().ToString();
    }
    std::lock_guard lock(mu_);
    after_.push_back(step);
    stats_.push_back(stats);
    latest_at_save_.push_back(latest);
    done_.notify_all();
    return step == stop_after_step_;
  }
  void end(int64_t step) override {
    std::lock_guard lock(mu_);
    ends_.push_back(step);
  }

  void StopAfter(int64_t step) {
    std::lock_guard lock(mu_);
    stop_after_step_ = step;
  }
  // Blocks until n saves have finished (committed or failed).
  void WaitForSaves(size_t n) {
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return after_.size() >= n; });
  }
  std::vector<int64_t> after() const {
    std::lock_guard lock(mu_);
    return after_;
  }
  std::vector<int64_t> before() const {
    std::lock_guard lock(mu_);
    return before_;
  }
  std::vector<SaveStats> stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }
  std::vector<std::string> latest_at_save() const {
    std::lock_guard lock(mu_);
    return latest_at_save_;
  }
  std::vector<int64_t> ends() const {
    std::lock_guard lock(mu_);
    return ends_;
  }
  int begins() const {
    std::lock_guard lock(mu_);
    return begins_;
  }

 private:
  const std::string dir_;
  mutable std::mutex mu_;
  std::condition_variable done_;
  int begins_ = 0;
  int64_t stop_after_step_ = -1;
  std::vector<int64_t> before_;
  std::vector<int64_t> after_;
  std::vector<SaveStats> stats_;
  std::vector<std::string> latest_at_save_;
  std::vector<int64_t> ends_;
};

using testing_support::FlakyDevice;
using testing_support::GatedFileSystem;
using testing_support::SlowFileSystem;
using testing_support::ThrowingFileSystem;

class AsyncSaverHookTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/async_hook_test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    weights_.resize(kWeightRows * kWeightColumns);
    bias_.resize(7);
    AddTensors(&registry_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Registers weights_ and bias_ in `registry`, on `device` (the host when null).
  void AddTensors(TensorRegistry* registry, std::shared_ptr<Device> device = nullptr) {
    ASSERT_TRUE(registry
                    ->add({"dense/weights",
                           DType::kF32,
                           {int64_t(kWeightRows), int64_t(kWeightColumns)},
                           weights_.data(),
                           weights_.size() * sizeof(float),
                           device,
                           {},
                           {}})
                    .ok());
    ASSERT_TRUE(registry
                    ->add({"dense/bias",
                           DType::kI64,
                           {7},
                           bias_.data(),
                           bias_.size() * sizeof(int64_t),
                           device,
                           {},
                           {}})
                    .ok());
  }

  SaverOptions Options(int64_t save_steps) {
    SaverOptions options;
    options.checkpoint_dir = dir_;
    options.save_steps = save_steps;
    options.file_system = fs_under_test_.get();  // null: the default backend
    options.max_to_keep = 0;
    options.chunk_bytes = kPage;        // 76 chunks per save: 75 of weights, one of bias
    options.staging_bytes = 4 * kPage;  // four chunks: every snapshot streams through it
    options.background_threads = 2;
    return options;
  }

  static float Weight(int64_t step, size_t i) { return float(step * 1000 + int64_t(i)) * 0.25f; }
  static int64_t Bias(int64_t step, size_t i) { return step * 10 + int64_t(i); }
  void SetState(int64_t step) {
    for (size_t i = 0; i < weights_.size(); ++i) weights_[i] = Weight(step, i);
    for (size_t i = 0; i < bias_.size(); ++i) bias_[i] = Bias(step, i);
  }
  StepFn StepFunction() {
    return [this](StepContext& ctx) {
      SetState(ctx.step());
      return Status::OK();
    };
  }
  // Runs steps 1..steps; every step changes every element.
  Status Train(SessionRunHook* hook, int64_t steps) {
    SetState(0);
    auto session = SingularMonitoredSession::Create({hook});
    if (!session.ok()) return session.status();
    return (*session)->run_until(steps, StepFunction());
  }

  void ExpectHoldsStep(const std::string& path, int64_t step) {
    SCOPED_TRACE(path);
    auto reader = CheckpointReader::Open(path);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    EXPECT_EQ((*reader)->metadata().step, step);
    auto weights = ReadXarray<float>(**reader, "dense/weights");
    auto bias = ReadXarray<int64_t>(**reader, "dense/bias");
    ASSERT_TRUE(weights.ok() && bias.ok());
    ASSERT_EQ(weights->size(), weights_.size());
    for (size_t i = 0; i < weights_.size(); ++i) {
      const float want = Weight(step, i);
      ASSERT_EQ(std::memcmp(weights->data() + i, &want, sizeof(float)), 0) << "weights " << i;
    }
    for (size_t i = 0; i < bias_.size(); ++i) ASSERT_EQ(bias->data()[i], Bias(step, i));
    EXPECT_TRUE((*reader)->verify().problems.empty());
  }

  std::string Path(int64_t step) const { return dir_ + "/model.ckpt-" + std::to_string(step); }

  std::vector<std::string> Entries() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
  void ExpectNoTemporaries() const {
    for (const auto& name : Entries()) EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
  }

  // Makes `fs` the file system of the hooks whose options Options() builds from now on.
  template <typename Fs>
  Fs* UseFileSystem(std::unique_ptr<Fs> fs) {
    Fs* raw = fs.get();
    fs_under_test_ = std::move(fs);
    return raw;
  }
  // Makes the next hooks' file system a GatedFileSystem over POSIX.
  void InstallGate() {
    gate_ = UseFileSystem(std::make_unique<GatedFileSystem>(io::NewPosixFileSystem()));
  }
  GatedFileSystem* gate() const { return gate_; }

  std::string dir_;
  std::vector<float> weights_;
  std::vector<int64_t> bias_;
  TensorRegistry registry_;
  std::unique_ptr<io::FileSystem> fs_under_test_;
  GatedFileSystem* gate_ = nullptr;
};

TEST_F(AsyncSaverHookTest, ManyStreamingSavesCommitInStepOrderAndHoldTheirState) {
  RecordingListener listener(dir_);
  auto hook = AsyncCheckpointSaverHook::Create(Options(1), &registry_, {&listener});
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  constexpr int64_t kSteps = 60;
  ASSERT_TRUE(Train(hook->get(), kSteps).ok());
  const auto after = listener.after();
  ASSERT_EQ(after.size(), size_t(kSteps + 1));
  for (size_t i = 1; i < after.size(); ++i) EXPECT_LT(after[i - 1], after[i]);
  const auto latest = listener.latest_at_save();
  const auto stats = listener.stats();
  for (int64_t step = 0; step <= kSteps; ++step) {
    ASSERT_TRUE(stats[size_t(step)].status.ok()) << stats[size_t(step)].status.ToString();
    EXPECT_EQ(stats[size_t(step)].path, Path(step));
    EXPECT_EQ(latest[size_t(step)], Path(step)) << "the state file lags behind the commit";
    ExpectHoldsStep(Path(step), step);
  }
  const SaverTotals totals = (*hook)->totals();
  EXPECT_EQ(totals.saves_committed, kSteps + 1);
  EXPECT_EQ(totals.saves_failed, 0);
  EXPECT_EQ(totals.saves_skipped, 0);
  EXPECT_LE(totals.staging_high_water_bytes, 4 * kPage);
  EXPECT_GT(totals.staging_high_water_bytes, 0u);
  ASSERT_EQ(totals.saves.size(), size_t(kSteps + 1));
  auto state = GetCheckpointState(dir_);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->model_checkpoint_path, "model.ckpt-" + std::to_string(kSteps));
  ExpectNoTemporaries();
}

TEST_F(AsyncSaverHookTest, ManySavesInFlightWithAWideBudgetStillCommitInOrder) {
  RecordingListener listener(dir_);
  SaverOptions options = Options(1);
  options.staging_bytes = 8 * 80 * kPage;  // eight whole snapshots
  options.max_to_keep = 3;
  auto hook = AsyncCheckpointSaverHook::Create(options, &registry_, {&listener});
  ASSERT_TRUE(hook.ok());
  constexpr int64_t kSteps = 50;
  ASSERT_TRUE(Train(hook->get(), kSteps).ok());
  const auto after = listener.after();
  ASSERT_EQ(after.size(), size_t(kSteps + 1));
  for (size_t i = 1; i < after.size(); ++i) EXPECT_LT(after[i - 1], after[i]);
  const auto latest = listener.latest_at_save();
  for (int64_t step = 0; step <= kSteps; ++step) EXPECT_EQ(latest[size_t(step)], Path(step));
  EXPECT_EQ(Entries(), (std::vector<std::string>{"checkpoint", "checkpoint.lock", "model.ckpt-48",
                                                 "model.ckpt-49", "model.ckpt-50"}));
  for (int64_t step = 48; step <= kSteps; ++step) ExpectHoldsStep(Path(step), step);
}

TEST_F(AsyncSaverHookTest, SavesAtStartEveryNStepsAndAtEndWhenLastStepUnsaved) {
  RecordingListener listener;
  auto hook = AsyncCheckpointSaverHook::Create(Options(5), &registry_, {&listener});
  ASSERT_TRUE(hook.ok());
  ASSERT_TRUE(Train(hook->get(), 12).ok());
  EXPECT_EQ(listener.begins(), 1);
  EXPECT_EQ(listener.before(), (std::vector<int64_t>{0, 5, 10, 12}));
  EXPECT_EQ(listener.after(), (std::vector<int64_t>{0, 5, 10, 12}));
  EXPECT_EQ(listener.ends(), (std::vector<int64_t>{12}));
  for (int64_t step : {0, 5, 10, 12}) ExpectHoldsStep(Path(step), step);
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, Path(12));
}

TEST_F(AsyncSaverHookTest, OnBusyWaitBlocksTheTrainingThreadAndNeverDropsASave) {
  InstallGate();
  SaverOptions options = Options(1);
  options.staging_bytes = 0;  // one snapshot: a second save must wait for the first's writes
  options.on_busy = OnBusy::kWait;
  // Once the save of step 1 has begun, opens the gate from another thread, noting `opened`
  // first. That save cannot get staging while step 0's writes are held at the gate, so if the
  // training thread blocks in it, step 2 can only run after `opened` was set.
  class Opener : public CheckpointSaverListener {
   public:
    explicit Opener(GatedFileSystem* gate) : gate_(gate) {}
    ~Opener() override {
      if (thread_.joinable()) thread_.join();
    }
    void before_save(int64_t step) override {
      if (step != 1) return;
      thread_ = std::thread([this, gate = gate_] {
        gate->WaitForWaiting(1);
        opened = true;
        gate->Open();
      });
    }
    std::atomic<bool> opened{false};

   private:
    GatedFileSystem* gate_;
    std::thread thread_;
  } opener(gate());
  RecordingListener listener;
  auto hook = AsyncCheckpointSaverHook::Create(options, &registry_, {&opener, &listener});
  ASSERT_TRUE(hook.ok());
  SetState(0);
  auto session =
      SingularMonitoredSession::Create({hook->get()});  // saves step 0; its writes are held
  ASSERT_TRUE(session.ok());
  Status status = (*session)->run_until(4, [&](StepContext& ctx) {
    // Step 1's after_run waited for the gate, so the step after it sees it open.
    if (ctx.step() == 2) {
      EXPECT_TRUE(opener.opened) << "the save of step 1 did not block";
    }
    SetState(ctx.step());
    return Status::OK();
  });
  ASSERT_TRUE(status.ok()) << status.ToString();
  const SaverTotals totals = (*hook)->totals();
  EXPECT_EQ(totals.saves_skipped, 0);
  EXPECT_EQ(totals.saves_committed, 5);
  ASSERT_EQ(totals.saves.size(), 5u);
  EXPECT_GT(totals.saves[1].blocked_seconds, 0);
  EXPECT_GT(totals.blocked_seconds_max, 0);
  for (int64_t step = 0; step <= 4; ++step) ExpectHoldsStep(Path(step), step);
}

TEST_F(AsyncSaverHookTest, OnBusySkipSkipsAndRetriesAtTheNextTrigger) {
  InstallGate();
  SaverOptions options = Options(1);
  options.staging_bytes = 0;
  options.on_busy = OnBusy::kSkip;
  RecordingListener listener;
  auto hook = AsyncCheckpointSaverHook::Create(options, &registry_, {&listener});
  ASSERT_TRUE(hook.ok());
  SetState(0);
  auto session =
      SingularMonitoredSession::Create({hook->get()});  // saves step 0; its writes are held
  ASSERT_TRUE(session.ok());
  gate()->WaitForWaiting(1);
  ASSERT_TRUE((*session)->run(StepFunction()).ok());  // step 1: staging busy, skipped
  ASSERT_TRUE((*session)->run(StepFunction()).ok());  // step 2: still busy, skipped
  EXPECT_EQ((*hook)->totals().saves_skipped, 2);
  EXPECT_EQ(listener.before(), (std::vector<int64_t>{0}));
  gate()->Open();
  ASSERT_TRUE((*hook)->wait_until_saved().ok());
  ASSERT_TRUE((*session)->run(StepFunction()).ok());  // step 3: the next trigger saves
  ASSERT_TRUE((*session)->close().ok());
  EXPECT_EQ(listener.after(), (std::vector<int64_t>{0, 3}));
  const SaverTotals totals = (*hook)->totals();
  EXPECT_EQ(totals.saves_skipped, 2);
  EXPECT_EQ(totals.saves_committed, 2);
  EXPECT_EQ(Entries(), (std::vector<std::string>{"checkpoint", "checkpoint.lock", "model.ckpt-0",
                                                 "model.ckpt-3"}));
  ExpectHoldsStep(Path(0), 0);
  ExpectHoldsStep(Path(3), 3);
}

TEST_F(AsyncSaverHookTest, EndSavesTheLastStepWhenItsSaveWasSkipped) {
  InstallGate();
  SaverOptions options = Options(1);
  options.staging_bytes = 0;
  options.on_busy = OnBusy::kSkip;
  RecordingListener listener;
  auto hook = AsyncCheckpointSaverHook::Create(options, &registry_, {&listener});
  ASSERT_TRUE(hook.ok());
  SetState(0);
  auto session = SingularMonitoredSession::Create({hook->get()});
  ASSERT_TRUE(session.ok());
  gate()->WaitForWaiting(1);
  ASSERT_TRUE((*session)->run(StepFunction()).ok());  // step 1: skipped
  EXPECT_EQ((*hook)->totals().saves_skipped, 1);
  gate()->Open();
  ASSERT_TRUE((*session)->close().ok());  // end(1) must still save step 1
  EXPECT_EQ(listener.after(), (std::vector<int64_t>{0, 1}));
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, Path(1));
  ExpectHoldsStep(Path(1), 1);
}

// One stage of a save that a fault can hit, named after what fails.
struct FaultCase {
  const char* name;
  const char* path_substring;
  io::FaultOp ops;
};

// Names the case in test listings (the default prints the struct's bytes, which change per build).
void PrintTo(const FaultCase& fault, std::ostream* os) { *os << fault.name; }

class AsyncSaverHookFaultTest
    : public AsyncSaverHookTest,
      public ::testing::WithParamInterface<std::tuple<FaultCase, OnError>> {};

TEST_P(AsyncSaverHookFaultTest, FailedSaveReachesListenerAndLoopAndLeavesEarlierCheckpoints) {
  const auto& [fault, on_error] = GetParam();
  auto posix = io::NewPosixFileSystem();
  io::FaultInjectionFileSystem* faulty =
      UseFileSystem(std::make_unique<io::FaultInjectionFileSystem>(posix.get()));
  SaverOptions options = Options(2);
  options.on_error = on_error;
  RecordingListener listener(dir_);
  auto hook = AsyncCheckpointSaverHook::Create(options, &registry_, {&listener});
  ASSERT_TRUE(hook.ok());
  SetState(0);
  auto session = SingularMonitoredSession::Create({hook->get()});
  ASSERT_TRUE(session.ok());
  ASSERT_NE(faulty, nullptr);
  listener.WaitForSaves(1);
  ASSERT_TRUE((*session)->run(StepFunction()).ok());  // step 1
  faulty->fail_ops_matching(fault.path_substring, EIO, fault.ops);
  ASSERT_TRUE((*session)->run(StepFunction()).ok());  // step 2: saved in the background, fails
  listener.WaitForSaves(2);
  faulty->clear_faults();

  const SaveStats failed = listener.stats()[1];
  EXPECT_EQ(failed.step, 2);
  ASSERT_FALSE(failed.status.ok());
  EXPECT_NE(failed.status.message().find(std::strerror(EIO)), std::string::npos)
      << failed.status.ToString();
  EXPECT_NE(failed.status.message().find("model.ckpt-2"), std::string::npos)
      << failed.status.ToString();
  EXPECT_EQ((*hook)->totals().saves_failed, 1);
  EXPECT_EQ((*hook)->totals().saves_committed, 1);
  ExpectNoTemporaries();
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, Path(0));
  ExpectHoldsStep(Path(0), 0);

  // The loop hears of it at the next after_run.
  ASSERT_TRUE((*session)->run(StepFunction()).ok());  // step 3
  if (on_error == OnError::kStop) {
    EXPECT_TRUE((*session)->should_stop());
    Status closed = (*session)->close();
    ASSERT_FALSE(closed.ok());
    EXPECT_NE(closed.message().find("model.ckpt-2"), std::string::npos) << closed.ToString();
    EXPECT_EQ(listener.ends(), (std::vector<int64_t>{3}));
  } else {
    EXPECT_FALSE((*session)->should_stop());
    ASSERT_TRUE((*session)->run(StepFunction()).ok());  // step 4: saved
    ASSERT_TRUE((*session)->close().ok());
    const auto stats = listener.stats();
    ASSERT_EQ(stats.size(), 3u);
    EXPECT_EQ(stats[2].step, 4);
    EXPECT_TRUE(stats[2].status.ok()) << stats[2].status.ToString();
    latest = LatestCheckpoint(dir_);
    ASSERT_TRUE(latest.ok());
    EXPECT_EQ(*latest, Path(4));
    ExpectHoldsStep(Path(4), 4);
    EXPECT_EQ((*hook)->totals().saves_committed, 2);
  }
  EXPECT_EQ((*hook)->totals().saves_failed, 1);
  ExpectHoldsStep(Path(0), 0);
  ExpectNoTemporaries();
}

INSTANTIATE_TEST_SUITE_P(
    EveryStage, AsyncSaverHookFaultTest,
    ::testing::Combine(
        ::testing::Values(FaultCase{"DataFileWrite", "/data-", io::FaultOp::kWrite},
                          FaultCase{"DataFileOpen", "/data-", io::FaultOp::kOpen},
                          FaultCase{"DataFileSync", "/data-", io::FaultOp::kSync},
                          FaultCase{"TemporaryDirCreate", "model.ckpt-2.tmp",
                                    io::FaultOp::kCreateDir},
                          FaultCase{"IndexWrite", "/index", io::FaultOp::kWrite},
                          FaultCase{"IndexSync", "/index", io::FaultOp::kSync},
                          FaultCase{"CommitSyncDir", "model.ckpt-2.tmp", io::FaultOp::kSyncDir},
                          FaultCase{"CommitRename", "model.ckpt-2.tmp", io::FaultOp::kRename},
                          FaultCase{"StateFileWrite", "checkpoint.tmp", io::FaultOp::kWrite},
                          FaultCase{"StateFileRename", "checkpoint.tmp", io::FaultOp::kRename}),
        ::testing::Values(OnError::kStop, OnError::kContinue)),
    [](const ::testing::TestParamInfo<std::tuple<FaultCase, OnError>>& info) {
      return std::string(std::get<0>(info.param).name) +
             (std::get<1>(info.param) == OnError::kStop ? "Stops" : "Continues");
    });

TEST_F(AsyncSaverHookTest, ExceptionFromTheFileSystemBecomesTheSaveFailure) {
  ThrowingFileSystem* thrower =
      UseFileSystem(std::make_unique<ThrowingFileSystem>(io::NewPosixFileSystem()));
  SaverOptions options = Options(1);
  options.on_error = OnError::kContinue;
  RecordingListener listener;
  auto hook = AsyncCheckpointSaverHook::Create(options, &registry_, {&listener});
  ASSERT_TRUE(hook.ok());
  SetState(0);
  auto session = SingularMonitoredSession::Create({hook->get()});
  ASSERT_TRUE(session.ok());
  listener.WaitForSaves(1);
  thrower->armed = true;
  ASSERT_TRUE((*session)->run(StepFunction()).ok());  // step 1
  listener.WaitForSaves(2);
  thrower->armed = false;
  ASSERT_TRUE((*session)->run(StepFunction()).ok());  // step 2
  ASSERT_TRUE((*session)->close().ok());
  const auto stats = listener.stats();
  ASSERT_EQ(stats.size(), 3u);
  EXPECT_TRUE(stats[0].status.ok());
  EXPECT_EQ(stats[1].status.code(), StatusCode::kInternal);
  EXPECT_NE(stats[1].status.message().find("write path exploded"), std::string::npos)
      << stats[1].status.ToString();
  EXPECT_TRUE(stats[2].status.ok());
  EXPECT_EQ(Entries(), (std::vector<std::string>{"checkpoint", "checkpoint.lock", "model.ckpt-0",
                                                 "model.ckpt-2"}));
  ExpectHoldsStep(Path(2), 2);
}

TEST_F(AsyncSaverHookTest, EndStillReportsAFailureThatWaitUntilSavedReturned) {
  ThrowingFileSystem* thrower =
      UseFileSystem(std::make_unique<ThrowingFileSystem>(io::NewPosixFileSystem()));
  auto hook = AsyncCheckpointSaverHook::Create(Options(1), &registry_, {});
  ASSERT_TRUE(hook.ok());
  SetState(0);
  ASSERT_TRUE((*hook)->begin().ok());
  ASSERT_TRUE((*hook)->after_create_session(0).ok());
  ASSERT_TRUE((*hook)->wait_until_saved().ok());
  thrower->armed = true;
  SetState(1);
  RunContext context(1);
  ASSERT_TRUE((*hook)->after_run(context, RunValues{}).ok());
  const Status waited = (*hook)->wait_until_saved();
  EXPECT_EQ(waited.code(), StatusCode::kInternal) << waited.ToString();
  // A caller that waited and went on must still see the job's end fail.
  const Status ended = (*hook)->end(1);
  EXPECT_EQ(ended.code(), StatusCode::kInternal) << ended.ToString();
  EXPECT_NE(ended.message().find("write path exploded"), std::string::npos) << ended.ToString();
  EXPECT_EQ(Entries(), (std::vector<std::string>{"checkpoint", "checkpoint.lock", "model.ckpt-0"}));
}

TEST_F(AsyncSaverHookTest, ExceptionFromADeviceCopyBecomesTheSaveFailure) {
  auto device = std::make_shared<FlakyDevice>();
  TensorRegistry registry;
  ASSERT_NO_FATAL_FAILURE(AddTensors(&registry, device));
  SaverOptions options = Options(1);  // on_error = kStop
  RecordingListener listener;
  auto hook = AsyncCheckpointSaverHook::Create(options, &registry, {&listener});
  ASSERT_TRUE(hook.ok());
  SetState(0);
  auto session = SingularMonitoredSession::Create({hook->get()});
  ASSERT_TRUE(session.ok());
  device->mode = FlakyDevice::Mode::kThrow;
  ASSERT_TRUE((*session)->run(StepFunction()).ok());  // step 1: the copy throws
  device->mode = FlakyDevice::Mode::kOk;
  listener.WaitForSaves(2);
  ASSERT_TRUE((*session)->run(StepFunction()).ok());  // step 2: the loop hears of it
  EXPECT_TRUE((*session)->should_stop());
  Status closed = (*session)->close();
  ASSERT_FALSE(closed.ok());
  EXPECT_NE(closed.message().find("copy engine hung"), std::string::npos) << closed.ToString();
  EXPECT_EQ(listener.after(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ((*hook)->totals().saves_failed, 1);
  EXPECT_EQ(Entries(), (std::vector<std::string>{"checkpoint", "checkpoint.lock", "model.ckpt-0",
                                                 "model.ckpt-2"}));
  ExpectHoldsStep(Path(0), 0);
  ExpectHoldsStep(Path(2), 2);
}

TEST_F(AsyncSaverHookTest, EndWaitsForEveryPendingSaveAndLeavesThemDurable) {
  // Slow writes on the engine's write path keep many saves pending when the loop ends.
  auto* slow = UseFileSystem(
      std::make_unique<SlowFileSystem>(io::NewPosixFileSystem(), std::chrono::milliseconds(1)));
  SaverOptions options = Options(1);
  options.staging_bytes = 10 * 80 * kPage;  // room for every save: none waits
  RecordingListener listener;
  auto hook = AsyncCheckpointSaverHook::Create(options, &registry_, {&listener});
  ASSERT_TRUE(hook.ok());
  ASSERT_TRUE(Train(hook->get(), 8).ok());  // returns after end()
  ASSERT_GT(slow->slowed_writes(), 0u) << "the saves' writes did not take the slowed path";
  EXPECT_EQ(listener.after().size(), 9u);
  EXPECT_EQ((*hook)->totals().saves_committed, 9);
  auto state = GetCheckpointState(dir_);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->model_checkpoint_path, "model.ckpt-8");
  EXPECT_EQ(state->all_model_checkpoint_paths.size(), 9u);
  for (int64_t step = 0; step <= 8; ++step) ExpectHoldsStep(Path(step), step);
  ExpectNoTemporaries();
}

TEST_F(AsyncSaverHookTest, DestroyingTheHookWaitsForSavesInFlight) {
  RecordingListener listener;
  {
    auto hook = AsyncCheckpointSaverHook::Create(Options(1), &registry_, {&listener});
    ASSERT_TRUE(hook.ok());
    ASSERT_TRUE((*hook)->begin().ok());
    SetState(0);
    ASSERT_TRUE((*hook)->after_create_session(0).ok());
    for (int64_t step = 1; step <= 3; ++step) {
      SetState(step);
      RunContext context(step);
      ASSERT_TRUE((*hook)->after_run(context, RunValues{}).ok());
    }
  }  // no end(): the destructor must still finish every save
  EXPECT_EQ(listener.after(), (std::vector<int64_t>{0, 1, 2, 3}));
  ExpectHoldsStep(Path(3), 3);
}

TEST_F(AsyncSaverHookTest, ListenerReturningTrueStopsTheLoop) {
  RecordingListener listener;
  listener.StopAfter(3);
  auto hook = AsyncCheckpointSaverHook::Create(Options(3), &registry_, {&listener});
  ASSERT_TRUE(hook.ok());
  SetState(0);
  auto session = SingularMonitoredSession::Create({hook->get()});
  ASSERT_TRUE(session.ok());
  auto* raw_hook = hook->get();
  // Step 4 waits until the save of step 3 is done, so its after_run must see the request.
  Status status = (*session)->run_until(100, [&](StepContext& ctx) {
    SetState(ctx.step());
    if (ctx.step() == 4) return raw_hook->wait_until_saved();
    return Status::OK();
  });
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ((*session)->global_step(), 4);
  EXPECT_EQ(listener.after(), (std::vector<int64_t>{0, 3, 4}));  // end() saves step 4
  EXPECT_EQ(listener.ends(), (std::vector<int64_t>{4}));
}

TEST_F(AsyncSaverHookTest, ListenerReturningTrueForTheInitialSaveDoesNotStopTheLoop) {
  RecordingListener listener;
  listener.StopAfter(0);
  auto hook = AsyncCheckpointSaverHook::Create(Options(100), &registry_, {&listener});
  ASSERT_TRUE(hook.ok());
  SetState(0);
  auto session = SingularMonitoredSession::Create({hook->get()});
  ASSERT_TRUE(session.ok());
  auto* raw_hook = hook->get();
  // Step 1 waits until the initial save is done, so its after_run would see a stop request.
  Status status = (*session)->run_until(3, [&](StepContext& ctx) {
    SetState(ctx.step());
    if (ctx.step() == 1) return raw_hook->wait_until_saved();
    return Status::OK();
  });
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ((*session)->global_step(), 3);
  EXPECT_EQ(listener.after(), (std::vector<int64_t>{0, 3}));  // end() saves step 3
}

// Starts at step 0, and restores the state of `restored` after a pre-emption.
class SetStateCreator final : public SessionCreator {
 public:
  SetStateCreator(std::function<void(int64_t)> set_state, int64_t restored)
      : set_state_(std::move(set_state)), restored_(restored) {}
  Result<int64_t> create_session() override {
    const int64_t step = calls_++ == 0 ? 0 : restored_;
    set_state_(step);
    return step;
  }

 private:
  std::function<void(int64_t)> set_state_;
  int64_t restored_;
  int calls_ = 0;
};

TEST_F(AsyncSaverHookTest, ListenerReturningTrueForARecreatedSessionsSaveDoesNotStopTheLoop) {
  RecordingListener listener;
  listener.StopAfter(2);
  auto hook = AsyncCheckpointSaverHook::Create(Options(100), &registry_, {&listener});
  ASSERT_TRUE(hook.ok());
  SetStateCreator creator([this](int64_t step) { SetState(step); }, /*restored=*/2);
  auto session = MonitoredSession::Create({hook->get()}, &creator);
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  auto* raw_hook = hook->get();
  bool preempted = false;
  Status status = (*session)->run_until(5, [&](StepContext& ctx) {
    SetState(ctx.step());
    if (ctx.step() == 4 && !preempted) {
      preempted = true;
      return Status::Unavailable("pre-empted");
    }
    // The first step after the recovery waits for the save of step 2 to be done.
    if (preempted && ctx.step() == 3) return raw_hook->wait_until_saved();
    return Status::OK();
  });
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ((*session)->recoveries(), 1);
  EXPECT_EQ((*session)->global_step(), 5);
  EXPECT_EQ(listener.after(), (std::vector<int64_t>{0, 2, 5}));
  ExpectHoldsStep(Path(2), 2);
  ExpectHoldsStep(Path(5), 5);
}

TEST_F(AsyncSaverHookTest, EachSaveReportsCompressionStats) {
  std::fill(weights_.begin(), weights_.end(), 1.0f);  // compresses well
  SaverOptions options = Options(100);
  options.compression.kind = CompressionKind::kShuffleZstd;
  options.compression.level = 7;
  RecordingListener listener;
  auto hook = AsyncCheckpointSaverHook::Create(options, &registry_, {&listener});
  ASSERT_TRUE(hook.ok());
  ASSERT_TRUE((*hook)->begin().ok());
  ASSERT_TRUE((*hook)->after_create_session(0).ok());
  ASSERT_TRUE((*hook)->end(0).ok());
  const auto stats = listener.stats();
  ASSERT_EQ(stats.size(), 1u);
  uint64_t chunks = 0;
  for (const auto& [codec, count] : stats[0].chunks_by_codec) chunks += count;
  EXPECT_EQ(chunks, kWeightRows * kWeightColumns * sizeof(float) / kPage + 1);  // weights, bias
  EXPECT_GT(stats[0].chunks_by_codec.count("shuffle+zstd"), 0u);
  // A few chunks of staging never back the encoders up: the level stays where it was set.
  EXPECT_EQ(stats[0].final_level, 7);
  EXPECT_EQ(stats[0].bytes_raw, kWeightRows * kWeightColumns * sizeof(float) + 7 * 8);
  EXPECT_LT(stats[0].bytes_stored, stats[0].bytes_raw);
  const SaverTotals totals = (*hook)->totals();
  ASSERT_EQ(totals.saves.size(), 1u);
  EXPECT_EQ(totals.saves[0].chunks_by_codec, stats[0].chunks_by_codec);
  EXPECT_EQ(totals.bytes_stored, stats[0].bytes_stored);
}

// One tensor of every dtype, filled from (dtype, step); bool holds 0 and 1 only.
class AllDTypesState {
 public:
  // Each tensor holds 6150 to 65600 bytes (3 to 6 rows of 1- to 8-byte elements): several chunks
  // of a few KiB.
  static constexpr int64_t kColumns = 2050;

  AllDTypesState() {
    int index = 0;
    for (DType dtype : kAllDTypes) {
      const std::vector<int64_t> shape = {3 + index % 4, kColumns};
      buffers_.emplace_back(size_t(shape[0] * shape[1]) * DTypeSize(dtype));
      shapes_.push_back(shape);
      ++index;
    }
  }
  static std::vector<uint8_t> Bytes(DType dtype, size_t n, int64_t step) {
    std::mt19937_64 random(uint64_t(step) * 131 + uint64_t(dtype));
    std::vector<uint8_t> bytes(n);
    for (size_t i = 0; i < n; ++i) {
      // Half noise, half runs: some chunks compress, some are stored raw.
      const uint8_t value = (i / 256) % 2 ? uint8_t(random()) : uint8_t(i / 64 + step);
      bytes[i] = dtype == DType::kBool ? value & 1 : value;
    }
    return bytes;
  }
  void Set(int64_t step) {
    // In place: the registry points at these buffers.
    for (size_t t = 0; t < buffers_.size(); ++t) {
      const std::vector<uint8_t> bytes = Bytes(kAllDTypes[t], buffers_[t].size(), step);
      std::copy(bytes.begin(), bytes.end(), buffers_[t].begin());
    }
  }
  // Runs steps 1..steps under `hook`, from the state at step 0; every step sets its own state.
  Status Train(SessionRunHook* hook, int64_t steps) {
    Set(0);
    auto session = SingularMonitoredSession::Create({hook});
    if (!session.ok()) return session.status();
    return (*session)->run_until(steps, [this](StepContext& ctx) {
      Set(ctx.step());
      return Status::OK();
    });
  }
  TensorRegistry Registry() {
    TensorRegistry registry;
    for (size_t t = 0; t < buffers_.size(); ++t) {
      const std::string name = "t/" + std::string(DTypeName(kAllDTypes[t]));
      EXPECT_TRUE(registry
                      .add({name,
                            kAllDTypes[t],
                            shapes_[t],
                            buffers_[t].data(),
                            buffers_[t].size(),
                            nullptr,
                            {},
                            {}})
                      .ok());
    }
    return registry;
  }
  // Restores checkpoint `path` into fresh buffers and compares them with the state at `step`.
  static void ExpectRestoresStep(const std::string& path, int64_t step, ReaderOptions options) {
    SCOPED_TRACE(path);
    AllDTypesState restored;
    TensorRegistry registry = restored.Registry();
    auto reader = CheckpointReader::Open(path, options);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    Status status = (*reader)->restore(registry);
    ASSERT_TRUE(status.ok()) << status.ToString();
    for (size_t t = 0; t < restored.buffers_.size(); ++t) {
      EXPECT_EQ(restored.buffers_[t], Bytes(kAllDTypes[t], restored.buffers_[t].size(), step))
          << DTypeName(kAllDTypes[t]);
    }
    EXPECT_TRUE((*reader)->verify().problems.empty());
  }

 private:
  std::vector<std::vector<uint8_t>> buffers_;
  std::vector<std::vector<int64_t>> shapes_;
};

TEST_F(AsyncSaverHookTest, RestoresEveryDTypeAfterASaveThroughIoUring) {
  std::string why;
  if (io::NewUringFileSystem(io::IoOptions{}, &why) == nullptr) {
    GTEST_SKIP() << "io_uring unavailable: " << why;
  }
  std::string reason;
  auto uring = io::NewUringFileSystem(io::IoOptions{}, &reason);
  ASSERT_NE(uring, nullptr) << reason;
  const std::string used = UseFileSystem(std::move(uring))->name();
  AllDTypesState state;
  TensorRegistry registry = state.Registry();
  SaverOptions options = Options(1);
  options.chunk_bytes = kPage + 100;  // 2 to 16 chunks per tensor, not a multiple of the page
  auto hook = AsyncCheckpointSaverHook::Create(options, &registry);
  ASSERT_TRUE(hook.ok());
  Status status = state.Train(hook->get(), 3);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(used, "io_uring");
  for (int64_t step = 0; step <= 3; ++step) {
    AllDTypesState::ExpectRestoresStep(Path(step), step, ReaderOptions{});
  }
}

TEST_F(AsyncSaverHookTest, ForcedPosixBackendRoundTrips) {
  AllDTypesState state;
  TensorRegistry registry = state.Registry();
  SaverOptions options = Options(2);
  options.force_posix_io = true;
  options.chunk_bytes = kPage + 1000;
  auto hook = AsyncCheckpointSaverHook::Create(options, &registry);
  ASSERT_TRUE(hook.ok());
  ASSERT_TRUE(state.Train(hook->get(), 3).ok());
  for (int64_t step : {0, 2, 3}) {
    AllDTypesState::ExpectRestoresStep(Path(step), step, ReaderOptions{.force_posix_io = true});
  }
}

// True when files in `dir` can be opened with O_DIRECT.
bool DirectIoWorks(const std::string& dir) {
  const std::string path = dir + "/probe-direct";
  const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_DIRECT, 0600);
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(path.c_str());
  return true;
}

class AsyncSaverHookIoModeTest : public AsyncSaverHookTest,
                                 public ::testing::WithParamInterface<
                                     std::tuple<bool /*direct*/, CompressionKind, bool /*posix*/>> {
};

TEST_P(AsyncSaverHookIoModeTest, DirectAndBufferedWritesRoundTrip) {
  const auto [direct, compression, posix] = GetParam();
  if (direct && !DirectIoWorks(dir_)) GTEST_SKIP() << dir_ << " refuses O_DIRECT";
  AllDTypesState state;
  TensorRegistry registry = state.Registry();
  SaverOptions options = Options(1);
  options.use_o_direct = direct;
  options.force_posix_io = posix;
  options.compression.kind = compression;
  options.chunk_bytes = kPage + 1000;  // not a multiple of the page: O_DIRECT pads and trims
  options.num_data_files = 3;
  options.staging_bytes = 6 * 2 * kPage;  // six chunks of two staging pages each
  auto hook = AsyncCheckpointSaverHook::Create(options, &registry);
  ASSERT_TRUE(hook.ok());
  ASSERT_TRUE(state.Train(hook->get(), 4).ok());
  for (int64_t step = 0; step <= 4; ++step) {
    AllDTypesState::ExpectRestoresStep(Path(step), step, ReaderOptions{});
    // Buffered data files hold exactly the stored chunks. O_DIRECT ones start every write on a
    // page, but the padding after the last chunk of a file is trimmed.
    auto reader = CheckpointReader::Open(Path(step));
    ASSERT_TRUE(reader.ok());
    uint64_t stored = 0;
    uint64_t chunks = 0;
    for (const auto& info : (*reader)->tensors()) {
      stored += info.stored_bytes;
      chunks += info.num_chunks;
    }
    uint64_t on_disk = 0;
    for (const auto& entry : fs::directory_iterator(Path(step))) {
      if (entry.path().filename().string().rfind("data-", 0) == 0) on_disk += entry.file_size();
    }
    if (direct) {
      // Chunks this small share packed writes (format::DataFilePlacer): only the packs start
      // on a page, so the padding between them is all there is beyond the stored bytes.
      EXPECT_GE(on_disk, stored) << Path(step);
      EXPECT_LE(on_disk, stored + (chunks - options.num_data_files) * (kPage - 1)) << Path(step);
    } else {
      EXPECT_EQ(on_disk, stored) << Path(step);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, AsyncSaverHookIoModeTest,
    ::testing::Combine(::testing::Bool(),
                       ::testing::Values(CompressionKind::kNone, CompressionKind::kShuffleZstd),
                       ::testing::Bool()),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) ? "Direct" : "Buffered") +
             (std::get<1>(info.param) == CompressionKind::kNone ? "Raw" : "Compressed") +
             (std::get<2>(info.param) ? "Posix" : "DefaultBackend");
    });

TEST_F(AsyncSaverHookTest, RetentionKeepsTheNewestWhileSavesOverlap) {
  SaverOptions options = Options(1);
  options.max_to_keep = 2;
  auto hook = AsyncCheckpointSaverHook::Create(options, &registry_);
  ASSERT_TRUE(hook.ok());
  ASSERT_TRUE(Train(hook->get(), 6).ok());
  EXPECT_EQ(Entries(), (std::vector<std::string>{"checkpoint", "checkpoint.lock", "model.ckpt-5",
                                                 "model.ckpt-6"}));
  auto state = GetCheckpointState(dir_);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->all_model_checkpoint_paths,
            (std::vector<std::string>{"model.ckpt-5", "model.ckpt-6"}));
}

TEST_F(AsyncSaverHookTest, InvalidOptionsAreRejected) {
  SaverOptions options = Options(5);
  options.save_secs = 3;
  EXPECT_EQ(AsyncCheckpointSaverHook::Create(options, &registry_).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(AsyncCheckpointSaverHook::Create(Options(5), nullptr).ok());
  // A budget smaller than one chunk is caught when the engine starts, with the option named.
  SaverOptions tight = Options(5);
  tight.chunk_bytes = 3 * kPage;
  tight.staging_bytes = kPage;
  auto hook = AsyncCheckpointSaverHook::Create(tight, &registry_);
  ASSERT_TRUE(hook.ok());
  Status begun = (*hook)->begin();
  ASSERT_FALSE(begun.ok());
  EXPECT_NE(begun.message().find("staging_bytes"), std::string::npos) << begun.ToString();
}

}  // namespace
}  // namespace asyncckpt
