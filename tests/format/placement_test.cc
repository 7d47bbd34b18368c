#include "src/format/placement.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace asyncckpt::format {
namespace {

TEST(DataFilePlacerTest, BufferedFilesHoldChunksBackToBack) {
  DataFilePlacer placer(2, 1);
  EXPECT_EQ(placer.Place(0, 100).offset, 0u);
  EXPECT_EQ(placer.Place(1, 7).offset, 0u);
  EXPECT_EQ(placer.Place(0, kPackThreshold).offset, 100u);
  EXPECT_EQ(placer.Place(0, 5).offset, 100u + kPackThreshold);
  placer.Finish();
  EXPECT_EQ(placer.logical_end(0), 105u + kPackThreshold);
  EXPECT_EQ(placer.written_end(0), placer.logical_end(0));
  EXPECT_EQ(placer.written_end(1), 7u);
}

TEST(DataFilePlacerTest, DirectChunksStartAlignedAndArePaddedToWholeBlocks) {
  DataFilePlacer placer(1, kDirectAlignment);
  const ChunkPlacement first = placer.Place(0, kPackThreshold + 1);
  ASSERT_TRUE(first.own_write.has_value());
  EXPECT_FALSE(first.packed);
  EXPECT_EQ(first.offset, 0u);
  EXPECT_EQ(first.own_write->padded_bytes % kDirectAlignment, 0u);
  const ChunkPlacement second = placer.Place(0, kPackThreshold);
  EXPECT_EQ(second.offset % kDirectAlignment, 0u);
  EXPECT_EQ(second.offset, first.own_write->padded_bytes);
  EXPECT_EQ(placer.logical_end(0), second.offset + kPackThreshold);
}

TEST(DataFilePlacerTest, SmallChunksShareOneAlignedWriteUntilThePackIsFull) {
  DataFilePlacer placer(1, kDirectAlignment);
  const uint64_t small = 1000;
  std::vector<WriteExtent> closed;
  uint64_t expected = 0;
  for (int i = 0; i < 2000; ++i) {
    const ChunkPlacement placed = placer.Place(0, small);
    ASSERT_TRUE(placed.packed);
    EXPECT_FALSE(placed.own_write.has_value());
    if (placed.closed_pack) {
      closed.push_back(*placed.closed_pack);
      expected = placed.closed_pack->offset + placed.closed_pack->padded_bytes;
    }
    EXPECT_EQ(placed.offset, expected) << i;
    EXPECT_EQ(placed.pack_offset % kDirectAlignment, 0u);
    expected += small;
  }
  for (const WriteExtent& pack : placer.Finish()) closed.push_back(pack);
  // 2000 chunks in packs of at most kPackBytes: two writes, not two thousand.
  ASSERT_EQ(closed.size(), 2u);
  EXPECT_LE(closed[0].bytes, kPackBytes);
  EXPECT_EQ(closed[0].bytes + closed[1].bytes, 2000 * small);
  EXPECT_EQ(closed[1].offset % kDirectAlignment, 0u);
  EXPECT_EQ(closed[1].padded_bytes % kDirectAlignment, 0u);
}

TEST(DataFilePlacerTest, ADirectChunkClosesTheOpenPackOfItsFileOnly) {
  DataFilePlacer placer(2, kDirectAlignment);
  placer.Place(0, 10);
  placer.Place(1, 10);
  const ChunkPlacement direct = placer.Place(0, kPackThreshold);
  ASSERT_TRUE(direct.closed_pack.has_value());
  EXPECT_EQ(direct.closed_pack->file, 0u);
  EXPECT_EQ(direct.closed_pack->bytes, 10u);
  EXPECT_EQ(direct.offset, kDirectAlignment);
  const std::vector<WriteExtent> left = placer.Finish();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].file, 1u);
}

