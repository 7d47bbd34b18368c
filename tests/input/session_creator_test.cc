// CheckpointSessionCreator: which step it restores (the newest with both a model and an input
// checkpoint, or the model's latest), what it refuses (checkpoints it would train over, damaged
// or misnamed checkpoints, a re-creation it cannot reset), and its option checks.

#include "asyncckpt/session_creator.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/session.h"
#include "src/util/log.h"
#include "tests/support/files.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using testing_support::ReadFileBytes;
using testing_support::WriteFile;

// An input iterator whose whole state is one counter.
class CounterIterator final : public SaveableIterator {
 public:
  Status save(IteratorState* state) override {
    const int64_t value[1] = {counter};
    return state->put_i64("counter", value);
  }
  Status restore(const IteratorState& state) override {
    auto value = state.get_i64("counter", 1);
    if (!value.ok()) return value.status();
    counter = (*value)[0];
    return Status::OK();
  }
  int64_t counter = 0;
};

// Collects log lines for the life of the object.
class LogCapture {
 public:
  LogCapture() {
    previous_ = SetLogSink([this](LogLevel, std::string_view line) {
      std::lock_guard lock(mu_);
      all_ += std::string(line) + "\n";
    });
  }
  ~LogCapture() { SetLogSink(previous_); }
  std::string All() const {
    std::lock_guard lock(mu_);
    return all_;
  }

 private:
  LogSinkFunction previous_;
  mutable std::mutex mu_;
  std::string all_;
};

// Counts the calls that reach the wrapped file system.
class CountingFileSystem final : public io::FileSystemWrapper {
 public:
  using FileSystemWrapper::FileSystemWrapper;
  io::IoStatus open(const std::string& path, const io::OpenOptions& options,
                    std::unique_ptr<io::File>* file) override {
    ++opens;
    return FileSystemWrapper::open(path, options, file);
  }
  io::IoStatus list_dir(const std::string& path, std::vector<std::string>* names) override {
    ++lists;
    return FileSystemWrapper::list_dir(path, names);
  }
  std::atomic<int> opens{0};
  std::atomic<int> lists{0};
};

class SessionCreatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/session_creator_test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    dir_ = root_ + "/ckpt";
    weights_.resize(3000);
    ASSERT_TRUE(registry_
                    .add({"weights",
                          DType::kF32,
                          {static_cast<int64_t>(weights_.size())},
                          weights_.data(),
                          weights_.size() * sizeof(float),
                          nullptr,
                          {},
                          {}})
                    .ok());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // The model's state at `step`.
  void SetState(int64_t step) {
    for (size_t i = 0; i < weights_.size(); ++i) weights_[i] = float(step * 10000 + int64_t(i));
  }
  // True when the registry holds the model's state at `step`.
  bool HoldsState(int64_t step) const {
    for (size_t i = 0; i < weights_.size(); ++i) {
      if (weights_[i] != float(step * 10000 + int64_t(i))) return false;
    }
    return true;
  }

  // Commits model checkpoints of `steps` (each a session's initial save at that step).
  void SaveModel(const std::set<int64_t>& steps) {
    for (int64_t step : steps) {
      SaverOptions options;
      options.checkpoint_dir = dir_;
      options.save_steps = 1000;
      options.max_to_keep = 0;
      options.chunk_bytes = 4096;
      SetState(step);
      auto hook = CheckpointSaverHook::Create(options, &registry_);
      ASSERT_TRUE(hook.ok()) << hook.status().ToString();
      auto session = SingularMonitoredSession::Create({hook->get()}, step);
      ASSERT_TRUE(session.ok()) << session.status().ToString();
      ASSERT_TRUE((*session)->close().ok());
    }
    SetState(-1);  // anything but a saved state
  }

  // Commits input checkpoints of steps 0, save_steps, 2 * save_steps ... and `last`.
  void SaveInput(int64_t last, int64_t save_steps) {
    CounterIterator iterator;
    InputPipelineOptions options;
    options.saver.checkpoint_dir = dir_;
    options.saver.save_steps = save_steps;
    options.saver.max_to_keep = 0;
    auto hook = CheckpointInputPipelineHook::Create(options, &iterator);
    ASSERT_TRUE(hook.ok()) << hook.status().ToString();
    auto session = SingularMonitoredSession::Create({hook->get()}, 0);
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    Status status = (*session)->run_until(last, [&](StepContext&) {
      ++iterator.counter;
      return Status::OK();
    });
    ASSERT_TRUE(status.ok()) << status.ToString();
  }

  CheckpointSessionCreatorOptions Options(bool paired = true) {
    CheckpointSessionCreatorOptions options;
    options.checkpoint_dir = dir_;
    if (paired) options.input_basename = "input.ckpt";
    options.init_fn = [this] {
      ++inits_;
      SetState(0);
      return Status::OK();
    };
    return options;
  }

  std::unique_ptr<CheckpointSessionCreator> MakeCreator(CheckpointSessionCreatorOptions options) {
    auto creator = CheckpointSessionCreator::Create(std::move(options), &registry_);
    EXPECT_TRUE(creator.ok()) << creator.status().ToString();
    return creator.ok() ? std::move(creator).value() : nullptr;
  }

  std::string root_;
  std::string dir_;
  std::vector<float> weights_;
  TensorRegistry registry_;
  int inits_ = 0;
};

