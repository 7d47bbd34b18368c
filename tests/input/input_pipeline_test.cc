// CheckpointInputPipelineHook with SingularMonitoredSession: the initial save, the schedule, the
// end save; the model's files left alone; exact resume; external-state policies; per-worker
// checkpoints; states spanning many chunks; NewestCompleteStep; option checks; failures.

#include "asyncckpt/input_pipeline.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/session.h"
#include "asyncckpt/state.h"
#include "io/fault_injection_file_system.h"
#include "src/format/writer.h"
#include "src/state/checkpoint_state.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"
#include "tests/io/slow_file_system.h"
#include "tests/support/checkpoint_files.h"
#include "tests/support/files.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using Batch = std::vector<uint8_t>;

using testing_support::ReadFile;
using testing_support::WriteFile;

std::set<std::string> ListDir(const std::string& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

bool IsDir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

// Collects log lines for the life of the object.
class LogCapture {
 public:
  LogCapture() {
    previous_ = SetLogSink([this](LogLevel, std::string_view line) {
      std::lock_guard lock(mu_);
      lines_.emplace_back(line);
    });
  }
  ~LogCapture() { SetLogSink(previous_); }
  bool Contains(const std::string& text) const {
    std::lock_guard lock(mu_);
    for (const auto& line : lines_) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  }
  std::string All() const {
    std::lock_guard lock(mu_);
    std::string all;
    for (const auto& line : lines_) all += line + "\n";
    return all;
  }

 private:
  LogSinkFunction previous_;
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

// A SaveableIterator whose state is a counter plus `payload_bytes` bytes derived from it.
class FakeIterator final : public SaveableIterator {
 public:
  explicit FakeIterator(bool external = false) : external_(external) {}

  int64_t Next() { return ++counter_; }
  int64_t counter() const { return counter_; }
  void set_payload_bytes(size_t bytes) { payload_bytes_ = bytes; }
  void set_max_state_bytes(uint64_t bytes) { max_state_bytes_ = bytes; }
  void fail_save_at(int64_t counter) { fail_save_at_ = counter; }
  const std::vector<uint8_t>& restored_payload() const { return restored_payload_; }

  Status save(IteratorState* state) override {
    if (counter_ == fail_save_at_) return Status::IOError("fake save failure");
    const int64_t counter[1] = {counter_};
    Status status = state->put_i64("counter", counter);
    if (!status.ok()) return status;
    std::vector<uint8_t> payload(payload_bytes_);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(counter_ + i);
    return state->put_bytes("payload", payload);
  }
  Status restore(const IteratorState& state) override {
    auto counter = state.get_i64("counter", 1);
    if (!counter.ok()) return counter.status();
    auto payload = state.get("payload");
    if (!payload.ok()) return payload.status();
    counter_ = (*counter)[0];
    restored_payload_ = (*payload)->bytes;
    return Status::OK();
  }
  bool has_external_state() const override { return external_; }
  uint64_t max_state_bytes() const override { return max_state_bytes_; }

 private:
  bool external_;
  int64_t counter_ = 0;
  size_t payload_bytes_ = 0;
  uint64_t max_state_bytes_ = 0;
  int64_t fail_save_at_ = -1;
  std::vector<uint8_t> restored_payload_;
};

// What one session consumed: the batch of every step it ran, and how it ended.
struct RunLog {
  std::map<int64_t, Batch> batches;
  Status status;
};

class InputPipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/input_pipeline_test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    dataset_ = root_ + "/data.bin";
    dir_ = root_ + "/ckpt";
    ASSERT_TRUE(WriteRecordDataset(dataset_, 500, 64, 17).ok());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  std::unique_ptr<RecordDatasetIterator> OpenInput(size_t shuffle_buffer = 100,
                                                   size_t prefetch = 16) {
    RecordDatasetOptions options;
    options.path = dataset_;
    options.shuffle_buffer = shuffle_buffer;
    options.prefetch = prefetch;
    options.seed = 3;
    options.epochs = -1;
    auto it = RecordDatasetIterator::Open(options);
    EXPECT_TRUE(it.ok()) << it.status().ToString();
    return it.ok() ? std::move(it).value() : nullptr;
  }

  InputPipelineOptions Options(int64_t save_steps, const std::string& dir = "") const {
    InputPipelineOptions options;
    options.saver.checkpoint_dir = dir.empty() ? dir_ : dir;
    options.saver.save_steps = save_steps;
    options.saver.max_to_keep = 0;
    return options;
  }

  std::unique_ptr<CheckpointInputPipelineHook> MakeHook(const InputPipelineOptions& options,
                                                        SaveableIterator* it) {
    auto hook = CheckpointInputPipelineHook::Create(options, it);
    EXPECT_TRUE(hook.ok()) << hook.status().ToString();
    return hook.ok() ? std::move(hook).value() : nullptr;
  }

  // Runs a session of `hook` from `initial_step` to `last_step`, each step taking one batch.
  static RunLog Run(CheckpointInputPipelineHook* hook, RecordDatasetIterator* input,
                    int64_t initial_step, int64_t last_step, size_t batch_size = 8) {
    RunLog log;
    auto session = SingularMonitoredSession::Create({hook}, initial_step);
    if (!session.ok()) {
      log.status = session.status();
      return log;
    }
    log.status = (*session)->run_until(last_step, [&](StepContext& ctx) {
      Batch batch;
      Status status = input->next_batch(batch_size, &batch);
      if (status.ok()) log.batches[ctx.step()] = std::move(batch);
      return status;
    });
    return log;
  }

  // The batches a straight run from step 0 consumes in steps (from, to].
  std::map<int64_t, Batch> Straight(int64_t from, int64_t to, size_t shuffle_buffer = 100,
                                    size_t batch_size = 8) {
    auto input = OpenInput(shuffle_buffer);
    std::map<int64_t, Batch> batches;
    if (!input) return batches;
    for (int64_t step = 1; step <= to; ++step) {
      Batch batch;
      EXPECT_TRUE(input->next_batch(batch_size, &batch).ok());
      if (step > from) batches[step] = std::move(batch);
    }
    return batches;
  }

  std::string root_;
  std::string dataset_;
  std::string dir_;
};

TEST_F(InputPipelineTest, FreshStartSavesInitialStateThenEveryNStepsAndAtTheEnd) {
  auto input = OpenInput();
  ASSERT_NE(input, nullptr);
  auto hook = MakeHook(Options(3), input.get());
  ASSERT_NE(hook, nullptr);
  RunLog log = Run(hook.get(), input.get(), 0, 7);
  ASSERT_TRUE(log.status.ok()) << log.status.ToString();
  EXPECT_TRUE(hook->restored_from().empty());
  EXPECT_EQ(hook->saves_committed(), 4);

  auto state = GetCheckpointState(dir_, kInputStateFileName);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_EQ(
      state->all_model_checkpoint_paths,
      (std::vector<std::string>{"input.ckpt-0", "input.ckpt-3", "input.ckpt-6", "input.ckpt-7"}));
  EXPECT_EQ(state->model_checkpoint_path, "input.ckpt-7");
  EXPECT_FALSE(fs::exists(dir_ + "/" + kCheckpointStateFileName));

  // Each checkpoint holds the input exactly as it stood after its step: restored, it yields
  // what the session consumed next (input.ckpt-0: everything, so it was saved before step 1).
  for (int64_t step : {0, 3, 6, 7}) {
    const std::string path = dir_ + "/input.ckpt-" + std::to_string(step);
    auto reader = CheckpointReader::Open(path);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    EXPECT_EQ((*reader)->metadata().step, step);
    EXPECT_EQ((*reader)->metadata().user.at("model_step"), std::to_string(step));
    auto restored = OpenInput();
    ASSERT_NE(restored, nullptr);
    auto hook2 = MakeHook(Options(100), restored.get());
    ASSERT_NE(hook2, nullptr);
    RunLog resumed = Run(hook2.get(), restored.get(), step, 7);
    ASSERT_TRUE(resumed.status.ok()) << resumed.status.ToString();
    EXPECT_EQ(hook2->restored_from(), path);
    for (int64_t s = step + 1; s <= 7; ++s) {
      EXPECT_EQ(resumed.batches[s], log.batches[s]) << "step " << s << " resumed from " << step;
    }
  }
}

TEST_F(InputPipelineTest, SessionWithoutStepsStillSavesTheInitialState) {
  auto input = OpenInput();
  ASSERT_NE(input, nullptr);
  auto hook = MakeHook(Options(5), input.get());
  ASSERT_NE(hook, nullptr);
  RunLog log = Run(hook.get(), input.get(), 0, 0);
  ASSERT_TRUE(log.status.ok()) << log.status.ToString();
  EXPECT_TRUE(log.batches.empty());
  EXPECT_EQ(hook->saves_committed(), 1);
  EXPECT_TRUE(IsDir(dir_ + "/input.ckpt-0"));
}

TEST_F(InputPipelineTest, NeverTouchesTheModelsStateFileOrCheckpoints) {
  ASSERT_TRUE(fs::create_directories(dir_ + "/model.ckpt-5"));
  ASSERT_TRUE(fs::create_directories(dir_ + "/model.ckpt-9.tmp-0123456789abcdef"));
  CheckpointState model;
  model.model_checkpoint_path = "model.ckpt-5";
  model.all_model_checkpoint_paths = {"model.ckpt-5"};
  model.all_model_checkpoint_timestamps = {1.5};
  WriteFile(dir_ + "/checkpoint", SerializeCheckpointState(model));
  WriteFile(dir_ + "/model.ckpt-5/index", "fake index bytes");
  WriteFile(dir_ + "/model.ckpt-5/data-00000-of-00001", std::string(1000, 'm'));
  WriteFile(dir_ + "/model.ckpt-9.tmp-0123456789abcdef/data", "half written model");
  const std::set<std::string> before = ListDir(dir_);
  const std::string state_bytes = ReadFile(dir_ + "/checkpoint");

  auto input = OpenInput();
  ASSERT_NE(input, nullptr);
  InputPipelineOptions options = Options(2);
  options.saver.max_to_keep = 1;  // retention deletes input checkpoints: none of the model's
  auto hook = MakeHook(options, input.get());
  ASSERT_NE(hook, nullptr);
  RunLog log = Run(hook.get(), input.get(), 0, 7);
  ASSERT_TRUE(log.status.ok()) << log.status.ToString();
  EXPECT_EQ(hook->saves_committed(), 5);

  EXPECT_EQ(ReadFile(dir_ + "/checkpoint"), state_bytes);
  EXPECT_EQ(ReadFile(dir_ + "/model.ckpt-5/index"), "fake index bytes");
  EXPECT_EQ(ReadFile(dir_ + "/model.ckpt-5/data-00000-of-00001"), std::string(1000, 'm'));
  EXPECT_EQ(ReadFile(dir_ + "/model.ckpt-9.tmp-0123456789abcdef/data"), "half written model");
  std::set<std::string> after;
  for (const std::string& name : ListDir(dir_)) {
    if (name.rfind("input.ckpt-", 0) != 0 && name != kInputStateFileName &&
        name != "checkpoint_input.lock") {
      after.insert(name);
    }
  }
  EXPECT_EQ(after, before);
  EXPECT_EQ(ListDir(dir_).count("input.ckpt-7"), 1u);
  EXPECT_EQ(ListDir(dir_).count("input.ckpt-6"), 0u) << "max_to_keep 1 retains one";
}

TEST_F(InputPipelineTest, ResumeRestoresTheStartStepsCheckpointAndConsumesWhatAStraightRunDoes) {
  const std::map<int64_t, Batch> straight = Straight(0, 14);
  {
    auto input = OpenInput();
    ASSERT_NE(input, nullptr);
    auto hook = MakeHook(Options(4), input.get());
    ASSERT_NE(hook, nullptr);
    RunLog first = Run(hook.get(), input.get(), 0, 10);  // saves 0, 4, 8, 10
    ASSERT_TRUE(first.status.ok()) << first.status.ToString();
    for (int64_t s = 1; s <= 10; ++s) EXPECT_EQ(first.batches[s], straight.at(s)) << s;
  }
  for (int64_t start : {8, 10, 4}) {
    auto input = OpenInput();
    ASSERT_NE(input, nullptr);
    auto hook = MakeHook(Options(4), input.get());
    ASSERT_NE(hook, nullptr);
    RunLog resumed = Run(hook.get(), input.get(), start, 14);
    ASSERT_TRUE(resumed.status.ok()) << resumed.status.ToString();
    EXPECT_EQ(hook->restored_from(), dir_ + "/input.ckpt-" + std::to_string(start));
    ASSERT_EQ(resumed.batches.size(), static_cast<size_t>(14 - start));
    for (int64_t s = start + 1; s <= 14; ++s) {
      EXPECT_EQ(resumed.batches[s], straight.at(s)) << "step " << s << " resumed at " << start;
    }
    EXPECT_EQ(input->records_emitted(), 14 * 8);
  }
}

TEST_F(InputPipelineTest, StartStepWithoutItsOwnCheckpointFailsNamingTheStepAndTheDirectory) {
  {
    auto input = OpenInput();
    ASSERT_NE(input, nullptr);
    auto hook = MakeHook(Options(4), input.get());
    ASSERT_NE(hook, nullptr);
    ASSERT_TRUE(Run(hook.get(), input.get(), 0, 6).status.ok());  // saves 0, 4, 6
  }
  auto input = OpenInput();
  ASSERT_NE(input, nullptr);
  auto hook = MakeHook(Options(4), input.get());
  ASSERT_NE(hook, nullptr);
  RunLog resumed = Run(hook.get(), input.get(), 5, 6);
  EXPECT_EQ(resumed.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(resumed.status.message().find("step 5"), std::string::npos)
      << resumed.status.ToString();
  EXPECT_NE(resumed.status.message().find(dir_), std::string::npos) << resumed.status.ToString();
  EXPECT_NE(resumed.status.message().find("input.ckpt-5"), std::string::npos);
  EXPECT_TRUE(resumed.batches.empty());
  EXPECT_TRUE(hook->restored_from().empty());
  EXPECT_EQ(input->records_emitted(), 0);
}

TEST_F(InputPipelineTest, StartStepWithoutItsOwnCheckpointRestoresTheLatestWhenAskedAndSaysSo) {
  {
    auto input = OpenInput();
    ASSERT_NE(input, nullptr);
    auto hook = MakeHook(Options(4), input.get());
    ASSERT_NE(hook, nullptr);
    ASSERT_TRUE(Run(hook.get(), input.get(), 0, 6).status.ok());  // saves 0, 4, 6
  }
  LogCapture logs;
  auto input = OpenInput();
  ASSERT_NE(input, nullptr);
  InputPipelineOptions options = Options(4);
  options.restore_latest_when_step_missing = true;
  auto hook = MakeHook(options, input.get());
  ASSERT_NE(hook, nullptr);
  RunLog resumed = Run(hook.get(), input.get(), 5, 6);
  ASSERT_TRUE(resumed.status.ok()) << resumed.status.ToString();
  EXPECT_EQ(hook->restored_from(), dir_ + "/input.ckpt-6");
  EXPECT_TRUE(logs.Contains("no input checkpoint for step 5")) << logs.All();
  EXPECT_EQ(input->records_emitted(), 7 * 8);
}

// Finding 6a: a fresh model (step 0) beside input checkpoints of later steps must not take the
// input position of one of them.
TEST_F(InputPipelineTest, FreshStartBesideLaterInputCheckpointsSavesTheInitialState) {
  {
    auto input = OpenInput();
    ASSERT_NE(input, nullptr);
    auto hook = MakeHook(Options(4), input.get());
    ASSERT_NE(hook, nullptr);
    ASSERT_TRUE(Run(hook.get(), input.get(), 0, 8).status.ok());  // saves 0, 4, 8
  }
  fs::remove_all(dir_ + "/input.ckpt-0");
  const std::map<int64_t, Batch> straight = Straight(0, 3);
  auto input = OpenInput();
  ASSERT_NE(input, nullptr);
  auto hook = MakeHook(Options(4), input.get());
  ASSERT_NE(hook, nullptr);
  RunLog fresh = Run(hook.get(), input.get(), 0, 3);
  ASSERT_TRUE(fresh.status.ok()) << fresh.status.ToString();
  EXPECT_TRUE(hook->restored_from().empty()) << hook->restored_from();
  for (int64_t s = 1; s <= 3; ++s) EXPECT_EQ(fresh.batches[s], straight.at(s)) << s;
  EXPECT_TRUE(IsDir(dir_ + "/input.ckpt-0"));
}

// A session creator that starts at step 0 and comes back at `restored` after a pre-emption.
class StepCreator final : public SessionCreator {
 public:
  explicit StepCreator(int64_t restored) : restored_(restored) {}
  Result<int64_t> create_session() override { return calls_++ == 0 ? int64_t{0} : restored_; }

 private:
  int64_t restored_;
  int calls_ = 0;
};

TEST_F(InputPipelineTest, ARecreatedSessionRestoresTheInputOfItsStartStepAgain) {
  const std::map<int64_t, Batch> straight = Straight(0, 10);
  auto input = OpenInput();
  ASSERT_NE(input, nullptr);
  auto hook = MakeHook(Options(4), input.get());
  ASSERT_NE(hook, nullptr);
  StepCreator creator(/*restored=*/4);
  auto session = MonitoredSession::Create({hook.get()}, &creator);
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  std::map<int64_t, Batch> batches;
  bool preempted = false;
  Status status = (*session)->run_until(10, [&](StepContext& ctx) {
    Batch batch;
    RETURN_IF_ERROR(input->next_batch(8, &batch));
    batches[ctx.step()] = std::move(batch);
    // Step 7 consumed its batch, then the worker was pre-empted.
    if (ctx.step() == 7 && !preempted) {
      preempted = true;
      return Status::Unavailable("pre-empted");
    }
    return Status::OK();
  });
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ((*session)->recoveries(), 1);
  EXPECT_EQ(hook->restored_from(), dir_ + "/input.ckpt-4");
  // Steps 5..7 ran twice; the second time they consumed what a straight run does.
  for (int64_t s = 1; s <= 10; ++s) EXPECT_EQ(batches[s], straight.at(s)) << "step " << s;
  EXPECT_EQ(input->records_emitted(), 10 * 8);  // the restored position counts, not the replays
}

TEST_F(InputPipelineTest, ARecreatedSessionAtStepZeroWithoutItsCheckpointFails) {
  auto input = OpenInput();
  ASSERT_NE(input, nullptr);
  auto hook = MakeHook(Options(100), input.get());
  ASSERT_NE(hook, nullptr);
  StepCreator creator(/*restored=*/0);
  auto session = MonitoredSession::Create({hook.get()}, &creator);
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  Status status = (*session)->run_until(10, [&](StepContext& ctx) {
    Batch batch;
    RETURN_IF_ERROR(input->next_batch(8, &batch));
    if (ctx.step() != 3) return Status::OK();
    // Its initial state is gone: the iterator cannot go back to step 0.
    EXPECT_TRUE(hook->wait_until_saved().ok());
    fs::remove_all(dir_ + "/input.ckpt-0");
    return Status::Aborted("pre-empted");
  });
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("input.ckpt-0"), std::string::npos) << status.ToString();
  EXPECT_NE(status.message().find("moved past its initial state"), std::string::npos);
}

TEST_F(InputPipelineTest, ExternalStatePolicyFailRefusesTheFirstSave) {
  FakeIterator it(/*external=*/true);
  InputPipelineOptions options = Options(1);
  options.external_state_policy = ExternalStatePolicy::kFail;
  auto hook = MakeHook(options, &it);
  ASSERT_NE(hook, nullptr);
  auto session = SingularMonitoredSession::Create({hook.get()}, 0);
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  bool step_ran = false;
  Status status = (*session)->run([&](StepContext&) {
    step_ran = true;
    return Status::OK();
  });
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status.ToString();
  EXPECT_NE(status.message().find("external state"), std::string::npos) << status.message();
  EXPECT_FALSE(step_ran) << "the failure comes from the first before_run";
  (void)(*session)->close();
  EXPECT_FALSE(fs::exists(dir_ + "/input.ckpt-0"));
  EXPECT_EQ(hook->saves_committed(), 0);
}

TEST_F(InputPipelineTest, ExternalStatePolicyWarnLogsAndSaves) {
  LogCapture logs;
  FakeIterator it(/*external=*/true);
  InputPipelineOptions options = Options(1);
  options.external_state_policy = ExternalStatePolicy::kWarn;
  auto hook = MakeHook(options, &it);
  ASSERT_NE(hook, nullptr);
  auto session = SingularMonitoredSession::Create({hook.get()}, 0);
  ASSERT_TRUE(session.ok());
  Status status = (*session)->run_until(3, [&](StepContext&) {
    it.Next();
    return Status::OK();
  });
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_TRUE(logs.Contains("external state")) << logs.All();
  EXPECT_EQ(hook->saves_committed(), 4);
  EXPECT_TRUE(IsDir(dir_ + "/input.ckpt-3"));
}

TEST_F(InputPipelineTest, ExternalStatePolicyIgnoreSavesSilently) {
  LogCapture logs;
  FakeIterator it(/*external=*/true);
  InputPipelineOptions options = Options(1);
  options.external_state_policy = ExternalStatePolicy::kIgnore;
  auto hook = MakeHook(options, &it);
  ASSERT_NE(hook, nullptr);
  auto session = SingularMonitoredSession::Create({hook.get()}, 0);
  ASSERT_TRUE(session.ok());
  Status status = (*session)->run_until(2, [&](StepContext&) {
    it.Next();
    return Status::OK();
  });
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_FALSE(logs.Contains("external")) << logs.All();
  EXPECT_EQ(hook->saves_committed(), 3);
  EXPECT_TRUE(IsDir(dir_ + "/input.ckpt-2"));
}

TEST_F(InputPipelineTest, WorkerOfAMultiWorkerJobUsesItsOwnBasename) {
  InputPipelineOptions options = Options(2);
  EXPECT_EQ(InputCheckpointBasename(options), "input.ckpt");
  options.num_workers = 2;
  options.task_id = 1;
  EXPECT_EQ(InputCheckpointBasename(options), "input_worker_1.ckpt");
  EXPECT_EQ(InputStateFileName(options), "checkpoint_input_worker_1");
  options.task_type = "chief";
  options.task_id = 0;
  EXPECT_EQ(InputCheckpointBasename(options), "input_chief_0.ckpt");
  options.task_type = "worker";
  options.task_id = 1;

  auto input = OpenInput();
  ASSERT_NE(input, nullptr);
  auto hook = MakeHook(options, input.get());
  ASSERT_NE(hook, nullptr);
  ASSERT_TRUE(Run(hook.get(), input.get(), 0, 3).status.ok());
  EXPECT_TRUE(IsDir(dir_ + "/input_worker_1.ckpt-0"));
  EXPECT_TRUE(IsDir(dir_ + "/input_worker_1.ckpt-2"));
  EXPECT_TRUE(IsDir(dir_ + "/input_worker_1.ckpt-3"));
  for (const std::string& name : ListDir(dir_)) {
    EXPECT_EQ(name.rfind("input.ckpt", 0), std::string::npos) << name;
  }
}

// Two workers share checkpoint_dir: each keeps its own state file (TensorFlow's
// "checkpoint_input_<task_type>_<task_id>"), so neither one's retention deletes, nor its resume
// picks, the other's checkpoints.
TEST_F(InputPipelineTest, WorkersSharingADirectoryKeepTheirCheckpointsApart) {
  std::vector<std::unique_ptr<RecordDatasetIterator>> inputs;
  std::vector<std::unique_ptr<CheckpointInputPipelineHook>> hooks;
  for (int worker = 0; worker < 2; ++worker) {
    InputPipelineOptions options = Options(3);
    options.saver.max_to_keep = 2;
    options.num_workers = 2;
    options.task_id = worker;
    inputs.push_back(OpenInput());
    ASSERT_NE(inputs.back(), nullptr);
    hooks.push_back(MakeHook(options, inputs.back().get()));
    ASSERT_NE(hooks.back(), nullptr);
    // Worker 0 runs further, so its newest checkpoint is the directory's newest.
    ASSERT_TRUE(Run(hooks.back().get(), inputs.back().get(), 0, worker == 0 ? 8 : 4).status.ok());
  }
  for (int worker = 0; worker < 2; ++worker) {
    InputPipelineOptions options = Options(3);
    options.num_workers = 2;
    options.task_id = worker;
    const std::string basename = InputCheckpointBasename(options);
    auto state = GetCheckpointState(dir_, InputStateFileName(options));
    ASSERT_TRUE(state.ok()) << state.status().ToString();
    for (const std::string& name : state->all_model_checkpoint_paths) {
      EXPECT_EQ(name.rfind(basename + "-", 0), 0u) << name << " in worker " << worker << "'s list";
      EXPECT_TRUE(IsDir(dir_ + "/" + name)) << name;
    }
    EXPECT_EQ(state->model_checkpoint_path, basename + (worker == 0 ? "-8" : "-4"));
  }
  EXPECT_TRUE(IsDir(dir_ + "/input_worker_0.ckpt-6"));
  EXPECT_TRUE(IsDir(dir_ + "/input_worker_0.ckpt-8"));
  EXPECT_TRUE(IsDir(dir_ + "/input_worker_1.ckpt-3"));
  EXPECT_TRUE(IsDir(dir_ + "/input_worker_1.ckpt-4"));

  // Worker 1 resumed at a step it has no checkpoint of falls back to its own latest (when told
  // to: by default that is an error).
  InputPipelineOptions options = Options(3);
  options.num_workers = 2;
  options.task_id = 1;
  options.restore_latest_when_step_missing = true;
  auto input = OpenInput();
  ASSERT_NE(input, nullptr);
  auto hook = MakeHook(options, input.get());
  ASSERT_NE(hook, nullptr);
  ASSERT_TRUE(Run(hook.get(), input.get(), 7, 8).status.ok());
  EXPECT_EQ(hook->restored_from(), dir_ + "/input_worker_1.ckpt-4");
}

// 512 records of 64 bytes in the shuffle buffer: 32 KiB, eight 4 KiB chunks and more.
TEST_F(InputPipelineTest, ShuffleBufferSpanningManyChunksRoundTrips) {
  constexpr size_t kShuffle = 512;
  const std::map<int64_t, Batch> straight = Straight(0, 60, kShuffle, 16);
  InputPipelineOptions options = Options(10);
  options.saver.chunk_bytes = 4096;
  {
    auto input = OpenInput(kShuffle);
    ASSERT_NE(input, nullptr);
    auto hook = MakeHook(options, input.get());
    ASSERT_NE(hook, nullptr);
    ASSERT_TRUE(Run(hook.get(), input.get(), 0, 40, 16).status.ok());
  }
  auto reader = CheckpointReader::Open(dir_ + "/input.ckpt-40");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const TensorInfo* shuffle = (*reader)->find("shuffle_buffer");
  ASSERT_NE(shuffle, nullptr);
  EXPECT_EQ(shuffle->bytes, (kShuffle - 1) * 64);
  EXPECT_GE(shuffle->num_chunks, 8u);
  EXPECT_TRUE((*reader)->verify().problems.empty());

  auto input = OpenInput(kShuffle);
  ASSERT_NE(input, nullptr);
  auto hook = MakeHook(options, input.get());
  ASSERT_NE(hook, nullptr);
  RunLog resumed = Run(hook.get(), input.get(), 40, 60, 16);
  ASSERT_TRUE(resumed.status.ok()) << resumed.status.ToString();
  EXPECT_EQ(hook->restored_from(), dir_ + "/input.ckpt-40");
  for (int64_t s = 41; s <= 60; ++s) EXPECT_EQ(resumed.batches[s], straight.at(s)) << s;
}

TEST_F(InputPipelineTest, RestoreThatDoesNotFitTheIteratorFailsTheFirstStepNamingTheCheckpoint) {
  {
    auto input = OpenInput(100);
    ASSERT_NE(input, nullptr);
    auto hook = MakeHook(Options(5), input.get());
    ASSERT_NE(hook, nullptr);
    ASSERT_TRUE(Run(hook.get(), input.get(), 0, 5).status.ok());
  }
  auto input = OpenInput(/*shuffle_buffer=*/4);
  ASSERT_NE(input, nullptr);
  auto hook = MakeHook(Options(5), input.get());
  ASSERT_NE(hook, nullptr);
  RunLog log = Run(hook.get(), input.get(), 5, 10);
  EXPECT_EQ(log.status.code(), StatusCode::kCorruption) << log.status.ToString();
  EXPECT_NE(log.status.message().find(dir_ + "/input.ckpt-5"), std::string::npos)
      << log.status.message();
  EXPECT_TRUE(log.batches.empty());
}

// An iterator that cannot bound its state gets staging from its first snapshot; later, larger
// states must still save (streaming through staging), whatever chunk_bytes is.
TEST_F(InputPipelineTest, IteratorWithoutAStateBoundSavesStatesLargerThanItsFirst) {
  FakeIterator it;
  auto hook = MakeHook(Options(1), &it);
  ASSERT_NE(hook, nullptr);
  auto session = SingularMonitoredSession::Create({hook.get()}, 0);
  ASSERT_TRUE(session.ok());
  Status status = (*session)->run_until(4, [&](StepContext& ctx) {
    it.Next();
    it.set_payload_bytes(ctx.step() == 3 ? (256u << 10) : 16 * ctx.step());
    return Status::OK();
  });
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(hook->saves_committed(), 5);

  FakeIterator restored;
  auto hook2 = MakeHook(Options(1), &restored);
  ASSERT_NE(hook2, nullptr);
  auto session2 = SingularMonitoredSession::Create({hook2.get()}, 3);
  ASSERT_TRUE(session2.ok());
  ASSERT_TRUE((*session2)->run([](StepContext&) { return Status::OK(); }).ok());
  ASSERT_TRUE((*session2)->close().ok());
  EXPECT_EQ(hook2->restored_from(), dir_ + "/input.ckpt-3");
  ASSERT_EQ(restored.restored_payload().size(), 256u << 10);
  EXPECT_EQ(restored.restored_payload()[1000], static_cast<uint8_t>(3 + 1000));
}

TEST_F(InputPipelineTest, IteratorSaveFailureFailsTheSession) {
  FakeIterator it;
  it.fail_save_at(2);
  auto hook = MakeHook(Options(1), &it);
  ASSERT_NE(hook, nullptr);
  auto session = SingularMonitoredSession::Create({hook.get()}, 0);
  ASSERT_TRUE(session.ok());
  Status status = (*session)->run_until(5, [&](StepContext&) {
    it.Next();
    return Status::OK();
  });
  EXPECT_EQ(status.code(), StatusCode::kIOError) << status.ToString();
  EXPECT_NE(status.message().find("saving the input iterator"), std::string::npos)
      << status.message();
  EXPECT_EQ(it.counter(), 2);
}

// A job killed right after its first step finds the input's initial checkpoint beside the
// model's, however slow the disk: the initial save is durable before the first step runs.
TEST_F(InputPipelineTest, TheInitialStateIsDurableBeforeTheFirstStepRuns) {
  std::unique_ptr<io::FileSystem> posix = io::NewPosixFileSystem();
  // Every write of the engine's write path completes 200 ms late, as on a busy disk.
  testing_support::SlowFileSystem slow(posix.get(), std::chrono::milliseconds(200));
  auto input = OpenInput();
  ASSERT_NE(input, nullptr);
  InputPipelineOptions options = Options(1);
  options.saver.file_system = &slow;
  auto hook = MakeHook(options, input.get());
  ASSERT_NE(hook, nullptr);
  auto session = SingularMonitoredSession::Create({hook.get()}, 0);
  ASSERT_TRUE(session.ok());
  bool listed_at_step_one = false;
  Status status = (*session)->run_until(1, [&](StepContext&) {
    auto state = GetCheckpointState(dir_, kInputStateFileName);
    listed_at_step_one = state.ok() && state->model_checkpoint_path == "input.ckpt-0";
    Batch batch;
    return input->next_batch(4, &batch);
  });
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_GT(slow.slowed_writes(), 0u) << "the saves' writes did not take the slowed path";
  EXPECT_TRUE(listed_at_step_one);
  EXPECT_TRUE(IsDir(dir_ + "/input.ckpt-0"));
}

TEST_F(InputPipelineTest, BackgroundSaveFailureStopsTheLoopAndEndReturnsIt) {
  std::unique_ptr<io::FileSystem> posix = io::NewPosixFileSystem();
  auto faults = std::make_unique<io::FaultInjectionFileSystem>(posix.get());
  auto input = OpenInput();
  ASSERT_NE(input, nullptr);
  InputPipelineOptions options = Options(2);
  options.saver.file_system = faults.get();
  auto hook = MakeHook(options, input.get());
  ASSERT_NE(hook, nullptr);
  auto session = SingularMonitoredSession::Create({hook.get()}, 0);
  ASSERT_TRUE(session.ok());
  faults->fail_ops_matching("input.ckpt-4", EIO);
  int64_t steps = 0;
  Status status = (*session)->run_until(200, [&](StepContext& ctx) {
    ++steps;
    // The save of step 4 has failed in the background by now: the loop stops after this step.
    if (ctx.step() == 5) {
      EXPECT_FALSE(hook->wait_until_saved().ok());
    }
    Batch batch;
    return input->next_batch(4, &batch);
  });
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("input.ckpt-4"), std::string::npos) << status.ToString();
  EXPECT_EQ(steps, 5) << "a failed input save must stop the loop at the next after_run";
  EXPECT_FALSE(IsDir(dir_ + "/input.ckpt-4"));
  EXPECT_TRUE(IsDir(dir_ + "/input.ckpt-2"));
}

