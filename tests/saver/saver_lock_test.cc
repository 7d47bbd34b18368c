// SaverStorage's directory lock, as the hooks meet it: one writer per state file (whatever its
// basename), refused before anything of the holder's is touched, released by end() and by
// destruction; the model's and the input pipeline's hooks of one job side by side.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/checkpointer.h"
#include "asyncckpt/file_system.h"
#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/session.h"
#include "io/fault_injection_file_system.h"
#include "src/saver/saver_storage.h"
#include "tests/io/gated_file_system.h"
#include "tests/support/counting_iterator.h"
#include "tests/support/files.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using testing_support::CountingIterator;
using testing_support::GatedFileSystem;
using testing_support::ReadFile;

// Every entry below `dir` (relative paths) with its size, to prove a refused hook changed
// nothing.
std::map<std::string, uintmax_t> Snapshot(const std::string& dir) {
  std::map<std::string, uintmax_t> entries;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string name = fs::relative(entry.path(), dir).string();
    entries[name] = entry.is_regular_file() ? entry.file_size() : 0;
  }
  return entries;
}

class SaverLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/saver_lock_test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
    weights_.assign(4096, 1.5f);
    ASSERT_TRUE(registry_
                    .add({"weights",
                          DType::kF32,
                          {4096},
                          weights_.data(),
                          weights_.size() * sizeof(float),
                          nullptr,
                          {},
                          {}})
                    .ok());
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    holder_ = "is held by pid " + std::to_string(::getpid()) + " on host " + host;
  }
  void TearDown() override { fs::remove_all(dir_); }

  SaverOptions Options(io::FileSystem* file_system = nullptr) const {
    SaverOptions options;
    options.checkpoint_dir = dir_;
    options.save_steps = 1;
    options.max_to_keep = 0;
    // One chunk in one data file: a save is one write, so a gated save is entirely at rest.
    options.chunk_bytes = 1 << 20;
    options.num_data_files = 1;
    options.staging_bytes = 0;  // one whole snapshot: a save never waits for its own writes
    options.file_system = file_system;
    return options;
  }

  std::unique_ptr<AsyncCheckpointSaverHook> AsyncHook(const SaverOptions& options) {
    auto hook = AsyncCheckpointSaverHook::Create(options, &registry_);
    EXPECT_TRUE(hook.ok()) << hook.status().ToString();
    return hook.ok() ? std::move(*hook) : nullptr;
  }

  // The refusal a hook gets while this process holds the lock of state file `state_file`.
  void ExpectRefused(const Status& status, const std::string& state_file) {
    EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status.ToString();
    EXPECT_NE(status.message().find("checkpoint_dir " + dir_ + " is in use by another job: " +
                                    dir_ + "/" + state_file + ".lock " + holder_),
              std::string::npos)
        << status.ToString();
  }

  std::string dir_;
  std::string holder_;
  std::vector<float> weights_;
  TensorRegistry registry_;
};

TEST(DirectoryLockFileNameTest, IsNeitherACheckpointNorATemporary) {
  EXPECT_EQ(DirectoryLockFileName("checkpoint"), "checkpoint.lock");
  EXPECT_EQ(DirectoryLockFileName("checkpoint_input_worker_1"), "checkpoint_input_worker_1.lock");
}

TEST_F(SaverLockTest, SecondHookOfTheSameBasenameIsRefusedAndTouchesNothingOfTheFirst) {
  // The first hook's save of step 0 stays in flight, its temporary on disk, until the gate
  // opens.
  GatedFileSystem gated(io::NewPosixFileSystem());
  auto first = AsyncHook(Options(&gated));
  ASSERT_TRUE(first->begin().ok());
  ASSERT_TRUE(first->after_create_session(0).ok());
  gated.WaitForWaiting(1);
  const auto before = Snapshot(dir_);
  bool temporary = false;
  for (const auto& [name, size] : before) temporary |= name.find(".tmp-") != std::string::npos;
  ASSERT_TRUE(temporary) << "the first save has no temporary to protect";

  auto second = AsyncHook(Options());
  ExpectRefused(second->begin(), "checkpoint");
  EXPECT_EQ(Snapshot(dir_), before) << "the refused hook changed the directory";
  // Nor does the synchronous saver get in.
  auto sync = CheckpointSaverHook::Create(Options(), &registry_);
  ASSERT_TRUE(sync.ok());
  ExpectRefused((*sync)->begin(), "checkpoint");
  second.reset();
  sync->reset();

  gated.Open();
  ASSERT_TRUE(first->end(0).ok());
  auto reader = CheckpointReader::Open(dir_ + "/model.ckpt-0");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_TRUE((*reader)->verify().problems.empty());
  EXPECT_EQ(ReadFile(dir_ + "/checkpoint.lock"), "") << "end() leaves the file empty";

  // end() released the lock: the next hook starts.
  auto third = AsyncHook(Options());
  Status begun = third->begin();
  EXPECT_TRUE(begun.ok()) << begun.ToString();
  EXPECT_EQ(ReadFile(dir_ + "/checkpoint.lock").rfind("pid=" + std::to_string(::getpid()), 0), 0u);
}