TEST_F(SessionCreatorTest, FreshDirectoryStartsAtStepZeroThroughInitFn) {
  for (bool paired : {true, false}) {
    inits_ = 0;
    SetState(-1);
    auto creator = MakeCreator(Options(paired));
    ASSERT_NE(creator, nullptr);
    auto step = creator->create_session();
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_EQ(*step, 0);
    EXPECT_TRUE(creator->restored_from().empty());
    EXPECT_EQ(inits_, 1);
    EXPECT_TRUE(HoldsState(0));
  }
}

TEST_F(SessionCreatorTest, RestoresTheModelOfTheNewestStepThatHasBothCheckpoints) {
  SaveModel({0, 4, 8});
  SaveInput(4, 4);  // input.ckpt-0 and input.ckpt-4: the input of step 8 never committed
  LogCapture logs;
  auto creator = MakeCreator(Options());
  ASSERT_NE(creator, nullptr);
  auto step = creator->create_session();
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(*step, 4);
  EXPECT_TRUE(HoldsState(4));
  EXPECT_EQ(creator->restored_from(), dir_ + "/model.ckpt-4");
  EXPECT_EQ(inits_, 0);
  EXPECT_NE(logs.All().find("restored " + dir_ + "/model.ckpt-4"), std::string::npos) << logs.All();
  EXPECT_NE(logs.All().find("input.ckpt-4"), std::string::npos) << logs.All();

  // A re-creation restores again, whatever the state became meanwhile.
  SetState(7);
  step = creator->create_session();
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(*step, 4);
  EXPECT_TRUE(HoldsState(4));
}

TEST_F(SessionCreatorTest, WithoutAnInputBasenameRestoresTheModelsLatest) {
  SaveModel({0, 4, 8});
  auto creator = MakeCreator(Options(/*paired=*/false));
  ASSERT_NE(creator, nullptr);
  auto step = creator->create_session();
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(*step, 8);
  EXPECT_TRUE(HoldsState(8));
}

TEST_F(SessionCreatorTest, ModelCheckpointsWithoutAnInputPartnerFailLoudlyNamingThem) {
  SaveModel({0, 4, 8});
  auto creator = MakeCreator(Options());
  ASSERT_NE(creator, nullptr);
  auto step = creator->create_session();
  ASSERT_FALSE(step.ok()) << "started at step " << *step;
  EXPECT_EQ(step.status().code(), StatusCode::kFailedPrecondition);
  const std::string message = step.status().message();
  EXPECT_NE(message.find(dir_), std::string::npos) << message;
  EXPECT_NE(message.find("model.ckpt-0, model.ckpt-4 and model.ckpt-8"), std::string::npos)
      << message;
  EXPECT_NE(message.find("the newest, model.ckpt-8, has no input.ckpt-8"), std::string::npos)
      << message;
  EXPECT_NE(message.find("allow_fresh_start"), std::string::npos) << message;
  EXPECT_EQ(inits_, 0);
  EXPECT_TRUE(HoldsState(-1));  // untouched
}

// A job killed in its first seconds: the input's small saves committed, the model's did not.
// Nothing of the model is there to train over, so the next start begins afresh (it refused
// before, and every later start of the job with it, until someone passed allow_fresh_start).
TEST_F(SessionCreatorTest, InputCheckpointsWithoutAnyModelCheckpointStartAfreshSayingSo) {
  SaveInput(8, 4);
  LogCapture logs;
  auto creator = MakeCreator(Options());
  ASSERT_NE(creator, nullptr);
  auto step = creator->create_session();
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(*step, 0);
  EXPECT_EQ(inits_, 1);
  EXPECT_NE(logs.All().find("input.ckpt-8"), std::string::npos) << logs.All();
}

