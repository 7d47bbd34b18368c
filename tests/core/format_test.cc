#include "src/format/format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace asyncckpt::format {
namespace {

using ::testing::HasSubstr;

constexpr char kPath[] = "/ckpt/model.ckpt-7/index";

ChunkEntry Chunk(uint64_t tensor_offset, uint32_t file, uint64_t file_offset, uint64_t stored,
                 uint64_t raw, codec::Codec c = codec::Codec::kRaw, uint64_t xxh3 = 42) {
  return ChunkEntry{tensor_offset, file, file_offset, stored, raw, c, xxh3};
}

// The smallest interesting index: one f32 tensor "a" of shape [2], one raw chunk, one data
// file. Its byte layout is pinned below (kNumUserAt...) so that tests can patch counts.
Index TinyIndex() {
  Index index;
  index.metadata.step = 7;
  index.metadata.wall_time = 1.5;
  index.num_data_files = 1;
  index.tensors.push_back(WholeTensorEntry("a", DType::kF32, {2}, 8, {Chunk(0, 0, 0, 8, 8)}));
  return index;
}

constexpr size_t kNumUserAt = 16 + 16;
constexpr size_t kNumFilesAt = kNumUserAt + 4;
constexpr size_t kNumTensorsAt = kNumFilesAt + 4;
constexpr size_t kNameLengthAt = kNumTensorsAt + 4;
constexpr size_t kRankAt = kNameLengthAt + 4 + 1 + 1;
constexpr size_t kNumChunksAt = kRankAt + 1 + 8 + 8;
constexpr size_t kTinySize = kNumChunksAt + 8 + kChunkRecordBytes + kIndexFooterBytes;

Index RichIndex() {
  Index index;
  index.metadata.step = 123456789012345;
  index.metadata.wall_time = 1.7e9 + 0.25;
  index.metadata.user = {{"", "empty key"}, {"lr", "0.001"}, {"note", std::string(300, 'x')}};
  index.num_data_files = 3;
  index.tensors.push_back(WholeTensorEntry("scalar", DType::kF64, {}, 8, {Chunk(0, 2, 0, 8, 8)}));
  index.tensors.push_back(WholeTensorEntry("empty", DType::kBF16, {0, 5}, 0, {}));
  index.tensors.push_back(
      WholeTensorEntry("layer/0/weights", DType::kF32, {3, 5}, 60,
                       {Chunk(0, 0, 0, 10, 24, codec::Codec::kZstd, 1),
                        Chunk(24, 1, 0, 24, 24, codec::Codec::kRaw, 2),
                        Chunk(48, 0, 10, 5, 12, codec::Codec::kShuffleZstd, 3)}));
  index.tensors.push_back(WholeTensorEntry("flags", DType::kBool, {4}, 4, {Chunk(0, 1, 24, 4, 4)}));
  return index;
}

std::vector<uint64_t> RichSizes() { return {15, 28, 8}; }

uint64_t Load64(const std::vector<uint8_t>& b, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[at + static_cast<size_t>(i)];
  return v;
}

void Store(std::vector<uint8_t>* b, size_t at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i)
    (*b)[at + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
}

// Recomputes the checksum after a patch, so that the decoder's other checks are what fails.
void Reseal(std::vector<uint8_t>* b) {
  const size_t at = b->size() - 16;
  Store(b, at, codec::Checksum(std::span<const uint8_t>(b->data(), at)), 8);
}

std::vector<uint8_t> Patched(const Index& index, size_t at, uint64_t value, int width) {
  std::vector<uint8_t> bytes = EncodeIndex(index);
  Store(&bytes, at, value, width);
  Reseal(&bytes);
  return bytes;
}

Status Decode(const std::vector<uint8_t>& bytes, std::vector<uint64_t> sizes = {1 << 20}) {
  return DecodeIndex(bytes, kPath, sizes).status();
}

// Expects Corruption whose message names the index and contains every fragment.
void ExpectCorruption(const Status& status, std::initializer_list<std::string> fragments) {
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr(kPath));
  for (const std::string& fragment : fragments) {
    EXPECT_THAT(status.message(), HasSubstr(fragment));
  }
}

