// Sharded indexes: the slices' checks and tiling (src/format/sharded_index.cc), which the parser
// runs, and the merge of the ranks' parts (format.cc's MergeShardedParts).

#include "src/format/sharded_index.h"

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
  ExpectCorruption(ParseAndLocate(EncodeIndex(index), kPath, ShardedSizes()).status(), fragments);
}

TEST(ShardedIndexTest, RoundTripKeepsEverySliceAndTheWorldSize) {
  const Index index = ShardedIndex();
  const std::vector<uint8_t> bytes = EncodeIndex(index);
  EXPECT_EQ(bytes[12], kIndexFlagSharded);
  Result<Index> decoded = ParseAndLocate(bytes, kPath, ShardedSizes());
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
  Result<Index> decoded = ParseAndLocate(EncodeIndex(index), kPath, ShardedSizes());
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
  EXPECT_TRUE(ParseAndLocate(EncodeIndex(index), kPath, ShardedSizes()).ok());
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
  EXPECT_TRUE(ParseAndLocate(EncodeIndex(index), kPath, sizes).ok());
  index.tensors.back().box_offset = {0, 0};
  ExpectCorruption(ParseAndLocate(EncodeIndex(index), kPath, sizes).status(),
                   {"tensor 't' slice 0 (box [0:1, 0:1] by rank 0) and slice 255", "overlap"});
}

// Columns [0:rows, j] for j < half, and single elements [i, half] for i < tiny: with tiny == rows
// a tiling whose overlap sweep would be quadratic (every column stays active along dim 0).
Index LongAndTinySlices(uint32_t half, int64_t rows, uint32_t tiny) {
  Index index;
  index.sharded = true;
  index.world_size = half + tiny;
  index.num_data_files = half + tiny;
  uint32_t r = 0;
  const std::vector<int64_t> global = {rows, int64_t{half} + 1};
  for (int64_t j = 0; j < half; ++j, ++r) {
    index.tensors.push_back(Slice("t", global, {0, j}, {rows, 1}, r, r, 0, DType::kU8));
  }
  for (int64_t i = 0; i < tiny; ++i, ++r) {
    index.tensors.push_back(Slice("t", global, {i, int64_t{half}}, {1, 1}, r, r, 0, DType::kU8));
  }
  return index;
}

TEST(ShardedIndexTest, ATilingTheSweepWouldFindQuadraticIsProvedByItsCorners) {
  const Index index = LongAndTinySlices(8192, 8192, 8192);
  const auto start = std::chrono::steady_clock::now();
  Result<Index> parsed = ParseIndex(EncodeIndex(index), kPath);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  // Generous for a Debug build on a busy machine; the sweep would take minutes.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(ShardedIndexTest, HostileSlicesAreRefusedInBoundedTime) {
  // One element short of a tiling: the corners do not prove it, and the sweep gives up after
  // kMaxSweepComparisons instead of comparing all 1.8 * 10^7 pairs of the single elements.
  const Index index = LongAndTinySlices(6000, 6001, 6000);
  const auto start = std::chrono::steady_clock::now();
  ExpectCorruption(ParseIndex(EncodeIndex(index), kPath).status(),
                   {"tensor 't': its 12000 slices do not tile its global shape [6001, 6001]",
                    "too many to name"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

TEST(ShardedIndexTest, SlicesCutInMoreDimensionsThanTheCornerProofTakesAreSwept) {
  // 32 single elements tiling [2, 2, 2, 2, 2]: five cut dimensions.
  Index index;
  index.sharded = true;
  index.world_size = 32;
  index.num_data_files = 32;
  for (uint32_t r = 0; r < 32; ++r) {
    std::vector<int64_t> at;
    for (uint32_t d = 0; d < 5; ++d) at.push_back((r >> (4 - d)) & 1);
    index.tensors.push_back(Slice("p", {2, 2, 2, 2, 2}, at, {1, 1, 1, 1, 1}, r, r, 0, DType::kU8));
  }
  EXPECT_TRUE(ParseIndex(EncodeIndex(index), kPath).ok());
  index.tensors.back().box_offset = {0, 0, 0, 0, 0};
  ExpectCorruption(
      ParseIndex(EncodeIndex(index), kPath).status(),
      {"tensor 'p' slice 0 (box [0:1, 0:1, 0:1, 0:1, 0:1] by rank 0) and slice 31", "overlap"});
}

TEST(ShardedIndexTest, EveryTruncationAndBitFlipIsCorruption) {
  const std::vector<uint8_t> bytes = EncodeIndex(ShardedIndex());
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    ASSERT_EQ(ParseAndLocate(prefix, kPath, ShardedSizes()).status().code(),
              StatusCode::kCorruption);
  }
  for (size_t at = 0; at < bytes.size(); ++at) {
    std::vector<uint8_t> bad = bytes;
    bad[at] ^= 0x10;
    ASSERT_EQ(ParseAndLocate(bad, kPath, ShardedSizes()).status().code(), StatusCode::kCorruption);
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
      Result<Index> decoded = ParseAndLocate(bad, kPath, ShardedSizes());
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
