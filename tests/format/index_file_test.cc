// LoadIndex, the one reader of an index file: what it refuses before opening (no index, a symlink,
// a FIFO, an oversized file), an intact index of another format version, and a round trip; and
// CheckChunkLocations: every chunk inside its data file, no two sharing a stored byte.

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
  EXPECT_THAT(status.message(), HasSubstr("format version 2 by a newer release"));
}

TEST_F(LoadIndexTest, AnIntactIndexWithUnknownFlagsIsFailedPreconditionNotCorruption) {
  std::vector<uint8_t> bytes = EncodeIndex(TinyIndex());
  bytes[12] |= 4;  // a flag a newer release may add within version 1
  Reseal(&bytes);
  WriteFile(IndexFile(), bytes);
  const Status status = LoadIndex(*fs_, dir_).status();
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("flags 0x4 by a newer release"));
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

// ---- CheckChunkLocations ----------------------------------------------------------------------

TEST(ChunkLocationsTest, DataFilesLongerThanTheirChunksAreAccepted) {
  // O_DIRECT writers may leave padding after the last chunk.
  EXPECT_TRUE(
      ParseAndLocate(EncodeIndex(RichIndex()), kPath, std::vector<uint64_t>{4096, 4096, 4096})
          .ok());
}

TEST(ChunkLocationsTest, ChunkBeyondDataFileIsCorruptionNamingFileTensorChunk) {
  const std::vector<uint8_t> bytes = EncodeIndex(RichIndex());
  std::vector<uint64_t> sizes = RichSizes();
  sizes[0] = 14;  // chunk 2 of layer/0/weights ends at 15
  ExpectCorruption(
      ParseAndLocate(bytes, kPath, sizes).status(),
      {"tensor 'layer/0/weights' chunk 2", "data-00000-of-00003", "holds only 14 bytes"});
}

TEST(ChunkLocationsTest, ChunkOffsetOverflowIsCorruption) {
  Index index = TinyIndex();
  index.tensors[0].chunks[0].file_offset = UINT64_MAX - 3;
  ExpectCorruption(Decode(EncodeIndex(index)), {"tensor 'a' chunk 0", "holds only"});
}

TEST(ChunkLocationsTest, WrongNumberOfDataFileSizesIsCorruption) {
  ExpectCorruption(
      ParseAndLocate(EncodeIndex(RichIndex()), kPath, std::vector<uint64_t>{100, 100}).status(),
      {"names 3 data files, but 2 were found"});
}

TEST(ChunkLocationsTest, ParseIndexSkipsOnlyTheDataFileChecks) {
  const std::vector<uint8_t> bytes = EncodeIndex(RichIndex());
  Result<Index> parsed = ParseIndex(bytes, kPath);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(CheckChunkLocations(*parsed, kPath, std::vector<uint64_t>{0, 0, 0}).code(),
            StatusCode::kCorruption);
  EXPECT_TRUE(CheckChunkLocations(*parsed, kPath, RichSizes()).ok());
}

TEST(ChunkLocationsTest, ChunksOfTwoTensorsSharingStoredBytesAreCorruptionNamingBoth) {
  Index index = RichIndex();
  // "flags" chunk 0 moves onto the last 2 bytes of "layer/0/weights" chunk 1 in data file 1.
  index.tensors[3].chunks[0].file_offset = 22;
  ExpectCorruption(ParseAndLocate(EncodeIndex(index), kPath, RichSizes()).status(),
                   {"tensor 'layer/0/weights' chunk 1 and tensor 'flags' chunk 0",
                    "share stored bytes [22, 24) of data-00001-of-00003"});
}

TEST(ChunkLocationsTest, ChunksOfOneTensorSharingOneFrameAreCorruption) {
  // The hostile shape: many chunks that all point at the same small, highly compressible frame.
  Index index = TinyIndex();
  index.tensors[0].shape = {3 << 20};
  index.tensors[0].bytes = 12ull << 20;
  index.tensors[0].chunks.clear();
  for (uint64_t i = 0; i < 3; ++i) {
    index.tensors[0].chunks.push_back(
        Chunk(i << 22, 0, 0, 200, 4ull << 20, codec::Codec::kZstd, 1));
  }
  ExpectCorruption(Decode(EncodeIndex(index)),
                   {"tensor 'a' chunk 0 and tensor 'a' chunk 1", "share stored bytes [0, 200)"});
}

TEST(ChunkLocationsTest, AChunkInsideAnotherChunkIsCorruption) {
  Index index = RichIndex();
  // "scalar" (8 bytes) moves inside "layer/0/weights" chunk 0, bytes [0, 10) of data file 0.
  index.tensors[0].chunks[0].file_index = 0;
  index.tensors[0].chunks[0].file_offset = 1;
  ExpectCorruption(ParseAndLocate(EncodeIndex(index), kPath, RichSizes()).status(),
                   {"tensor 'layer/0/weights' chunk 0 and tensor 'scalar' chunk 0",
                    "share stored bytes [1, 9)"});
}

TEST(ChunkLocationsTest, ChunksBackToBackAndInDifferentFilesAtTheSameOffsetAreAccepted) {
  // RichIndex has both: chunks ending where the next begins, and chunks at offset 0 of each file.
  EXPECT_TRUE(ParseAndLocate(EncodeIndex(RichIndex()), kPath, RichSizes()).ok());
}

}  // namespace
}  // namespace asyncckpt::format