TEST_F(SessionCreatorTest, AllowFreshStartStartsAtStepZeroBesideThemAndSaysSo) {
  SaveModel({0, 4, 8});
  LogCapture logs;
  CheckpointSessionCreatorOptions options = Options();
  options.allow_fresh_start = true;
  auto creator = MakeCreator(options);
  ASSERT_NE(creator, nullptr);
  auto step = creator->create_session();
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(*step, 0);
  EXPECT_EQ(inits_, 1);
  EXPECT_TRUE(HoldsState(0));
  EXPECT_NE(logs.All().find("model.ckpt-8"), std::string::npos) << logs.All();
}

TEST_F(SessionCreatorTest, CheckpointsOfStepZeroAloneStartAfresh) {
  // A job killed between its first model and input saves has nothing to train over.
  SaveModel({0});
  auto creator = MakeCreator(Options());
  ASSERT_NE(creator, nullptr);
  auto step = creator->create_session();
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(*step, 0);
  EXPECT_EQ(inits_, 1);
}

// Finding 6a: an emptied state file, or one naming a checkpoint that is gone, beside intact
// checkpoints. The creator either restores a step that has both checkpoints (where the state
// files are read with a fallback to the directory) or fails naming what it found; it never
// starts from step 0 beside them.
TEST_F(SessionCreatorTest, ABrokenStateFileNeverStartsFromStepZeroBesideCheckpoints) {
  SaveModel({0, 4, 8});
  SaveInput(8, 4);
  const std::string state_file = dir_ + "/checkpoint";
  for (const std::string& broken :
       {std::string(""), std::string("model_checkpoint_path: \"model.ckpt-999\"\n"
                                     "all_model_checkpoint_paths: \"model.ckpt-999\"\n")}) {
    SCOPED_TRACE("state file: '" + broken + "'");
    WriteFile(state_file, broken);
    SetState(-1);
    inits_ = 0;
    auto creator = MakeCreator(Options());
    ASSERT_NE(creator, nullptr);
    auto step = creator->create_session();
    if (step.ok()) {
      EXPECT_EQ(*step, 8);
      EXPECT_TRUE(HoldsState(8));
    } else {
      EXPECT_EQ(step.status().code(), StatusCode::kFailedPrecondition) << step.status().ToString();
      EXPECT_NE(step.status().message().find("model.ckpt-8"), std::string::npos)
          << step.status().ToString();
    }
    EXPECT_EQ(inits_, 0);
  }
}

TEST_F(SessionCreatorTest, AListedStepWhoseCheckpointIsGoneFailsNamingIt) {
  SaveModel({0, 4});
  SaveInput(4, 4);
  fs::remove_all(dir_ + "/model.ckpt-4");
  auto creator = MakeCreator(Options());
  ASSERT_NE(creator, nullptr);
  auto step = creator->create_session();
  if (step.ok()) {
    // A state file read with a fallback to the directory resumes the older complete step.
    EXPECT_EQ(*step, 0);
    EXPECT_EQ(creator->restored_from(), dir_ + "/model.ckpt-0");
  } else {
    EXPECT_NE(step.status().message().find("model.ckpt-4"), std::string::npos)
        << step.status().ToString();
  }
  EXPECT_EQ(inits_, 0);
}

// Flips bytes all over the first data file of `name`: start-up's size checks pass, every chunk
// read from it fails its checksum.
void FlipDataBytes(const std::string& checkpoint) {
  const std::string data = checkpoint + "/data-00000-of-00002";
  std::vector<uint8_t> bytes = ReadFileBytes(data);
  ASSERT_GT(bytes.size(), 100u);
  for (size_t i = 0; i < bytes.size(); i += 97) bytes[i] ^= 0x5a;
  WriteFile(data, bytes);
}

// The quarantined copies "<name>.corrupt-<hex>" in `dir`, by their names.
std::set<std::string> QuarantinedIn(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename();
    const size_t at = name.find(".corrupt-");
    if (at != std::string::npos) names.insert(name.substr(0, at));
  }
  return names;
}