TEST_F(InputPipelineTest, BackgroundSaveFailureWithOnErrorContinueIsCountedAndTrainingGoesOn) {
  std::unique_ptr<io::FileSystem> posix = io::NewPosixFileSystem();
  auto faults = std::make_unique<io::FaultInjectionFileSystem>(posix.get());
  auto input = OpenInput();
  ASSERT_NE(input, nullptr);
  InputPipelineOptions options = Options(2);
  options.saver.on_error = OnError::kContinue;
  options.saver.file_system = faults.get();
  auto hook = MakeHook(options, input.get());
  ASSERT_NE(hook, nullptr);
  LogCapture log;
  auto session = SingularMonitoredSession::Create({hook.get()}, 0);
  ASSERT_TRUE(session.ok());
  faults->fail_ops_matching("input.ckpt-4", ENOSPC, io::FaultOp::kWrite,
                            io::FaultMode::kShortTransfer);
  Status status = (*session)->run_until(8, [&](StepContext& ctx) {
    if (ctx.step() == 5) {
      EXPECT_TRUE(hook->wait_until_saved().ok()) << "kContinue keeps no failure for the loop";
      EXPECT_EQ(hook->saves_failed(), 1);
    }
    Batch batch;
    return input->next_batch(4, &batch);
  });
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ((*session)->global_step(), 8);
  EXPECT_EQ(hook->saves_failed(), 1);
  EXPECT_EQ(hook->saves_committed(), 4);  // steps 0, 2, 6 and 8
  EXPECT_TRUE(log.Contains("an input pipeline save failed; training goes on")) << log.All();
  EXPECT_FALSE(IsDir(dir_ + "/input.ckpt-4"));
  EXPECT_TRUE(IsDir(dir_ + "/input.ckpt-8"));
}