TEST(DataFilePlacerTest, ThresholdZeroWritesEveryChunkAlone) {
  DataFilePlacer placer(1, kDirectAlignment, 0);
  EXPECT_TRUE(placer.Place(0, 1).own_write.has_value());
  const ChunkPlacement second = placer.Place(0, 1);
  ASSERT_TRUE(second.own_write.has_value());
  EXPECT_EQ(second.offset, kDirectAlignment);
  EXPECT_TRUE(placer.Finish().empty());
}

TEST(DataFilePlacerTest, TheSameSizesGiveTheSamePlacement) {
  auto place_all = [] {
    DataFilePlacer placer(3, kDirectAlignment);
    std::vector<uint64_t> offsets;
    for (uint64_t i = 0; i < 500; ++i) {
      offsets.push_back(placer.Place(static_cast<uint32_t>(i % 3), 1 + (i * 7919) % 300000).offset);
    }
    return offsets;
  };
  EXPECT_EQ(place_all(), place_all());
}

// Sizes a save might have: tiny (packed), near the pack threshold, and large (direct).
std::vector<PlannedChunk> MixedChunks(uint32_t files, size_t count) {
  std::vector<PlannedChunk> chunks;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t kind = (i * 2654435761u) % 3;
    const uint64_t bytes = kind == 0   ? 1 + (i * 7919) % 5000
                           : kind == 1 ? kPackThreshold - 4096 + (i * 104729) % 8192
                                       : (4 << 20) - (i * 31) % 4096;
    chunks.push_back({static_cast<uint32_t>(i % files), bytes});
  }
  return chunks;
}

std::vector<uint64_t> PlaceAll(uint32_t files, uint64_t alignment,
                               const std::vector<PlannedChunk>& chunks) {
  DataFilePlacer placer(files, alignment);
  for (const PlannedChunk& chunk : chunks) (void)placer.Place(chunk.file, chunk.bytes);
  (void)placer.Finish();
  std::vector<uint64_t> ends;
  for (uint32_t file = 0; file < files; ++file) ends.push_back(placer.written_end(file));
  return ends;
}

TEST(PlannedFileEndsTest, ExactPlanIsWhatThePlacerWrites) {
  for (uint64_t alignment : {uint64_t{1}, kDirectAlignment}) {
    const std::vector<PlannedChunk> chunks = MixedChunks(2, 3000);
    EXPECT_EQ(PlannedFileEnds(2, alignment, kPackThreshold, chunks, true),
              PlaceAll(2, alignment, chunks))
        << alignment;
  }
}

TEST(PlannedFileEndsTest, BoundCoversEveryPlacementOfChunksThatShrank) {
  const std::vector<PlannedChunk> raw = MixedChunks(3, 3000);
  const std::vector<uint64_t> bound =
      PlannedFileEnds(3, kDirectAlignment, kPackThreshold, raw, false);
  EXPECT_GE(bound, PlannedFileEnds(3, kDirectAlignment, kPackThreshold, raw, true));
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    // Each chunk keeps between 1 byte and all of its bytes, as compression may leave it; many
    // large chunks drop below the pack threshold and are packed instead.
    std::vector<PlannedChunk> stored = raw;
    uint64_t state = seed * 0x9E3779B97F4A7C15ull;
    for (PlannedChunk& chunk : stored) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      chunk.bytes = 1 + state % chunk.bytes;
    }
    const std::vector<uint64_t> placed = PlaceAll(3, kDirectAlignment, stored);
    for (uint32_t file = 0; file < 3; ++file) {
      EXPECT_LE(placed[file], bound[file]) << "seed " << seed << ", file " << file;
    }
  }
}

TEST(PlannedFileEndsTest, FilesWithoutChunksReachNothing) {
  const std::vector<PlannedChunk> chunks = {{0, 10}, {2, kPackThreshold}};
  EXPECT_EQ(PlannedFileEnds(3, kDirectAlignment, kPackThreshold, chunks, true),
            (std::vector<uint64_t>{kDirectAlignment, 0, kPackThreshold}));
  EXPECT_EQ(PlannedFileEnds(3, 1, kPackThreshold, chunks, false),
            (std::vector<uint64_t>{10, 0, kPackThreshold}));
}

}  // namespace
}  // namespace asyncckpt::format
