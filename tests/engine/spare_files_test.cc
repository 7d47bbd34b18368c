#include "src/engine/spare_files.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "io/fault_injection_file_system.h"
#include "io/posix_file_system.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;

constexpr char kFile0[] = "data-00000-of-00002";
constexpr char kFile1[] = "data-00001-of-00002";

// On /dev/shm, the file system spares are for; the class itself works anywhere.
class SpareFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/dev/shm/spare_files_test-XXXXXX";
    if (mkdtemp(pattern) == nullptr) GTEST_SKIP() << "no /dev/shm here";
    dir_ = pattern;
    posix_ = io::NewPosixFileSystem();
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  std::vector<std::string> Entries(const std::string& dir) const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
  static void WriteFile(const std::string& path, size_t bytes) {
    std::ofstream(path) << std::string(bytes, 'x');
  }
  // A dropped checkpoint as retention renames it: data files beside its index.
  std::string DroppedTree(const std::string& name, bool with_file1 = true) const {
    const std::string tree = dir_ + "/" + name;
    fs::create_directory(tree);
    WriteFile(tree + "/" + kFile0, 5000);
    if (with_file1) WriteFile(tree + "/" + kFile1, 7000);
    WriteFile(tree + "/index", 100);
    return tree;
  }
  static ino_t Inode(const std::string& path) {
    struct stat st {};
    EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
    return st.st_ino;
  }

  std::string dir_;
  std::unique_ptr<io::FileSystem> posix_;
};

TEST_F(SpareFilesTest, NothingIsKeptBeforeASaveIsNoted) {
  SpareFiles spares(posix_.get());
  const std::string tree = DroppedTree("model.ckpt-1.deleting-0123456789abcdef");
  EXPECT_FALSE(spares.Adopt(tree));
  EXPECT_EQ(Entries(tree), (std::vector<std::string>{kFile0, kFile1, "index"}));
  EXPECT_FALSE(spares.held());
  fs::create_directory(dir_ + "/tmp");
  EXPECT_FALSE(spares.TakeInto(dir_ + "/tmp", 2));
  EXPECT_TRUE(Entries(dir_ + "/tmp").empty());
}

TEST_F(SpareFilesTest, AdoptKeepsOnlyTheDataFilesThatTheNextSaveTakesOver) {
  SpareFiles spares(posix_.get());
  spares.NoteSave(2);
  const std::string tree = DroppedTree("model.ckpt-1.deleting-0123456789abcdef");
  const ino_t inode = Inode(tree + "/" + kFile1);
  ASSERT_TRUE(spares.Adopt(tree));
  EXPECT_EQ(Entries(tree), (std::vector<std::string>{kFile0, kFile1}));
  EXPECT_EQ(spares.held(), tree);
  // One spare at a time: the next dropped tree is left to its remover.
  const std::string second = DroppedTree("model.ckpt-2.deleting-0123456789abcdef");
  EXPECT_FALSE(spares.Adopt(second));
  EXPECT_EQ(Entries(second), (std::vector<std::string>{kFile0, kFile1, "index"}));

  const std::string tmp = dir_ + "/model.ckpt-3.tmp-0123456789abcdef";
  fs::create_directory(tmp);
  ASSERT_TRUE(spares.TakeInto(tmp, 2));
  EXPECT_EQ(Entries(tmp), (std::vector<std::string>{kFile0, kFile1}));
  EXPECT_EQ(Inode(tmp + "/" + kFile1), inode);
  EXPECT_EQ(fs::file_size(tmp + "/" + kFile0), 5000u);  // the save trims it at its commit
  EXPECT_FALSE(fs::exists(tree));
  EXPECT_FALSE(spares.held());
  EXPECT_FALSE(spares.TakeInto(tmp, 2));
}

TEST_F(SpareFilesTest, AdoptRefusesATreeWithoutEveryDataFile) {
  SpareFiles spares(posix_.get());
  spares.NoteSave(2);
  const std::string tree = DroppedTree("model.ckpt-1.deleting-0123456789abcdef", false);
  EXPECT_FALSE(spares.Adopt(tree));
  EXPECT_EQ(Entries(tree), (std::vector<std::string>{kFile0, "index"}));
  EXPECT_FALSE(spares.held());
}

TEST_F(SpareFilesTest, TakeIntoRefusesAnotherNumberOfDataFiles) {
  SpareFiles spares(posix_.get());
  spares.NoteSave(2);
  const std::string tree = DroppedTree("model.ckpt-1.deleting-0123456789abcdef");
  ASSERT_TRUE(spares.Adopt(tree));
  const std::string tmp = dir_ + "/model.ckpt-3.tmp-0123456789abcdef";
  fs::create_directory(tmp);
  EXPECT_FALSE(spares.TakeInto(tmp, 3));
  EXPECT_TRUE(Entries(tmp).empty());
  EXPECT_EQ(spares.held(), tree);
}

TEST_F(SpareFilesTest, AFailedMoveLeavesTheSaveToTruncateWhatCameAndRemovesTheSpare) {
  io::FaultInjectionFileSystem faulty(posix_.get());
  SpareFiles spares(&faulty);
  spares.NoteSave(2);
  const std::string tree = DroppedTree("model.ckpt-1.deleting-0123456789abcdef");
  ASSERT_TRUE(spares.Adopt(tree));
  faulty.fail_ops_matching(kFile1, EIO, io::FaultOp::kRename);
  const std::string tmp = dir_ + "/model.ckpt-3.tmp-0123456789abcdef";
  fs::create_directory(tmp);
  EXPECT_FALSE(spares.TakeInto(tmp, 2));
  EXPECT_FALSE(fs::exists(tree));
  EXPECT_FALSE(spares.held());
}

TEST_F(SpareFilesTest, TheSpareGoesWithItsOwner) {
  {
    SpareFiles spares(posix_.get());
    spares.NoteSave(2);
    ASSERT_TRUE(spares.Adopt(DroppedTree("model.ckpt-1.deleting-0123456789abcdef")));
  }
  EXPECT_TRUE(Entries(dir_).empty());
}

}  // namespace
}  // namespace asyncckpt