// Encodes a mutated copy of the tiny index and expects Corruption with the fragments.
void ExpectTinyMutationRejected(const std::function<void(Index&)>& mutate,
                                std::initializer_list<std::string> fragments) {
  Index index = TinyIndex();
  mutate(index);
  ExpectCorruption(Decode(EncodeIndex(index)), fragments);
}

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
  Result<Index> decoded = DecodeIndex(EncodeIndex(index), kPath, RichSizes());
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->metadata.step, index.metadata.step);
  EXPECT_EQ(decoded->metadata.wall_time, index.metadata.wall_time);
  EXPECT_EQ(decoded->metadata.user, index.metadata.user);
  EXPECT_EQ(decoded->num_data_files, index.num_data_files);
  EXPECT_EQ(decoded->tensors, index.tensors);
}

TEST(IndexFormatTest, DataFilesLongerThanTheirChunksAreAccepted) {
  // O_DIRECT writers may leave padding after the last chunk.
  EXPECT_TRUE(
      DecodeIndex(EncodeIndex(RichIndex()), kPath, std::vector<uint64_t>{4096, 4096, 4096}).ok());
}

TEST(IndexFormatTest, EveryTruncationIsCorruption) {
  const std::vector<uint8_t> bytes = EncodeIndex(RichIndex());
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    Status status = DecodeIndex(prefix, kPath, RichSizes()).status();
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
      Status status = DecodeIndex(bad, kPath, RichSizes()).status();
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

TEST(IndexFormatTest, WrongVersionIsCorruption) {
  ExpectCorruption(Decode(Patched(TinyIndex(), 8, 2, 4)), {"unsupported format version 2"});
}

TEST(IndexFormatTest, UnknownFlagsAreCorruption) {
  ExpectCorruption(Decode(Patched(TinyIndex(), 12, 2, 4)), {"unknown flags 2"});
  ExpectCorruption(Decode(Patched(TinyIndex(), 12, 3, 4)), {"unknown flags 3"});
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

TEST(IndexFormatTest, ChunkBeyondDataFileIsCorruptionNamingFileTensorChunk) {
  const std::vector<uint8_t> bytes = EncodeIndex(RichIndex());
  std::vector<uint64_t> sizes = RichSizes();
  sizes[0] = 14;  // chunk 2 of layer/0/weights ends at 15
  ExpectCorruption(
      DecodeIndex(bytes, kPath, sizes).status(),
      {"tensor 'layer/0/weights' chunk 2", "data-00000-of-00003", "holds only 14 bytes"});
}

TEST(IndexFormatTest, ChunkOffsetOverflowIsCorruption) {
  Index index = TinyIndex();
  index.tensors[0].chunks[0].file_offset = UINT64_MAX - 3;
  ExpectCorruption(Decode(EncodeIndex(index)), {"tensor 'a' chunk 0", "holds only"});
}

TEST(IndexFormatTest, WrongNumberOfDataFileSizesIsCorruption) {
  ExpectCorruption(
      DecodeIndex(EncodeIndex(RichIndex()), kPath, std::vector<uint64_t>{100, 100}).status(),
      {"names 3 data files, but 2 were found"});
}

TEST(IndexFormatTest, ParseIndexSkipsOnlyTheDataFileChecks) {
  const std::vector<uint8_t> bytes = EncodeIndex(RichIndex());
  Result<Index> parsed = ParseIndex(bytes, kPath);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(CheckChunkLocations(*parsed, kPath, std::vector<uint64_t>{0, 0, 0}).code(),
            StatusCode::kCorruption);
  EXPECT_TRUE(CheckChunkLocations(*parsed, kPath, RichSizes()).ok());
}

TEST(IndexFormatTest, ChunksOfTwoTensorsSharingStoredBytesAreCorruptionNamingBoth) {
  Index index = RichIndex();
  // "flags" chunk 0 moves onto the last 2 bytes of "layer/0/weights" chunk 1 in data file 1.
  index.tensors[3].chunks[0].file_offset = 22;
  ExpectCorruption(DecodeIndex(EncodeIndex(index), kPath, RichSizes()).status(),
                   {"tensor 'layer/0/weights' chunk 1 and tensor 'flags' chunk 0",
                    "share stored bytes [22, 24) of data-00001-of-00003"});
}

TEST(IndexFormatTest, ChunksOfOneTensorSharingOneFrameAreCorruption) {
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

TEST(IndexFormatTest, AChunkInsideAnotherChunkIsCorruption) {
  Index index = RichIndex();
  // "scalar" (8 bytes) moves inside "layer/0/weights" chunk 0, bytes [0, 10) of data file 0.
  index.tensors[0].chunks[0].file_index = 0;
  index.tensors[0].chunks[0].file_offset = 1;
  ExpectCorruption(DecodeIndex(EncodeIndex(index), kPath, RichSizes()).status(),
                   {"tensor 'layer/0/weights' chunk 0 and tensor 'scalar' chunk 0",
                    "share stored bytes [1, 9)"});
}

TEST(IndexFormatTest, ChunksBackToBackAndInDifferentFilesAtTheSameOffsetAreAccepted) {
  // RichIndex has both: chunks ending where the next begins, and chunks at offset 0 of each file.
  EXPECT_TRUE(DecodeIndex(EncodeIndex(RichIndex()), kPath, RichSizes()).ok());
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

// ---- sharded indexes ---------------------------------------------------------------------------

// A slice of a global tensor: box [offset, offset + shape) written by `rank`, one raw chunk in
// data file `file` at `file_offset` (f32 unless `dtype` says otherwise).
TensorEntry Slice(std::string name, std::vector<int64_t> global, std::vector<int64_t> offset,
                  std::vector<int64_t> shape, uint32_t rank, uint32_t file, uint64_t file_offset,
                  DType dtype = DType::kF32) {
  const uint64_t bytes = static_cast<uint64_t>(NumElements(shape)) * DTypeSize(dtype);
  std::vector<ChunkEntry> chunks;
  if (bytes > 0) chunks.push_back(Chunk(0, file, file_offset, bytes, bytes));
  TensorEntry entry = WholeTensorEntry(std::move(name), dtype, std::move(shape), bytes, chunks);
  entry.global_shape = std::move(global);
  entry.box_offset = std::move(offset);
  entry.writer_rank = rank;
  return entry;
}

// Two ranks, two data files each. "w" [5, 4] f32 cut unevenly along dim 0 (3 rows, 2 rows);
// "g" [4, 6] bf16 cut along dim 1; "s" a whole scalar and "b" a whole [3] tensor written by rank 0.
Index ShardedIndex() {
  Index index;
  index.metadata.step = 100;
  index.metadata.wall_time = 2.5;
  index.metadata.user = {{"k", "v"}};
  index.sharded = true;
  index.world_size = 2;
  index.num_data_files = 4;
  index.tensors.push_back(Slice("w", {5, 4}, {0, 0}, {3, 4}, 0, 0, 0));
  index.tensors.push_back(Slice("g", {4, 6}, {0, 0}, {4, 3}, 0, 1, 0, DType::kBF16));
  index.tensors.push_back(Slice("s", {}, {}, {}, 0, 0, 48));
  index.tensors.push_back(Slice("b", {3}, {0}, {3}, 0, 1, 24));
  index.tensors.push_back(Slice("w", {5, 4}, {3, 0}, {2, 4}, 1, 2, 0));
  index.tensors.push_back(Slice("g", {4, 6}, {0, 3}, {4, 3}, 1, 3, 0, DType::kBF16));
  return index;
}

std::vector<uint64_t> ShardedSizes() { return {52, 36, 32, 24}; }

// Rank r's part: its slices only.
Index PartOf(const Index& index, uint32_t rank) {
  Index part = index;
  part.tensors.clear();
  for (const TensorEntry& t : index.tensors) {
    if (t.writer_rank == rank) part.tensors.push_back(t);
  }
  return part;
}

void ExpectShardedMutationRejected(const std::function<void(Index&)>& mutate,
                                   std::initializer_list<std::string> fragments) {
  Index index = ShardedIndex();
  mutate(index);
  ExpectCorruption(DecodeIndex(EncodeIndex(index), kPath, ShardedSizes()).status(), fragments);
}

TEST(ShardedIndexTest, RoundTripKeepsEverySliceAndTheWorldSize) {
  const Index index = ShardedIndex();
  const std::vector<uint8_t> bytes = EncodeIndex(index);
  EXPECT_EQ(bytes[12], kIndexFlagSharded);
  Result<Index> decoded = DecodeIndex(bytes, kPath, ShardedSizes());
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_TRUE(decoded->sharded);
  EXPECT_EQ(decoded->world_size, 2u);
  EXPECT_EQ(decoded->num_data_files, 4u);
  EXPECT_EQ(decoded->metadata.user, index.metadata.user);
  EXPECT_EQ(decoded->tensors, index.tensors);
}

TEST(ShardedIndexTest, AnUnshardedIndexKeepsItsBytes) {
  // Flags 0, no world size, no per-tensor box: the layout pinned by TinyIndexHasThePinnedLayout.
  Index index = TinyIndex();
  index.world_size = 7;  // ignored when not sharded
  index.tensors[0].writer_rank = 3;
  EXPECT_EQ(EncodeIndex(index), EncodeIndex(TinyIndex()));
  EXPECT_EQ(EncodeIndex(index).size(), kTinySize);
  Result<Index> decoded = ParseIndex(EncodeIndex(TinyIndex()), kPath);
  ASSERT_TRUE(decoded.ok());
  EXPECT_FALSE(decoded->sharded);
  EXPECT_EQ(decoded->world_size, 1u);
}

TEST(ShardedIndexTest, TheShardedLayoutAddsWorldSizeAndABoxPerSlice) {
  Index index = TinyIndex();
  index.sharded = true;
  index.tensors[0].global_shape = {2};
  index.tensors[0].box_offset = {0};
  // World size u32 after the data file count, then per tensor 2 × 8 bytes of box and a u32 rank.
  const std::vector<uint8_t> bytes = EncodeIndex(index);
  ASSERT_EQ(bytes.size(), kTinySize + 4 + 8 + 8 + 4);
  EXPECT_EQ(bytes[kNumFilesAt + 4], 1);             // world size
  EXPECT_EQ(bytes[kNumTensorsAt + 4], 1);           // tensor count
  EXPECT_EQ(Load64(bytes, kNumChunksAt + 4), 2u);   // global dim 0
  EXPECT_EQ(Load64(bytes, kNumChunksAt + 12), 0u);  // box offset 0
  EXPECT_TRUE(ParseIndex(bytes, kPath).ok());
}

TEST(ShardedIndexTest, AnEntryWithoutABoxIsWrittenAsAWholeTensor) {
  Index index = ShardedIndex();
  index.tensors[3].global_shape.clear();
  index.tensors[3].box_offset.clear();
  Result<Index> decoded = DecodeIndex(EncodeIndex(index), kPath, ShardedSizes());
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->tensors[3].global_shape, std::vector<int64_t>{3});
  EXPECT_EQ(decoded->tensors[3].box_offset, std::vector<int64_t>{0});
}

TEST(ShardedIndexTest, WorldSizeMustDivideTheDataFiles) {
  ExpectShardedMutationRejected([](Index& i) { i.world_size = 0; },
                                {"world size 0 must be at least 1"});
  ExpectShardedMutationRejected([](Index& i) { i.world_size = 3; },
                                {"world size 3", "divide the 4 data files"});
  ExpectShardedMutationRejected([](Index& i) { i.world_size = 8; }, {"world size 8"});
}

TEST(ShardedIndexTest, ASliceOutsideItsGlobalShapeIsCorruption) {
  ExpectShardedMutationRejected(
      [](Index& i) {
        i.tensors[4].box_offset = {4, 0};
      },
      {"tensor 'w' slice 1 (box [4:6, 0:4] by rank 1)",
       "leaves the global shape [5, 4] in dimension 0"});
  ExpectShardedMutationRejected(
      [](Index& i) {
        i.tensors[4].box_offset = {-1, 0};
      },
      {"tensor 'w' slice 1", "leaves the global shape"});
  ExpectShardedMutationRejected(
      [](Index& i) {
        i.tensors[4].box_offset = {INT64_MAX, 0};
      },
      {"tensor 'w' slice 1", "in dimension 0"});
  ExpectShardedMutationRejected(
      [](Index& i) {
        i.tensors[0].global_shape = {-5, 4};
      },
      {"tensor 'w' slice 0", "negative or overflowing global shape"});
  ExpectShardedMutationRejected(
      [](Index& i) {
        i.tensors[0].global_shape = {1LL << 62, 4};
        i.tensors[4].global_shape = {1LL << 62, 4};
      },
      {"tensor 'w' slice 0", "negative or overflowing global shape"});
}

TEST(ShardedIndexTest, ASliceOfAnotherRankThanItsShapeIsCorruption) {
  Index index = ShardedIndex();
  index.tensors[0].global_shape = {5, 4, 1};
  const Status status = MergeShardedParts({PartOf(index, 0), PartOf(index, 1)}, 2).status();
  EXPECT_EQ(status.code(), StatusCode::kCorruption);
  EXPECT_THAT(status.message(),
              HasSubstr("the part of rank 0 holds tensor 'w' of shape rank 2 but global shape "
                        "rank 3"));
  // Encoded directly, such an entry is refused by every reader.
  EXPECT_EQ(ParseIndex(EncodeIndex(index), kPath).status().code(), StatusCode::kCorruption);
}

TEST(ShardedIndexTest, AWriterRankOutsideTheJobOrOtherRanksFilesIsCorruption) {
  ExpectShardedMutationRejected([](Index& i) { i.tensors[4].writer_rank = 2; },
                                {"tensor 'w' slice 1", "writer rank 2 but the world size is 2"});
  ExpectShardedMutationRejected(
      [](Index& i) { i.tensors[4].chunks[0].file_index = 1; },
      {"tensor 'w' slice 1", "chunk 0 is in data file 1", "written by rank 0, not by its writer"});
}

TEST(ShardedIndexTest, SlicesOfOneNameMustAgreeOnDtypeAndGlobalShape) {
  ExpectShardedMutationRejected(
      [](Index& i) {
        i.tensors[4] = Slice("w", {5, 4}, {3, 0}, {2, 4}, 1, 2, 0, DType::kI32);
      },
      {"tensor 'w' slice 1", "is i32 of global shape [5, 4] but slice 0 is f32"});
  ExpectShardedMutationRejected(
      [](Index& i) {
        i.tensors[4].global_shape = {6, 4};
      },
      {"tensor 'w' slice 1", "global shape [6, 4] but slice 0"});
}

TEST(ShardedIndexTest, OverlappingSlicesAreCorruptionNamingBoth) {
  ExpectShardedMutationRejected(
      [](Index& i) {
        i.tensors[4] = Slice("w", {5, 4}, {2, 0}, {3, 4}, 1, 2, 0);
      },
      {"tensor 'w' slice 0 (box [0:3, 0:4] by rank 0) and slice 1 (box [2:5, 0:4]) overlap"});
  // The same box twice: a replica that should have been written once.
  ExpectShardedMutationRejected(
      [](Index& i) {
        i.tensors[5] = Slice("g", {4, 6}, {0, 0}, {4, 3}, 1, 3, 0, DType::kBF16);
      },
      {"tensor 'g' slice 0", "and slice 1 (box [0:4, 0:3]) overlap"});
  // Two whole scalars.
  ExpectShardedMutationRejected(
      [](Index& i) { i.tensors.push_back(Slice("s", {}, {}, {}, 1, 2, 40)); },
      {"tensor 's' slice 0 (box [] by rank 0) and slice 1", "overlap"});
}

TEST(ShardedIndexTest, SlicesThatLeaveAGapAreCorruption) {
  ExpectShardedMutationRejected(
      [](Index& i) { i.tensors.erase(i.tensors.begin() + 4); },
      {"tensor 'w': its 1 slices cover 12 of the 20 elements", "global shape [5, 4] (a gap)"});
  ExpectShardedMutationRejected(
      [](Index& i) {
        i.tensors[5] = Slice("g", {4, 6}, {0, 3}, {3, 3}, 1, 3, 0, DType::kBF16);
      },
      {"tensor 'g': its 2 slices cover 21 of the 24 elements"});
}

TEST(ShardedIndexTest, TwoSlicesOfOneNameByOneRankAreCorruption) {
  ExpectShardedMutationRejected(
      [](Index& i) {
        i.tensors[4].writer_rank = 0;
        i.tensors[4].chunks[0].file_index = 0;
        i.tensors[4].chunks[0].file_offset = 100;
      },
      {"tensor 'w' slice 0", "and slice 1 have the same writer rank"});
}

TEST(ShardedIndexTest, EmptySlicesTileAnEmptyTensor) {
  Index index = ShardedIndex();
  index.tensors.push_back(Slice("e", {0, 3}, {0, 0}, {0, 3}, 0, 0, 0));
  index.tensors.push_back(Slice("e", {0, 3}, {0, 0}, {0, 3}, 1, 2, 0));
  EXPECT_TRUE(DecodeIndex(EncodeIndex(index), kPath, ShardedSizes()).ok());
}

TEST(ShardedIndexTest, ManySlicesOnAGridAreCheckedQuickly) {
  // 256 ranks, each a 1x1 box of a [16, 16] tensor: a tiling the sweep must not make quadratic
  // in the worst direction, and one overlap hidden at the end.
  Index index;
  index.sharded = true;
  index.world_size = 256;
  index.num_data_files = 256;
  for (uint32_t r = 0; r < 256; ++r) {
    index.tensors.push_back(
        Slice("t", {16, 16}, {int64_t{r / 16}, int64_t{r % 16}}, {1, 1}, r, r, 0));
  }
  const std::vector<uint64_t> sizes(256, 4);
  EXPECT_TRUE(DecodeIndex(EncodeIndex(index), kPath, sizes).ok());
  index.tensors.back().box_offset = {0, 0};
  ExpectCorruption(DecodeIndex(EncodeIndex(index), kPath, sizes).status(),
                   {"tensor 't' slice 0 (box [0:1, 0:1] by rank 0) and slice 255", "overlap"});
}

TEST(ShardedIndexTest, EveryTruncationAndBitFlipIsCorruption) {
  const std::vector<uint8_t> bytes = EncodeIndex(ShardedIndex());
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    ASSERT_EQ(DecodeIndex(prefix, kPath, ShardedSizes()).status().code(), StatusCode::kCorruption);
  }
  for (size_t at = 0; at < bytes.size(); ++at) {
    std::vector<uint8_t> bad = bytes;
    bad[at] ^= 0x10;
    ASSERT_EQ(DecodeIndex(bad, kPath, ShardedSizes()).status().code(), StatusCode::kCorruption);
  }
}

TEST(ShardedIndexTest, HostileBodiesResealedAreCorruptionNeverACrash) {
  // Every byte of the body set to each of a few hostile values, the checksum recomputed, so that
  // the parser itself (not the checksum) must refuse or accept it sanely.
  const std::vector<uint8_t> bytes = EncodeIndex(ShardedIndex());
  for (size_t at = kIndexHeaderBytes; at + kIndexFooterBytes < bytes.size(); ++at) {
    for (uint8_t value : {uint8_t{0x00}, uint8_t{0x7F}, uint8_t{0x80}, uint8_t{0xFF}}) {
      std::vector<uint8_t> bad = bytes;
      bad[at] = value;
      Reseal(&bad);
      Result<Index> decoded = DecodeIndex(bad, kPath, ShardedSizes());
      if (!decoded.ok()) {
        ASSERT_EQ(decoded.status().code(), StatusCode::kCorruption) << "byte " << at;
      }
    }
  }
}

TEST(ShardedIndexTest, APartParsesWithoutTilingButAFullIndexNeedsIt) {
  const std::vector<uint8_t> part = EncodeIndex(PartOf(ShardedIndex(), 1));
  Result<Index> parsed = ParseIndexPart(part, kPath);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->tensors.size(), 2u);
  ExpectCorruption(ParseIndex(part, kPath).status(), {"tensor 'w'", "(a gap)"});
  ExpectCorruption(ParseIndexPart(EncodeIndex(TinyIndex()), kPath).status(), {"must be sharded"});
  // A part still refuses two slices of one name (its rank writes one box per name).
  Index twice = PartOf(ShardedIndex(), 0);
  twice.tensors.push_back(Slice("b", {3}, {2}, {1}, 0, 1, 40));
  ExpectCorruption(
      ParseIndexPart(EncodeIndex(twice), kPath).status(),
      {"tensor 'b' slice 0 (box [0:3] by rank 0) and slice 1 have the same writer rank"});
}

TEST(ShardedIndexTest, MergeConcatenatesThePartsInRankOrder) {
  const Index index = ShardedIndex();
  Index part1 = PartOf(index, 1);
  part1.metadata.wall_time = 9.0;  // each rank snapshots at its own time; rank 0's is kept
  Result<Index> merged = MergeShardedParts({PartOf(index, 0), part1}, 2);
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  EXPECT_EQ(merged->metadata.wall_time, 2.5);
  EXPECT_EQ(merged->metadata.step, 100);
  EXPECT_EQ(merged->tensors, index.tensors);
  EXPECT_EQ(EncodeIndex(*merged), EncodeIndex(index));
}

TEST(ShardedIndexTest, MergeRefusesPartsThatDisagree) {
  const Index index = ShardedIndex();
  EXPECT_EQ(MergeShardedParts({PartOf(index, 0)}, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MergeShardedParts({}, 0).status().code(), StatusCode::kInvalidArgument);
  auto merge_with = [&](const std::function<void(Index&)>& mutate) {
    Index part1 = PartOf(index, 1);
    mutate(part1);
    return MergeShardedParts({PartOf(index, 0), part1}, 2).status();
  };
  auto expect = [](const Status& status, const std::string& fragment) {
    EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr("index merged from the parts of 2 ranks: "));
    EXPECT_THAT(status.message(), HasSubstr(fragment));
  };
  expect(merge_with([](Index& p) { p.metadata.step = 99; }),
         "the part of rank 1 holds step 99 but rank 0's holds step 100");
  expect(merge_with([](Index& p) { p.metadata.user["k"] = "other"; }),
         "the part of rank 1 has other user metadata");
  expect(merge_with([](Index& p) { p.num_data_files = 8; }),
         "the part of rank 1 names 8 data files but rank 0's 4");
  expect(merge_with([](Index& p) { p.world_size = 4; }), "the part of rank 1 is of world size 4");
  expect(merge_with([](Index& p) { p.sharded = false; }), "the part of rank 1 is not sharded");
  expect(merge_with([](Index& p) { p.tensors[0].writer_rank = 0; }),
         "the part of rank 1 holds tensor 'w' written by rank 0");
  // Agreeing parts that do not tile: the tiling check of ParseIndex runs on the result.
  expect(merge_with([](Index& p) { p.tensors.pop_back(); }),
         "tensor 'g': its 1 slices cover 12 of the 24 elements");
  expect(merge_with([](Index& p) { p.tensors[0].box_offset = {2, 0}; }), "overlap");
}

}  // namespace
}  // namespace asyncckpt::format
