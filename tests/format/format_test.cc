// The index format: names, the pinned layout, round trips, and every way a damaged or hostile
// index is refused as Corruption. Its chunks against their data files: index_file_test.cc.

#include "src/format/format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tests/format/index_test_support.h"

namespace asyncckpt::format {
namespace {

using ::testing::HasSubstr;

TEST(FormatNamesTest, DirectoryAndDataFileNames) {
  EXPECT_EQ(CheckpointDirName("model.ckpt", 1000), "model.ckpt-1000");
  EXPECT_EQ(CheckpointDirName("m", 0), "m-0");
  EXPECT_EQ(DataFileName(0, 2), "data-00000-of-00002");
  EXPECT_EQ(DataFileName(12, 345), "data-00012-of-00345");
  EXPECT_EQ(DataFileName(65535, 65536), "data-65535-of-65536");
}

TEST(IndexFormatTest, MagicNumbersSpellTheirNames) {
  const std::vector<uint8_t> bytes = EncodeIndex(TinyIndex());
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 8), "ACKPTIDX");
  EXPECT_EQ(std::string(bytes.end() - 8, bytes.end()), "ACKPTEND");
  EXPECT_EQ(bytes[8], kFormatVersion);
}

TEST(IndexFormatTest, TinyIndexHasThePinnedLayout) {
  const std::vector<uint8_t> bytes = EncodeIndex(TinyIndex());
  ASSERT_EQ(bytes.size(), kTinySize);
  EXPECT_EQ(bytes[kNumFilesAt], 1);
  EXPECT_EQ(bytes[kNumTensorsAt], 1);
  EXPECT_EQ(bytes[kNameLengthAt], 1);
  EXPECT_EQ(bytes[kNameLengthAt + 4], 'a');
  EXPECT_EQ(bytes[kRankAt], 1);
  EXPECT_EQ(Load64(bytes, kNumChunksAt), 1u);
  EXPECT_EQ(Load64(bytes, bytes.size() - kIndexFooterBytes),
            kTinySize - kIndexHeaderBytes - kIndexFooterBytes);
}

TEST(IndexFormatTest, RoundTripKeepsEverything) {
  const Index index = RichIndex();
  Result<Index> decoded = ParseAndLocate(EncodeIndex(index), kPath, RichSizes());
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->metadata.step, index.metadata.step);
  EXPECT_EQ(decoded->metadata.wall_time, index.metadata.wall_time);
  EXPECT_EQ(decoded->metadata.user, index.metadata.user);
  EXPECT_EQ(decoded->num_data_files, index.num_data_files);
  EXPECT_EQ(decoded->tensors, index.tensors);
}

TEST(IndexFormatTest, EveryTruncationIsCorruption) {
  const std::vector<uint8_t> bytes = EncodeIndex(RichIndex());
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    Status status = ParseAndLocate(prefix, kPath, RichSizes()).status();
    ASSERT_EQ(status.code(), StatusCode::kCorruption) << "prefix of " << n << " bytes";
    ASSERT_THAT(status.message(), HasSubstr(kPath));
  }
}

TEST(IndexFormatTest, EveryBitFlipIsCorruption) {
  const std::vector<uint8_t> bytes = EncodeIndex(RichIndex());
  for (size_t at = 0; at < bytes.size(); ++at) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> bad = bytes;
      bad[at] ^= static_cast<uint8_t>(1 << bit);
      Status status = ParseAndLocate(bad, kPath, RichSizes()).status();
      ASSERT_EQ(status.code(), StatusCode::kCorruption) << "byte " << at << " bit " << bit;
      const bool in_magic = at < 8 || at >= bytes.size() - 8;
      ASSERT_THAT(status.message(), HasSubstr(in_magic ? "magic" : "checksum mismatch"))
          << "byte " << at << " bit " << bit;
    }
  }
}

TEST(IndexFormatTest, TrailingGarbageIsCorruption) {
  std::vector<uint8_t> bytes = EncodeIndex(TinyIndex());
  bytes.push_back(0);
  ExpectCorruption(Decode(bytes), {"magic"});
}

