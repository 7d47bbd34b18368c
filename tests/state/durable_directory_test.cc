// Tests of src/state/durable_directory.cc: CommitDirectory, step by step and when a step fails.

#include "src/state/durable_directory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"
#include "io/fault_injection_file_system.h"
#include "src/util/log.h"
#include "tests/state/checkpoint_state_fixture.h"

namespace asyncckpt {
namespace {

using namespace state_testing;  // NOLINT(build/namespaces): the shared fixture
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// The shared fixture, named after the unit these tests cover.
class DurableDirectoryTest : public StateDirTest {};

// ---- commit helpers -----------------------------------------------------------------------------

TEST_F(DurableDirectoryTest, CommitDirectoryRenamesIntoPlace) {
  const std::string tmp = TempDirName("model.ckpt-1");
  MakeCheckpointDir(tmp, "new");
  ASSERT_TRUE(CommitDirectory(*faulty_, dir_, tmp, "model.ckpt-1").ok());
  EXPECT_THAT(Entries(), UnorderedElementsAre("model.ckpt-1"));
  EXPECT_EQ(ReadText("model.ckpt-1/index"), "new");
  EXPECT_THAT(faulty_->ops(),
              ElementsAre("sync_dir " + Path(tmp), "rename " + Path(tmp), "sync_dir " + dir_));
}

TEST_F(DurableDirectoryTest, CommitDirectoryReplacesExistingFinalAtomically) {
  MakeCheckpointDir("model.ckpt-1", "old");
  const std::string tmp = TempDirName("model.ckpt-1");
  MakeCheckpointDir(tmp, "new");
  ASSERT_TRUE(CommitDirectory(*faulty_, dir_, tmp, "model.ckpt-1").ok());
  EXPECT_THAT(Entries(), UnorderedElementsAre("model.ckpt-1"));
  EXPECT_EQ(ReadText("model.ckpt-1/index"), "new");
  // The old copy leaves for a ".deleting-" name, and the swap and that rename are made durable
  // before it is removed.
  const std::vector<std::string> ops = faulty_->ops();
  ASSERT_EQ(ops.size(), 5u);
  EXPECT_EQ(ops[0], "sync_dir " + Path(tmp));
  EXPECT_EQ(ops[1], "exchange " + Path(tmp));
  EXPECT_EQ(ops[2], "rename " + Path(tmp));
  EXPECT_EQ(ops[3], "sync_dir " + dir_);
  EXPECT_THAT(ops[4], HasSubstr("remove_tree " + Path("model.ckpt-1.deleting-")));
}

TEST_F(DurableDirectoryTest, CommitDirectoryFallsBackWhenExchangeIsUnsupported) {
  MakeCheckpointDir("model.ckpt-1", "old");
  const std::string tmp = TempDirName("model.ckpt-1");
  MakeCheckpointDir(tmp, "new");
  faulty_->set_fault(
      [](const std::string& op, const std::string&) { return op == "exchange" ? ENOSYS : 0; });
  ASSERT_TRUE(CommitDirectory(*faulty_, dir_, tmp, "model.ckpt-1").ok());
  EXPECT_THAT(Entries(), UnorderedElementsAre("model.ckpt-1"));
  EXPECT_EQ(ReadText("model.ckpt-1/index"), "new");
  const std::vector<std::string> ops = faulty_->ops();
  ASSERT_EQ(ops.size(), 6u);
  EXPECT_EQ(ops[2], "rename " + Path("model.ckpt-1"));
  EXPECT_EQ(ops[3], "rename " + Path(tmp));
  EXPECT_EQ(ops[4], "sync_dir " + dir_);
  EXPECT_THAT(ops[5], HasSubstr("remove_tree " + Path("model.ckpt-1.deleting-")));
}

TEST_F(DurableDirectoryTest, CommitDirectoryFallbackRestoresOldCopyWhenSecondRenameFails) {
  MakeCheckpointDir("model.ckpt-1", "old");
  const std::string tmp = TempDirName("model.ckpt-1");
  MakeCheckpointDir(tmp, "new");
  const std::string tmp_path = Path(tmp);
  faulty_->set_fault([tmp_path](const std::string& op, const std::string& path) {
    if (op == "exchange") return EINVAL;
    return op == "rename" && path == tmp_path ? EIO : 0;
  });
  EXPECT_EQ(CommitDirectory(*faulty_, dir_, tmp, "model.ckpt-1").code(), StatusCode::kIOError);
  EXPECT_EQ(ReadText("model.ckpt-1/index"), "old");
  EXPECT_THAT(Entries(), UnorderedElementsAre("model.ckpt-1", tmp));
}

TEST_F(DurableDirectoryTest, CommitDirectoryReportsAFailedSwap) {
  MakeCheckpointDir("model.ckpt-1", "old");
  const std::string tmp = TempDirName("model.ckpt-1");
  MakeCheckpointDir(tmp, "new");
  faulty_->set_fault(
      [](const std::string& op, const std::string&) { return op == "exchange" ? EIO : 0; });
  EXPECT_EQ(CommitDirectory(*faulty_, dir_, tmp, "model.ckpt-1").code(), StatusCode::kIOError);
  EXPECT_EQ(ReadText("model.ckpt-1/index"), "old");
}

TEST_F(DurableDirectoryTest, CommitDirectoryRefusesNamesThatArePaths) {
  EXPECT_EQ(CommitDirectory(*posix_, dir_, "../x", "y").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CommitDirectory(*posix_, dir_, "x", "a/y").code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace asyncckpt