TEST_F(InputPipelineTest, NewestCompleteStepPicksTheNewestStepBothHave) {
  auto posix = io::NewPosixFileSystem();
  auto reset = [&] {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
    ASSERT_TRUE(fs::create_directories(dir_));
  };
  // A complete checkpoint: the state files must name what is on disk.
  const int64_t value = 42;
  auto make_checkpoint = [&](const std::string& name) {
    const std::string path = dir_ + "/" + name;
    if (fs::exists(path)) return;
    ASSERT_TRUE(fs::create_directory(path));
    const format::HostTensor tensor{"v", DType::kI64, {1}, &value, sizeof(value)};
    testing_support::WriterOptions options;
    options.num_data_files = 1;
    auto written =
        testing_support::WriteCheckpointFiles(*posix, path, {&tensor, 1}, {0, 0, {}}, options);
    ASSERT_TRUE(written.ok()) << written.status().ToString();
  };
  auto write = [&](const std::string& file, const std::string& basename,
                   std::vector<int64_t> steps) {
    CheckpointState state;
    for (int64_t step : steps) {
      state.all_model_checkpoint_paths.push_back(basename + "-" + std::to_string(step));
      make_checkpoint(state.all_model_checkpoint_paths.back());
    }
    if (!steps.empty()) state.model_checkpoint_path = state.all_model_checkpoint_paths.back();
    ASSERT_TRUE(WriteCheckpointState(*posix, dir_, state, file).ok());
  };
  auto newest = [&](const std::string& input_basename = "input.ckpt") {
    auto step = NewestCompleteStep(dir_, "model.ckpt", input_basename);
    EXPECT_TRUE(step.ok()) << step.status().ToString();
    return step.ok() ? *step : std::optional<int64_t>(-999);
  };

  reset();
  EXPECT_EQ(newest(), std::nullopt) << "no state files: a fresh job";
  write("checkpoint", "model.ckpt", {5, 10, 15});
  EXPECT_EQ(newest(), std::nullopt) << "no input checkpoints";
  write("checkpoint_input", "input.ckpt", {0, 5, 10});
  EXPECT_EQ(newest(), 10);
  write("checkpoint_input", "input.ckpt", {0, 5, 10, 15, 20});
  EXPECT_EQ(newest(), 15);
  reset();
  write("checkpoint", "model.ckpt", {5, 10, 15});
  write("checkpoint_input", "input.ckpt", {20, 25});
  EXPECT_EQ(newest(), std::nullopt) << "no step in common";
  // Another basename's entries do not count.
  reset();
  write("checkpoint", "model.ckpt", {5, 10});
  write("checkpoint_input", "other.ckpt", {5, 10});
  EXPECT_EQ(newest(), std::nullopt);
  // A worker's input checkpoints are in its own state file.
  write("checkpoint_input_worker_1", "input_worker_1.ckpt", {0, 5});
  EXPECT_EQ(newest("input_worker_1.ckpt"), 5);
  // A step no int64 holds names no checkpoint of this job; it must not throw.
  {
    make_checkpoint("input.ckpt-5");
    CheckpointState state;
    state.all_model_checkpoint_paths = {"input.ckpt-99999999999999999999", "input.ckpt-5"};
    state.model_checkpoint_path = "input.ckpt-5";
    ASSERT_TRUE(WriteCheckpointState(*posix, dir_, state, "checkpoint_input").ok());
  }
  EXPECT_EQ(newest(), 5);
  // A state file that does not parse falls back to the complete checkpoints on disk (issue 8,
  // finding 6a: it used to be an error, and the resume started afresh).
  WriteFile(dir_ + "/checkpoint_input", "this is not a state file\n");
  EXPECT_EQ(newest(), 5);
  fs::remove_all(dir_ + "/input.ckpt-5");
  EXPECT_EQ(newest(), std::nullopt);
}