TEST(IndexFormatTest, WrongMagicIsCorruption) {
  std::vector<uint8_t> bytes = EncodeIndex(TinyIndex());
  std::memcpy(bytes.data(), "NOTINDEX", 8);
  Reseal(&bytes);
  ExpectCorruption(Decode(bytes), {"bad magic"});
}

// An intact index (its checksum right) of a version or with flags this build does not know is a
// newer release's checkpoint: FailedPrecondition saying so, never Corruption (which start-up
// quarantines). Damage to those bytes fails the checksum first (EveryBitFlipIsCorruption).
TEST(IndexFormatTest, AnotherVersionIsANewerReleasesCheckpointNotCorruption) {
  const Status status = Decode(Patched(TinyIndex(), 8, 2, 4));
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("format version 2 by a newer release"));
  EXPECT_THAT(status.message(), HasSubstr("this build reads version 1"));
}

TEST(IndexFormatTest, UnknownFlagsAreANewerReleasesCheckpointNotCorruption) {
  for (const uint32_t flags : {2u, 3u, 0x80000000u}) {
    const Status status = Decode(Patched(TinyIndex(), 12, flags, 4));
    EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr("version 1 with flags 0x"));
    EXPECT_THAT(status.message(), HasSubstr("by a newer release of asyncckpt"));
  }
}

TEST(IndexFormatTest, TheShardedFlagOnAnUnshardedBodyIsCorruption) {
  // The tensor count is then read as the world size, and what follows no longer parses.
  EXPECT_EQ(Decode(Patched(TinyIndex(), 12, kIndexFlagSharded, 4)).code(), StatusCode::kCorruption);
}

TEST(IndexFormatTest, FooterBodyLengthMismatchIsCorruption) {
  std::vector<uint8_t> bytes = EncodeIndex(TinyIndex());
  Store(&bytes, bytes.size() - kIndexFooterBytes, 5, 8);
  Reseal(&bytes);
  ExpectCorruption(Decode(bytes), {"footer says the body is 5 bytes"});
}

TEST(IndexFormatTest, OversizedCountsAreRejectedBeforeAllocating) {
  ExpectCorruption(Decode(Patched(TinyIndex(), kNumUserAt, 0xFFFFFFFF, 4)),
                   {"claims 4294967295 metadata entries"});
  ExpectCorruption(Decode(Patched(TinyIndex(), kNumTensorsAt, 0xFFFFFFFF, 4)),
                   {"claims 4294967295 tensors"});
  ExpectCorruption(Decode(Patched(TinyIndex(), kNumChunksAt, 1ULL << 60, 8)),
                   {"tensor 'a'", "claims 1152921504606846976 chunks"});
  // Two chunk records would need 45 more bytes than the body holds.
  ExpectCorruption(Decode(Patched(TinyIndex(), kNumChunksAt, 2, 8)), {"claims 2 chunks"});
}

TEST(IndexFormatTest, OversizedLengthsAreRejected) {
  ExpectCorruption(Decode(Patched(TinyIndex(), kNameLengthAt, kMaxNameBytes + 1, 4)),
                   {"the name of tensor 0 is 65537 bytes long"});
  ExpectCorruption(Decode(Patched(TinyIndex(), kNameLengthAt, 1000, 4)),
                   {"claims 1000 bytes but only"});
  Index index = TinyIndex();
  index.metadata.user["k"] = "v";
  // The key length follows the entry count.
  ExpectCorruption(Decode(Patched(index, kNumUserAt + 4, kMaxMetadataKeyBytes + 1, 4)),
                   {"metadata entry 0's key is 65537 bytes long"});
  ExpectCorruption(Decode(Patched(index, kNumUserAt + 4 + 4 + 1, kMaxMetadataValueBytes + 1, 4)),
                   {"metadata entry 0's value is 1048577 bytes long"});
}

TEST(IndexFormatTest, DataFileCountOutOfRangeIsCorruption) {
  ExpectTinyMutationRejected([](Index& i) { i.num_data_files = 0; }, {"names 0 data files"});
  ExpectTinyMutationRejected([](Index& i) { i.num_data_files = kMaxDataFiles + 1; },
                             {"names 65537 data files"});
}