TEST_F(SaverLockTest, ModelAndInputHooksOfOneJobShareTheDirectory) {
  auto model = AsyncHook(Options());
  CountingIterator iterator;
  InputPipelineOptions input_options;
  input_options.saver.checkpoint_dir = dir_;
  input_options.saver.save_steps = 1;
  auto input = CheckpointInputPipelineHook::Create(input_options, &iterator);
  ASSERT_TRUE(input.ok()) << input.status().ToString();
  auto session = SingularMonitoredSession::Create({model.get(), input->get()});
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  EXPECT_TRUE(fs::exists(dir_ + "/checkpoint.lock"));
  EXPECT_TRUE(fs::exists(dir_ + "/checkpoint_input.lock"));
  Status ran = (*session)->run_until(3, [&](StepContext&) {
    iterator.Next();
    return Status::OK();
  });
  ASSERT_TRUE(ran.ok()) << ran.ToString();
  ASSERT_TRUE((*session)->close().ok());
  for (int64_t step = 0; step <= 3; ++step) {
    EXPECT_TRUE(fs::exists(dir_ + "/model.ckpt-" + std::to_string(step))) << step;
    EXPECT_TRUE(fs::exists(dir_ + "/input.ckpt-" + std::to_string(step))) << step;
  }
}

TEST_F(SaverLockTest, AnotherBasenameWritingTheSameStateFileIsRefusedAndDropsNothing) {
  auto first = AsyncHook(Options());
  ASSERT_TRUE(first->begin().ok());
  ASSERT_TRUE(first->after_create_session(0).ok());
  SaverOptions other = Options();
  other.basename = "other.ckpt";
  auto second = AsyncHook(other);
  ExpectRefused(second->begin(), "checkpoint");
  // The Checkpointer (the Python manager's saver) too.
  ExpectRefused(Checkpointer::Create(other).status(), "checkpoint");
  ASSERT_TRUE(first->end(0).ok());
  EXPECT_NE(ReadFile(dir_ + "/checkpoint").find("model.ckpt-0"), std::string::npos);

  // Once the first job is gone the other basename may write the state file, and keeps the
  // model's entries in it.
  second = AsyncHook(other);
  ASSERT_TRUE(second->begin().ok());
  ASSERT_TRUE(second->after_create_session(7).ok());
  ASSERT_TRUE(second->end(7).ok());
  const std::string state = ReadFile(dir_ + "/checkpoint");
  EXPECT_NE(state.find("model.ckpt-0"), std::string::npos) << state;
  EXPECT_NE(state.find("other.ckpt-7"), std::string::npos) << state;
}

TEST_F(SaverLockTest, DestroyingAHookWithoutEndReleasesTheLock) {
  auto first = AsyncHook(Options());
  ASSERT_TRUE(first->begin().ok());
  ASSERT_TRUE(first->after_create_session(0).ok());
  first.reset();
  auto second = AsyncHook(Options());
  Status begun = second->begin();
  EXPECT_TRUE(begun.ok()) << begun.ToString();
}

TEST_F(SaverLockTest, LockIsTakenThroughTheSeamBeforeAnyCleanUp) {
  const std::string stale = dir_ + "/model.ckpt-3.tmp-0123456789abcdef";
  fs::create_directory(stale);
  auto base = io::NewPosixFileSystem();
  io::FaultInjectionFileSystem faulty(base.get());
  faulty.fail_ops_matching("checkpoint.lock", ENOLCK, io::FaultOp::kLock);
  auto hook = AsyncHook(Options(&faulty));
  Status begun = hook->begin();
  EXPECT_EQ(begun.code(), StatusCode::kIOError) << begun.ToString();
  EXPECT_NE(begun.message().find("locking checkpoint_dir " + dir_), std::string::npos)
      << begun.ToString();
  EXPECT_NE(begun.message().find(std::strerror(ENOLCK)), std::string::npos) << begun.ToString();
  EXPECT_TRUE(fs::exists(stale)) << "cleaned up without holding the lock";
}

TEST_F(SaverLockTest, AStartThatFailsAfterLockingReleasesTheLock) {
  // A state file that cannot be read fails the start (a removal that fails is only logged).
  std::ofstream(dir_ + "/checkpoint") << "model_checkpoint_path: \"model.ckpt-1\"\n";
  auto base = io::NewPosixFileSystem();
  io::FaultInjectionFileSystem faulty(base.get());
  faulty.fail_ops_matching("/checkpoint", EIO, io::FaultOp::kRead);
  auto hook = AsyncHook(Options(&faulty));
  Status begun = hook->begin();
  ASSERT_FALSE(begun.ok()) << "reading the state file was meant to fail";
  auto next = AsyncHook(Options());
  begun = next->begin();
  EXPECT_TRUE(begun.ok()) << "a failed start kept the lock: " << begun.ToString();
}

}  // namespace
}  // namespace asyncckpt