TEST_F(InputPipelineTest, CreateRejectsBadOptionsNamingThem) {
  FakeIterator it;
  auto expect_invalid = [&](InputPipelineOptions options, const std::string& named,
                            SaveableIterator* iterator) {
    auto hook = CheckpointInputPipelineHook::Create(options, iterator);
    ASSERT_FALSE(hook.ok()) << named;
    EXPECT_EQ(hook.status().code(), StatusCode::kInvalidArgument) << hook.status().ToString();
    EXPECT_NE(hook.status().message().find(named), std::string::npos) << hook.status().message();
  };
  InputPipelineOptions both = Options(5);
  both.saver.save_secs = 10;
  expect_invalid(both, "save_secs", &it);
  InputPipelineOptions neither = Options(5);
  neither.saver.save_steps.reset();
  expect_invalid(neither, "save_steps", &it);
  InputPipelineOptions zero = Options(0);
  expect_invalid(zero, "save_steps", &it);
  InputPipelineOptions past = Options(5);
  past.num_workers = 2;
  past.task_id = 2;
  expect_invalid(past, "task_id", &it);
  InputPipelineOptions negative = Options(5);
  negative.task_id = -1;
  expect_invalid(negative, "task_id", &it);
  InputPipelineOptions no_workers = Options(5);
  no_workers.num_workers = 0;
  expect_invalid(no_workers, "num_workers", &it);
  InputPipelineOptions no_type = Options(5);
  no_type.num_workers = 2;
  no_type.task_type = "";
  expect_invalid(no_type, "task_type", &it);
  InputPipelineOptions slash = Options(5);
  slash.num_workers = 2;
  slash.task_type = "a/b";
  expect_invalid(slash, "basename", &it);
  expect_invalid(Options(5, "/"), "iterator", nullptr);
  InputPipelineOptions no_dir = Options(5);
  no_dir.saver.checkpoint_dir.clear();
  expect_invalid(no_dir, "checkpoint_dir", &it);
  InputPipelineOptions keep = Options(5);
  keep.saver.max_to_keep = -1;
  expect_invalid(keep, "max_to_keep", &it);
  InputPipelineOptions chunk = Options(5);
  chunk.saver.chunk_bytes = 0;
  expect_invalid(chunk, "chunk_bytes", &it);
  // save_secs alone is fine.
  InputPipelineOptions secs = Options(5);
  secs.saver.save_steps.reset();
  secs.saver.save_secs = 30;
  EXPECT_TRUE(CheckpointInputPipelineHook::Create(secs, &it).ok());
}

TEST(IteratorStateTest, PutAndGetCheckNamesSizesAndTypes) {
  IteratorState state;
  const int64_t values[3] = {1, -2, 3};
  ASSERT_TRUE(state.put_i64("v", values).ok());
  EXPECT_EQ(state.put_i64("v", values).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(state.put_bytes("", {}).code(), StatusCode::kInvalidArgument);
  const uint8_t five[5] = {1, 2, 3, 4, 5};
  EXPECT_EQ(state.put("f", DType::kF32, {2}, five).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(state.put_bytes("b", five).ok());
  auto got = state.get_i64("v", 3);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(state.get_i64("v", 2).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(state.get_i64("b", 5).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(state.get("missing").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(state.total_bytes(), 24u + 5u);
  auto registry = state.as_registry();
  ASSERT_TRUE(registry.ok());
  EXPECT_EQ(registry->size(), 2u);
  state.clear();
  EXPECT_TRUE(state.entries().empty());
}

}  // namespace
}  // namespace asyncckpt
