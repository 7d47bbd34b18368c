// Disk full mid-training (issue 8): a job with the asynchronous model saver and the input
// pipeline's hook, both with on_error = continue, under a MonitoredSession that resumes from the
// newest model/input pair. The disk fills up for a window of saves (every write fails with
// ENOSPC after half its bytes), then single saves of one side fail. Training goes on through
// all of it; each failure is counted and reported; the first save after space is back commits;
// a step whose model or input checkpoint failed is never a resume point; and resuming from the
// directory, mid-job or at its end, ends bit-exactly where a straight run does.

#include <errno.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/session.h"
#include "asyncckpt/session_creator.h"
#include "asyncckpt/state.h"
#include "io/fault_injection_file_system.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kSaveSteps = 3;
constexpr size_t kBatchRecords = 4;
constexpr uint32_t kRecordBytes = 32;

// The steps of the model saver's failed saves, as its listener heard of them.
class FailureListener final : public CheckpointSaverListener {
 public:
  bool after_save(int64_t step, const SaveStats& stats) override {
    std::lock_guard lock(mu_);
    if (!stats.status.ok()) failed_steps_.push_back(step);
    return false;
  }
  std::vector<int64_t> failed_steps() const {
    std::lock_guard lock(mu_);
    return failed_steps_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<int64_t> failed_steps_;
};

// What one job ended with.
struct JobResult {
  Status status;
  int64_t last_step = 0;
  std::string restored_from;  // the model checkpoint the first session restored
  std::vector<float> weights;
  SaverTotals model_totals;
  int64_t input_committed = 0;
  int64_t input_failed = 0;
  std::vector<int64_t> listener_failed_steps;
};

class DiskFullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/disk_full_test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    root_ = pattern;
    dataset_ = root_ + "/dataset.bin";
    ASSERT_TRUE(WriteRecordDataset(dataset_, 256, kRecordBytes, 7).ok());
    posix_ = io::NewPosixFileSystem();
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }

  // Runs one job in `dir` up to `last_step`: it resumes from the newest pair there, if any.
  // `before_step(step)` runs at the start of each step's function, with both hooks.
  JobResult RunJob(const std::string& dir, io::FileSystem* file_system, int64_t last_step,
                   const std::function<void(int64_t, AsyncCheckpointSaverHook&,
                                            CheckpointInputPipelineHook&)>& before_step = {}) {
    JobResult result;
    std::vector<float> weights(2048, 0.0f);
    int64_t step_value = 0;
    TensorRegistry registry;
    EXPECT_TRUE(registry
                    .add({"weights",
                          DType::kF32,
                          {static_cast<int64_t>(weights.size())},
                          weights.data(),
                          weights.size() * sizeof(float),
                          nullptr,
                          {},
                          {}})
                    .ok());
    EXPECT_TRUE(
        registry.add({"step", DType::kI64, {1}, &step_value, sizeof(step_value), nullptr, {}, {}})
            .ok());

    RecordDatasetOptions dataset;
    dataset.path = dataset_;
    dataset.shuffle_buffer = 16;
    dataset.prefetch = 4;
    dataset.seed = 3;
    auto input = RecordDatasetIterator::Open(dataset);
    EXPECT_TRUE(input.ok()) << input.status().ToString();
    if (!input.ok()) return result;

    SaverOptions saver;
    saver.checkpoint_dir = dir;
    saver.save_steps = kSaveSteps;
    saver.max_to_keep = 2;
    saver.paired_input_basename = "input.ckpt";
    saver.on_error = OnError::kContinue;
    saver.chunk_bytes = 4096;
    saver.background_threads = 2;
    saver.file_system = file_system;
    FailureListener listener;
    auto model_hook = AsyncCheckpointSaverHook::Create(saver, &registry, {&listener});
    EXPECT_TRUE(model_hook.ok()) << model_hook.status().ToString();

    InputPipelineOptions input_options;
    input_options.saver.checkpoint_dir = dir;
    input_options.saver.save_steps = kSaveSteps;
    input_options.saver.max_to_keep = 2;
    input_options.saver.on_error = OnError::kContinue;
    input_options.saver.chunk_bytes = 4096;
    input_options.saver.file_system = file_system;
    auto input_hook = CheckpointInputPipelineHook::Create(input_options, input->get());
    EXPECT_TRUE(input_hook.ok()) << input_hook.status().ToString();

    CheckpointSessionCreatorOptions creator_options;
    creator_options.checkpoint_dir = dir;
    creator_options.input_basename = "input.ckpt";
    creator_options.file_system = file_system;
    creator_options.init_fn = [&] {
      std::fill(weights.begin(), weights.end(), 0.0f);
      step_value = 0;
      return Status::OK();
    };
    auto creator = CheckpointSessionCreator::Create(creator_options, &registry);
    EXPECT_TRUE(creator.ok()) << creator.status().ToString();
    if (!model_hook.ok() || !input_hook.ok() || !creator.ok()) return result;

    auto session = MonitoredSession::Create({model_hook->get(), input_hook->get()}, creator->get());
    if (!session.ok()) {
      result.status = session.status();
      return result;
    }
    result.restored_from = (*creator)->restored_from();
    // Each step's update depends on its batch: a record replayed or skipped on resume shows in
    // the weights.
    auto step_fn = [&](StepContext& context) -> Status {
      if (before_step) before_step(context.step(), **model_hook, **input_hook);
      std::vector<uint8_t> batch;
      Status status = (*input)->next_batch(kBatchRecords, &batch);
      if (!status.ok()) return status;
      for (size_t i = 0; i < weights.size(); ++i) {
        weights[i] = weights[i] * 0.75f + static_cast<float>(batch[i % batch.size()]) / 256.0f;
      }
      step_value = context.step();
      return Status::OK();
    };
    result.status = (*session)->run_until(last_step, step_fn);
    result.last_step = (*session)->global_step();
    result.weights = weights;
    result.model_totals = (*model_hook)->totals();
    result.input_committed = (*input_hook)->saves_committed();
    result.input_failed = (*input_hook)->saves_failed();
    result.listener_failed_steps = listener.failed_steps();
    return result;
  }

  std::vector<int64_t> Steps(const std::string& dir, const std::string& basename,
                             const std::string& state_file) {
    auto steps = CommittedCheckpointSteps(dir, basename, state_file, posix_.get());
    EXPECT_TRUE(steps.ok()) << steps.status().ToString();
    return steps.ok() ? *steps : std::vector<int64_t>{};
  }
  std::vector<int64_t> ModelSteps(const std::string& dir) {
    return Steps(dir, "model.ckpt", kCheckpointStateFileName);
  }
  std::vector<int64_t> InputSteps(const std::string& dir) {
    return Steps(dir, "input.ckpt", kInputStateFileName);
  }
  std::optional<int64_t> NewestPair(const std::string& dir) {
    auto step = NewestCompleteStep(dir, "model.ckpt", "input.ckpt", posix_.get());
    EXPECT_TRUE(step.ok()) << step.status().ToString();
    return step.ok() ? *step : std::nullopt;
  }

  std::string root_;
  std::string dataset_;
  std::unique_ptr<io::FileSystem> posix_;
};