TEST(IndexFormatTest, BadTensorsAreCorruption) {
  ExpectTinyMutationRejected([](Index& i) { i.tensors[0].name = ""; }, {"empty name"});
  ExpectTinyMutationRejected([](Index& i) { i.tensors.push_back(i.tensors[0]); },
                             {"tensor 'a' appears twice"});
  ExpectTinyMutationRejected([](Index& i) { i.tensors[0].dtype = static_cast<DType>(99); },
                             {"tensor 'a' has unknown dtype 99"});
  ExpectTinyMutationRejected([](Index& i) { i.tensors[0].dtype = static_cast<DType>(0); },
                             {"unknown dtype 0"});
  ExpectTinyMutationRejected(
      [](Index& i) {
        i.tensors[0].shape = std::vector<int64_t>(kMaxRank + 1, 1);
        i.tensors[0].chunks.clear();
      },
      {"tensor 'a' has rank 65"});
  ExpectTinyMutationRejected([](Index& i) { i.tensors[0].shape = {-2}; },
                             {"negative or overflowing shape"});
  ExpectTinyMutationRejected(
      [](Index& i) {
        i.tensors[0].shape = {1LL << 40, 1LL << 40};
      },
      {"negative or overflowing shape"});
  // 2^62 f32 elements overflow the byte count even though the element count fits.
  ExpectTinyMutationRejected([](Index& i) { i.tensors[0].shape = {1LL << 62}; },
                             {"negative or overflowing shape"});
  ExpectTinyMutationRejected([](Index& i) { i.tensors[0].bytes = 12; },
                             {"tensor 'a' claims 12 bytes but its shape and f32 dtype make 8"});
}

TEST(IndexFormatTest, HugeTensorNamesAreShortenedInMessages) {
  Status status = Decode(EncodeIndex([] {
    Index i = TinyIndex();
    i.tensors[0].name = std::string(kMaxNameBytes, 'n');
    i.tensors[0].bytes = 4;
    return i;
  }()));
  EXPECT_EQ(status.code(), StatusCode::kCorruption);
  EXPECT_LT(status.message().size(), 400u);
  EXPECT_THAT(status.message(), HasSubstr("(65536 bytes)"));
}

TEST(IndexFormatTest, BadChunksAreCorruptionNamingTensorAndChunk) {
  auto two_chunks = [](Index& i) {
    i.tensors[0].shape = {4};
    i.tensors[0].bytes = 16;
    i.tensors[0].chunks = {Chunk(0, 0, 0, 8, 8), Chunk(8, 0, 8, 8, 8)};
  };
  ExpectTinyMutationRejected(
      [&](Index& i) {
        two_chunks(i);
        i.tensors[0].chunks[1].tensor_offset = 4;
      },
      {"tensor 'a' chunk 1 starts at tensor byte 4", "(overlap)"});
  ExpectTinyMutationRejected(
      [&](Index& i) {
        two_chunks(i);
        i.tensors[0].chunks[1].tensor_offset = 12;
      },
      {"tensor 'a' chunk 1", "(gap)"});
  ExpectTinyMutationRejected(
      [&](Index& i) {
        two_chunks(i);
        i.tensors[0].chunks.pop_back();
      },
      {"tensor 'a'", "chunks cover 8 of its 16 bytes"});
  ExpectTinyMutationRejected(
      [&](Index& i) {
        two_chunks(i);
        i.tensors[0].chunks[1] = Chunk(8, 0, 8, 12, 12);
      },
      {"tensor 'a' chunk 1 ends at tensor byte 20, past the tensor's 16 bytes"});
  ExpectTinyMutationRejected(
      [](Index& i) { i.tensors[0].chunks[0].codec = static_cast<codec::Codec>(3); },
      {"tensor 'a' chunk 0 has unknown codec 3"});
  ExpectTinyMutationRejected([](Index& i) { i.tensors[0].chunks[0].stored_bytes = 7; },
                             {"chunk 0 is stored raw but its stored size 7 differs"});
  ExpectTinyMutationRejected(
      [](Index& i) {
        i.tensors[0].chunks[0].codec = codec::Codec::kZstd;
        i.tensors[0].chunks[0].stored_bytes = 9;
      },
      {"chunk 0 has 9 stored bytes for 8 raw bytes"});
  ExpectTinyMutationRejected(
      [](Index& i) {
        i.tensors[0].chunks[0].codec = codec::Codec::kZstd;
        i.tensors[0].chunks[0].stored_bytes = 0;
      },
      {"chunk 0 has 0 stored bytes"});
  ExpectTinyMutationRejected([](Index& i) { i.tensors[0].chunks[0].file_index = 1; },
                             {"tensor 'a' chunk 0 is in data file 1 but the checkpoint has 1"});
  ExpectTinyMutationRejected(
      [](Index& i) {
        i.tensors[0].bytes = 0;
        i.tensors[0].shape = {0};
        i.tensors[0].chunks[0] = Chunk(0, 0, 0, 0, 0);
      },
      {"chunk 0 has 0 raw bytes"});
  ExpectTinyMutationRejected(
      [](Index& i) {
        i.tensors[0].shape = {1LL << 29};
        i.tensors[0].bytes = 1ULL << 31;
        i.tensors[0].chunks[0] = Chunk(0, 0, 0, 1ULL << 31, 1ULL << 31);
      },
      {"chunk 0 has 2147483648 raw bytes; must be 1 to 1073741824"});
}

