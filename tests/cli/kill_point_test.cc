// Unit tests of train-sim's --kill_at (src/cli/kill_point.h): the value's form, which operation
// on which name a point hits, and that the file system kills its process exactly there, after
// the operations before it and before the one it names.

#include "src/cli/kill_point.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

namespace asyncckpt::cli {
namespace {

TEST(KillPointTest, ParsesRankOperationAndPrefix) {
  auto point = ParseKillPoint("2:rename:input_worker_2.ckpt-10");
  ASSERT_TRUE(point.ok()) << point.status().ToString();
  EXPECT_EQ(point->rank, 2);
  EXPECT_EQ(point->operation, "rename");
  EXPECT_EQ(point->name_prefix, "input_worker_2.ckpt-10");
  for (const char* bad :
       {"", "2", "2:rename", "2:rename:", "x:rename:a", "-1:rename:a", "2:move:a", "2 :rename:a"}) {
    auto parsed = ParseKillPoint(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.status().message().find(std::string("got '") + bad + "'"), std::string::npos)
        << parsed.status().ToString();
  }
}

TEST(KillPointTest, HitsTheOperationOnANameStartingWithThePrefix) {
  const KillPoint point{0, "rename", "model.ckpt-20"};
  EXPECT_TRUE(KillPointHits(point, "rename", "/d/model.ckpt-20"));
  EXPECT_TRUE(KillPointHits(point, "rename", "/d/model.ckpt-20.deleting-00ff"));
  EXPECT_FALSE(KillPointHits(point, "remove", "/d/model.ckpt-20"));
  // The name, not the path: a part renamed inside the save's temporary directory is no hit.
  EXPECT_FALSE(KillPointHits(point, "rename", "/d/model.ckpt-20.tmp-00ff/index.claimed-00001"));
  EXPECT_FALSE(KillPointHits(point, "rename", "/d/model.ckpt-2"));
}

TEST(KillPointTest, KillsItsProcessBeforeTheOperationItNames) {
  const std::string dir = ::testing::TempDir() + "/kill_point_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/a");
  std::filesystem::create_directories(dir + "/c");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto posix = io::NewPosixFileSystem();
    auto fs = NewKillPointFileSystem(posix.get(), {0, "rename", "b"});
    (void)fs->rename(dir + "/c", dir + "/d");  // not hit: done
    (void)fs->rename(dir + "/a", dir + "/b");  // hit: killed before it
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  EXPECT_TRUE(std::filesystem::exists(dir + "/d"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/a"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/b"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace asyncckpt::cli
