// Tests of src/state/commit_checkpoint.cc: the tail of a save commits and records the checkpoint,
// or leaves nothing visible when a step before the commit fails.

#include "src/state/commit_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"
#include "io/fault_injection_file_system.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;

class CommitCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/commit_checkpoint_test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    posix_ = io::NewPosixFileSystem();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A temporary directory holding one data file with `bytes`, padded by `padding` zeros.
  CommitRequest Prepare(io::FileSystem& fs, const std::string& bytes, uint64_t padding) {
    CommitRequest request;
    request.checkpoint_dir = dir_;
    request.final_name = "model.ckpt-7";
    request.tmp_name = TempDirName(request.final_name);
    EXPECT_TRUE(fs.create_dir(dir_ + "/" + request.tmp_name).ok());
    std::unique_ptr<io::File> file;
    EXPECT_TRUE(fs.open(dir_ + "/" + request.tmp_name + "/data-00000-of-00001",
                        io::OpenOptions{.write = true, .create = true, .truncate = true}, &file)
                    .ok());
    const std::string written = bytes + std::string(padding, '\0');
    EXPECT_TRUE(file->write_at(0, written.data(), written.size()).ok());
    request.data_files.push_back({std::move(file), bytes.size(), written.size()});
    request.index_name = "index";
    index_ = {1, 2, 3};
    request.index_bytes = index_;
    request.wall_time = 1.7e9;
    return request;
  }

  std::string dir_;
  std::unique_ptr<io::FileSystem> posix_;
  std::vector<uint8_t> index_;
};

TEST_F(CommitCheckpointTest, CommitsTrimsAndRecordsTheCheckpoint) {
  CheckpointManager manager(posix_.get(), dir_, "model.ckpt", 0, 0, SystemClockSeconds);
  CommitResult result = CommitCheckpoint(*posix_, manager, Prepare(*posix_, "payload", 4089));
  ASSERT_TRUE(result.status.ok()) << result.status.ToString();
  EXPECT_TRUE(result.committed);
  EXPECT_EQ(fs::file_size(dir_ + "/model.ckpt-7/data-00000-of-00001"), 7u);
  EXPECT_EQ(fs::file_size(dir_ + "/model.ckpt-7/index"), 3u);
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, dir_ + "/model.ckpt-7");
}

TEST_F(CommitCheckpointTest, AFailedSyncLeavesNothingVisibleAndNoTemporary) {
  io::FaultInjectionFileSystem faulty(posix_.get());
  CheckpointManager manager(&faulty, dir_, "model.ckpt", 0, 0, SystemClockSeconds);
  CommitRequest request = Prepare(faulty, "payload", 0);
  faulty.fail_ops_matching("data-", EIO, io::FaultOp::kSync);
  CommitResult result = CommitCheckpoint(faulty, manager, std::move(request));
  EXPECT_FALSE(result.status.ok());
  EXPECT_FALSE(result.committed);
  EXPECT_NE(result.status.message().find("model.ckpt-7"), std::string::npos);
  EXPECT_TRUE(fs::is_empty(dir_)) << "the temporary directory stayed";
}

}  // namespace
}  // namespace asyncckpt