bool Contains(const std::vector<int64_t>& steps, int64_t step) {
  return std::find(steps.begin(), steps.end(), step) != steps.end();
}

// Copies `dir` to `image` while retention's background remover may be deleting a checkpoint it
// renamed (".deleting-"), which wait_until_saved does not wait for: a file it removes mid-copy
// fails the copy, so the copy starts again; a crash at any of those moments leaves such a copy.
void CopyBesideRetentionsRemovals(const std::string& dir, const std::string& image) {
  for (int attempt = 1;; ++attempt) {
    std::error_code ec;
    fs::remove_all(image, ec);
    fs::copy(dir, image, fs::copy_options::recursive, ec);
    if (!ec) return;
    ASSERT_LT(attempt, 100) << "copying " << dir << ": " << ec.message();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

TEST_F(DiskFullTest, TrainingGoesOnCountsEachFailureAndResumesBitExactlyFromWholePairs) {
  // The straight run: no faults, no resume.
  const std::string straight_dir = root_ + "/straight";
  const JobResult straight30 = RunJob(straight_dir + "30", posix_.get(), 30);
  ASSERT_TRUE(straight30.status.ok()) << straight30.status.ToString();
  const JobResult straight40 = RunJob(straight_dir + "40", posix_.get(), 40);
  ASSERT_TRUE(straight40.status.ok()) << straight40.status.ToString();
  ASSERT_NE(straight30.weights, straight40.weights);

  const std::string dir = root_ + "/job";
  const std::string crash_image = root_ + "/crash-image";
  io::FaultInjectionFileSystem faults(posix_.get());
  auto drain = [](AsyncCheckpointSaverHook& model, CheckpointInputPipelineHook& input) {
    // kContinue: both answer OK, the failures are counted instead.
    EXPECT_TRUE(model.wait_until_saved().ok());
    EXPECT_TRUE(input.wait_until_saved().ok());
  };
  const JobResult job = RunJob(
      dir, &faults, 30,
      [&](int64_t step, AsyncCheckpointSaverHook& model, CheckpointInputPipelineHook& input) {
        if (step == 4) {
          drain(model, input);
          // The disk fills up: every write stops half way (the saves of step 6 on both sides).
          faults.fail_ops_matching("", ENOSPC, io::FaultOp::kWrite, io::FaultMode::kShortTransfer);
        } else if (step == 8) {
          drain(model, input);
          faults.clear_faults();  // space is back before the saves of step 9
        } else if (step == 10) {
          drain(model, input);
          EXPECT_TRUE(Contains(ModelSteps(dir), 9)) << "the first model save after space is back";
          EXPECT_TRUE(Contains(InputSteps(dir), 9)) << "the first input save after space is back";
          // Then one side at a time: the model's save of step 12, the input's of step 15.
          faults.fail_ops_matching("model.ckpt-12", ENOSPC, io::FaultOp::kWrite,
                                   io::FaultMode::kShortTransfer);
          faults.fail_ops_matching("input.ckpt-15", ENOSPC, io::FaultOp::kWrite,
                                   io::FaultMode::kShortTransfer);
        } else if (step == 17) {
          drain(model, input);
          faults.clear_faults();
          // Neither half-pair counts: the newest step with both is 9.
          const std::vector<int64_t> model_steps = ModelSteps(dir);
          const std::vector<int64_t> input_steps = InputSteps(dir);
          EXPECT_FALSE(Contains(model_steps, 6));
          EXPECT_FALSE(Contains(input_steps, 6));
          EXPECT_FALSE(Contains(model_steps, 12));
          EXPECT_TRUE(Contains(input_steps, 12));
          EXPECT_TRUE(Contains(model_steps, 15));
          EXPECT_FALSE(Contains(input_steps, 15));
          EXPECT_EQ(NewestPair(dir), std::optional<int64_t>(9));
          // What a crash right now would leave (every save is durable): resumed below.
          CopyBesideRetentionsRemovals(dir, crash_image);
        }
      });

  // Training went on to the end, and every failure was counted and reported.
  ASSERT_TRUE(job.status.ok()) << job.status.ToString();
  EXPECT_EQ(job.last_step, 30);
  EXPECT_EQ(job.model_totals.saves_failed, 2);     // steps 6 and 12
  EXPECT_EQ(job.model_totals.saves_committed, 9);  // 0 3 9 15 18 21 24 27 30
  EXPECT_EQ(job.listener_failed_steps, (std::vector<int64_t>{6, 12}));
  EXPECT_EQ(job.input_failed, 2);     // steps 6 and 15
  EXPECT_EQ(job.input_committed, 9);  // 0 3 9 12 18 21 24 27 30
  EXPECT_EQ(job.weights, straight30.weights) << "the faults changed the training itself";
  EXPECT_EQ(NewestPair(dir), std::optional<int64_t>(30));

  // A resume from the crash image restores the newest whole pair, step 9, and ends where the
  // straight run does.
  const JobResult from_crash = RunJob(crash_image, posix_.get(), 30);
  ASSERT_TRUE(from_crash.status.ok()) << from_crash.status.ToString();
  EXPECT_EQ(from_crash.restored_from, crash_image + "/model.ckpt-9");
  EXPECT_EQ(from_crash.weights, straight30.weights);

  // A resume from the end of the job goes on to step 40 as the straight run does.
  const JobResult resumed = RunJob(dir, posix_.get(), 40);
  ASSERT_TRUE(resumed.status.ok()) << resumed.status.ToString();
  EXPECT_EQ(resumed.restored_from, dir + "/model.ckpt-30");
  EXPECT_EQ(resumed.weights, straight40.weights);
  EXPECT_EQ(resumed.model_totals.saves_failed, 0);
}

}  // namespace
}  // namespace asyncckpt