// D3 of issue 31: a flipped byte in the latest checkpoint's data made every restart fail with a
// checksum error, the good checkpoint before it ignored. The restore quarantines it, says what
// it found (file, tensor, chunk) and restores the newest good step, paired or not.
TEST_F(SessionCreatorTest, ABadByteInTheLatestCheckpointFallsBackToTheNewestGoodStep) {
  for (bool paired : {true, false}) {
    SCOPED_TRACE(paired ? "paired" : "model only");
    std::error_code ec;
    fs::remove_all(dir_, ec);
    SaveModel({0, 4, 8});
    if (paired) SaveInput(8, 4);  // input.ckpt-0, -4 and -8
    FlipDataBytes(dir_ + "/model.ckpt-8");
    LogCapture logs;
    auto creator = MakeCreator(Options(paired));
    ASSERT_NE(creator, nullptr);
    auto step = creator->create_session();
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_EQ(*step, 4);
    EXPECT_TRUE(HoldsState(4));
    EXPECT_EQ(creator->restored_from(), dir_ + "/model.ckpt-4");
    EXPECT_EQ(QuarantinedIn(dir_), std::set<std::string>{"model.ckpt-8"});
    EXPECT_NE(logs.All().find(dir_ + "/model.ckpt-8/data-00000-of-00002: tensor 'weights' chunk"),
              std::string::npos)
        << logs.All();
    // The next start does not try it again.
    step = creator->create_session();
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_EQ(*step, 4);
  }
}

TEST_F(SessionCreatorTest, AnOnlyCheckpointWithABadByteIsQuarantinedAndNoFreshStartFollows) {
  SaveModel({4});
  FlipDataBytes(dir_ + "/model.ckpt-4");
  auto creator = MakeCreator(Options(/*paired=*/false));
  ASSERT_NE(creator, nullptr);
  auto step = creator->create_session();
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), StatusCode::kFailedPrecondition) << step.status().ToString();
  EXPECT_NE(step.status().message().find(dir_ + "/model.ckpt-4.corrupt-"), std::string::npos)
      << step.status().ToString();
  EXPECT_EQ(inits_, 0);
}

TEST_F(SessionCreatorTest, ACheckpointHoldingAnotherStepThanItsNameIsDamageNeverRestored) {
  SaveModel({4});
  fs::rename(dir_ + "/model.ckpt-4", dir_ + "/model.ckpt-8");
  WriteFile(dir_ + "/checkpoint",
            "model_checkpoint_path: \"model.ckpt-8\"\n"
            "all_model_checkpoint_paths: \"model.ckpt-8\"\n");
  LogCapture logs;
  auto creator = MakeCreator(Options(/*paired=*/false));
  ASSERT_NE(creator, nullptr);
  auto step = creator->create_session();
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), StatusCode::kFailedPrecondition) << step.status().ToString();
  EXPECT_NE(logs.All().find("state of step 4"), std::string::npos) << logs.All();
  EXPECT_EQ(QuarantinedIn(dir_), std::set<std::string>{"model.ckpt-8"});
  EXPECT_TRUE(HoldsState(-1));
}

TEST_F(SessionCreatorTest, ARecreationWithNothingToRestoreNeedsAnInitFn) {
  CheckpointSessionCreatorOptions options = Options();
  options.init_fn = nullptr;
  auto creator = MakeCreator(options);
  ASSERT_NE(creator, nullptr);
  auto first = creator->create_session();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(*first, 0);
  auto again = creator->create_session();
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("init_fn"), std::string::npos);
}

TEST_F(SessionCreatorTest, ARecreationAfterFreshStartsStartsAgainBesideTheJobsOwnCheckpoints) {
  auto creator = MakeCreator(Options());
  ASSERT_NE(creator, nullptr);
  auto first = creator->create_session();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  // The job's input saves committed; its model saves are still in flight when it is
  // pre-empted.
  SaveInput(8, 4);
  SetState(5);
  auto again = creator->create_session();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, 0);
  EXPECT_EQ(inits_, 2);
  EXPECT_TRUE(HoldsState(0));
}

TEST_F(SessionCreatorTest, ARecreationAfterARestoreThatFindsNoPairFailsLoudly) {
  SaveModel({0, 4});
  SaveInput(4, 4);
  auto creator = MakeCreator(Options());
  ASSERT_NE(creator, nullptr);
  auto first = creator->create_session();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(*first, 4);
  // Someone removed the model's checkpoints while the job ran.
  fs::remove_all(dir_ + "/model.ckpt-0");
  fs::remove_all(dir_ + "/model.ckpt-4");
  fs::remove(dir_ + "/checkpoint");
  auto again = creator->create_session();
  ASSERT_FALSE(again.ok()) << "started at step " << *again;
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("input.ckpt-4"), std::string::npos)
      << again.status().ToString();
}