TEST(IndexFormatTest, MetadataKeysOutOfOrderOrRepeatedAreCorruption) {
  Index index = TinyIndex();
  index.metadata.user = {{"a", "1"}, {"b", "2"}};
  std::vector<uint8_t> bytes = EncodeIndex(index);
  // Rename key "b" to "a": the entry count, lengths and layout stay as they are.
  const size_t second_key = kNumUserAt + 4 + (4 + 1 + 4 + 1) + 4;
  ASSERT_EQ(bytes[second_key], 'b');
  bytes[second_key] = 'a';
  Reseal(&bytes);
  ExpectCorruption(Decode(bytes), {"metadata entry 1's key 'a' is a duplicate or out of order"});
}

TEST(IndexFormatTest, MaxRawBytesIsOneToOneForRawAndTheZstdRatioOtherwise) {
  EXPECT_EQ(kMaxZstdRatio, 32768u);
  EXPECT_EQ(MaxRawBytes(codec::Codec::kRaw, 4096), 4096u);
  EXPECT_EQ(MaxRawBytes(codec::Codec::kZstd, 4096), 4096u * 32768);
  EXPECT_EQ(MaxRawBytes(codec::Codec::kShuffleZstd, 1), 32768u);
  EXPECT_EQ(MaxRawBytes(codec::Codec::kZstd, UINT64_MAX / 1000), UINT64_MAX);
}

TEST(IndexFormatTest, ACompressedChunkClaimingMoreThanTheRatioAllowsIsCorruption) {
  auto claim = [](codec::Codec c, uint64_t stored, uint64_t raw) {
    Index index = TinyIndex();
    index.tensors[0].dtype = DType::kU8;
    index.tensors[0].shape = {static_cast<int64_t>(raw)};
    index.tensors[0].bytes = raw;
    index.tensors[0].chunks = {Chunk(0, 0, 0, stored, raw, c, 1)};
    return Decode(EncodeIndex(index));
  };
  EXPECT_TRUE(claim(codec::Codec::kZstd, 1, 32768).ok());
  EXPECT_TRUE(claim(codec::Codec::kShuffleZstd, 32, 32 * 32768).ok());
  ExpectCorruption(claim(codec::Codec::kZstd, 1, 32769),
                   {"tensor 'a' chunk 0 claims 32769 raw bytes from 1 stored bytes of zstd",
                    "at most 32768 raw bytes per stored byte"});
  ExpectCorruption(claim(codec::Codec::kShuffleZstd, 140, 1ull << 30),
                   {"claims 1073741824 raw bytes from 140 stored bytes of shuffle+zstd"});
}

}  // namespace
}  // namespace asyncckpt::format
