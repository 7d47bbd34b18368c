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

}  // namespace
}  // namespace asyncckpt::format