TEST_F(SessionCreatorTest, AFailingInitFnFailsTheSessionCreation) {
  CheckpointSessionCreatorOptions options = Options();
  options.init_fn = [] { return Status::Internal("no device memory"); };
  auto creator = MakeCreator(options);
  ASSERT_NE(creator, nullptr);
  auto step = creator->create_session();
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), StatusCode::kInternal);
  EXPECT_NE(step.status().message().find("no device memory"), std::string::npos);
}

TEST_F(SessionCreatorTest, ReadsThroughTheGivenFileSystem) {
  SaveModel({0, 4});
  SaveInput(4, 4);
  auto posix = io::NewPosixFileSystem();
  CountingFileSystem counting(posix.get());
  CheckpointSessionCreatorOptions options = Options();
  options.file_system = &counting;
  auto creator = MakeCreator(options);
  ASSERT_NE(creator, nullptr);
  auto step = creator->create_session();
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(*step, 4);
  EXPECT_GT(counting.opens.load(), 2);  // both state files and the checkpoint's files
}

TEST_F(SessionCreatorTest, CreateRejectsBadOptionsNamingThem) {
  struct Case {
    std::function<void(CheckpointSessionCreatorOptions&)> edit;
    std::string expected;
  };
  const Case cases[] = {
      {[](auto& o) { o.checkpoint_dir.clear(); }, "checkpoint_dir"},
      {[](auto& o) { o.model_basename = "a/b"; }, "model_basename"},
      {[](auto& o) { o.model_basename.clear(); }, "model_basename"},
      {[](auto& o) { o.input_basename = "../input.ckpt"; }, "input_basename"},
      {[](auto& o) { o.input_basename = "model.ckpt"; }, "both 'model.ckpt'"},
  };
  for (const Case& c : cases) {
    CheckpointSessionCreatorOptions options = Options();
    c.edit(options);
    auto creator = CheckpointSessionCreator::Create(options, &registry_);
    ASSERT_FALSE(creator.ok()) << c.expected;
    EXPECT_EQ(creator.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(creator.status().message().find(c.expected), std::string::npos)
        << creator.status().message();
  }
  auto null_registry = CheckpointSessionCreator::Create(Options(), nullptr);
  EXPECT_EQ(null_registry.status().code(), StatusCode::kInvalidArgument);
}

// The creator inside a recoverable session, beside the savers of model and input: a
// pre-emption brings both back to the same step, and the job ends in the state of a straight
// run.
TEST_F(SessionCreatorTest, APreemptedJobResumesModelAndInputOfOneStep) {
  CounterIterator iterator;
  SaverOptions model_options;
  model_options.checkpoint_dir = dir_;
  model_options.save_steps = 3;
  model_options.max_to_keep = 0;
  auto model_hook = CheckpointSaverHook::Create(model_options, &registry_);
  ASSERT_TRUE(model_hook.ok());
  InputPipelineOptions input_options;
  input_options.saver.checkpoint_dir = dir_;
  input_options.saver.save_steps = 3;
  input_options.saver.max_to_keep = 0;
  auto input_hook = CheckpointInputPipelineHook::Create(input_options, &iterator);
  ASSERT_TRUE(input_hook.ok());
  auto creator = MakeCreator(Options());
  ASSERT_NE(creator, nullptr);
  auto session = MonitoredSession::Create({model_hook->get(), input_hook->get()}, creator.get());
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  bool preempted = false;
  Status status = (*session)->run_until(10, [&](StepContext& ctx) {
    // The state must be the one of the step before: model and input of one step.
    EXPECT_TRUE(HoldsState(ctx.step() - 1)) << "step " << ctx.step();
    EXPECT_EQ(iterator.counter, ctx.step() - 1) << "step " << ctx.step();
    SetState(ctx.step());
    ++iterator.counter;
    if (ctx.step() == 8 && !preempted) {
      // The input's save of step 6 is done by then (a save still in flight is not waited
      // for: the session would come back at step 3).
      EXPECT_TRUE((*input_hook)->wait_until_saved().ok());
      preempted = true;
      return Status::Unavailable("pre-empted");
    }
    return Status::OK();
  });
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ((*session)->recoveries(), 1);
  EXPECT_EQ(creator->restored_from(), dir_ + "/model.ckpt-6");
  EXPECT_EQ(input_hook->get()->restored_from(), dir_ + "/input.ckpt-6");
  EXPECT_TRUE(HoldsState(10));
  EXPECT_EQ(iterator.counter, 10);
}

}  // namespace
}  // namespace asyncckpt
