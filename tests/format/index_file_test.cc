// LoadIndex, the one reader of an index file: what it refuses before opening (no index, a symlink,
// a FIFO, an oversized file), an intact index of another format version, and a round trip.

#include "src/format/index_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "src/codec/codec.h"
#include "tests/format/index_test_support.h"
#include "tests/support/files.h"

namespace asyncckpt::format {
namespace {

namespace stdfs = std::filesystem;
using ::testing::HasSubstr;
using testing_support::WriteFile;

class LoadIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (stdfs::path(::testing::TempDir()) / "load_index_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    fs_ = io::NewPosixFileSystem();
  }
  void TearDown() override {
    std::error_code ignored;
    stdfs::remove_all(dir_, ignored);
  }

  std::string IndexFile() const { return IndexPath(dir_); }

  std::string dir_;
  std::unique_ptr<io::FileSystem> fs_;
};

TEST_F(LoadIndexTest, ReadsBackWhatWasEncoded) {
  WriteFile(IndexFile(), EncodeIndex(RichIndex()));
  Result<Index> index = LoadIndex(*fs_, dir_);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->tensors, RichIndex().tensors);
  EXPECT_EQ(index->metadata.wall_time, RichIndex().metadata.wall_time);
}

TEST_F(LoadIndexTest, NoIndexIsNotFoundNamingTheCheckpoint) {
  const Status status = LoadIndex(*fs_, dir_).status();
  EXPECT_EQ(status.code(), StatusCode::kNotFound) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr(dir_));
}

TEST_F(LoadIndexTest, ASymlinkedIndexIsNeverFollowed) {
  const std::string real = dir_ + "/real-index";
  WriteFile(real, EncodeIndex(TinyIndex()));
  ASSERT_EQ(::symlink(real.c_str(), IndexFile().c_str()), 0);
  const Status status = LoadIndex(*fs_, dir_).status();
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("a symlink, not a regular file"));
}

TEST_F(LoadIndexTest, AFifoIsRefusedWithoutBeingOpened) {
  ASSERT_EQ(::mkfifo(IndexFile().c_str(), 0600), 0);
  const Status status = LoadIndex(*fs_, dir_).status();  // would block if it were opened
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("a FIFO, not a regular file"));
}

TEST_F(LoadIndexTest, AnOversizedIndexIsCorruptionBeforeAllocating) {
  WriteFile(IndexFile(), std::string());
  stdfs::resize_file(IndexFile(), kMaxIndexBytes + 1);  // sparse
  const Status status = LoadIndex(*fs_, dir_).status();
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("at most"));
}

TEST_F(LoadIndexTest, AnIntactIndexOfAnotherVersionIsFailedPreconditionADamagedOneCorruption) {
  std::vector<uint8_t> bytes = EncodeIndex(TinyIndex());
  bytes[8] = 2;  // version 2
  WriteFile(IndexFile(), bytes);
  EXPECT_EQ(LoadIndex(*fs_, dir_).status().code(), StatusCode::kCorruption)
      << "the checksum no longer matches: damage, not another version";
  Reseal(&bytes);
  WriteFile(IndexFile(), bytes);
  const Status status = LoadIndex(*fs_, dir_).status();
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("another format version"));
}

TEST_F(LoadIndexTest, MissingOrSpecialDataFilesAreCorruptionNamingThem) {
  WriteFile(IndexFile(), EncodeIndex(TinyIndex()));
  const std::string data = dir_ + "/" + DataFileName(0, 1);
  Status status = LoadIndexCheckingDataFiles(*fs_, dir_).status();
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr(data + " is missing"));
  ASSERT_EQ(::mkfifo(data.c_str(), 0600), 0);
  status = LoadIndexCheckingDataFiles(*fs_, dir_).status();
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("a FIFO, not a regular file"));
  stdfs::remove(data);
  WriteFile(data, std::string(8, 'x'));
  EXPECT_TRUE(LoadIndexCheckingDataFiles(*fs_, dir_).ok());
}

}  // namespace
}  // namespace asyncckpt::format
