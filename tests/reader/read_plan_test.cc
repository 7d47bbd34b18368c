#include "src/reader/read_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <utility>
#include <vector>

namespace asyncckpt::reader {
namespace {

// Builds an index by hand: tensors of u8 whose chunks lie where each test says.
class ReadPlanTest : public ::testing::Test {
 protected:
  // Adds tensor `name` whose chunks are (file, file offset, stored bytes, codec), in order.
  size_t AddTensor(
      const std::vector<std::tuple<uint32_t, uint64_t, uint64_t, codec::Codec>>& chunks) {
    format::TensorEntry tensor;
    tensor.name = "t";  // appended: GCC 12 -O3 -Wrestrict false positive on "t" + string&&
    tensor.name += std::to_string(index_.tensors.size());
    tensor.dtype = DType::kU8;
    for (const auto& [file, offset, stored, codec] : chunks) {
      const uint64_t raw = codec == codec::Codec::kRaw ? stored : stored * 4;
      tensor.chunks.push_back({tensor.bytes, file, offset, stored, raw, codec, 0});
      tensor.bytes += raw;
      index_.num_data_files = std::max(index_.num_data_files, file + 1);
    }
    tensor.shape = {static_cast<int64_t>(tensor.bytes)};
    index_.tensors.push_back(tensor);
    return index_.tensors.size() - 1;
  }

  PlanOptions Options(bool direct, std::vector<uint64_t> sizes) const {
    PlanOptions options;
    options.direct.assign(sizes.size(), direct);
    options.file_sizes = std::move(sizes);
    return options;
  }

  // Every (tensor, chunk) of the plan, with a check that none appears twice and that each
  // chunk's bytes lie inside its extent where the index says.
  std::set<std::pair<size_t, size_t>> Covered(const std::vector<Extent>& plan) {
    std::set<std::pair<size_t, size_t>> seen;
    for (const Extent& e : plan) {
      for (const PlannedChunk& p : e.chunks) {
        EXPECT_TRUE(seen.insert({p.tensor, p.chunk}).second) << "chunk planned twice";
        const format::ChunkEntry& c = index_.tensors[p.tensor].chunks[p.chunk];
        EXPECT_EQ(c.file_index, e.file);
        EXPECT_EQ(e.offset + p.offset_in_extent, c.file_offset);
        EXPECT_LE(p.offset_in_extent + c.stored_bytes, e.length);
      }
    }
    return seen;
  }

  format::Index index_;
};

using codec::Codec;

TEST_F(ReadPlanTest, NeighbouringCompressedChunksCoalesceUpToTheExtentLimit) {
  const size_t t = AddTensor({{0, 0, 1000, Codec::kZstd},
                              {0, 1000, 1000, Codec::kZstd},
                              {0, 2000, 1000, Codec::kZstd},
                              {0, 3000, 1000, Codec::kZstd}});
  PlanOptions options = Options(false, {4000});
  options.max_extent_bytes = 2500;
  const TensorRequest request{t, nullptr};
  const std::vector<Extent> plan = PlanReads(index_, {&request, 1}, options);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].offset, 0u);
  EXPECT_EQ(plan[0].length, 2000u);
  EXPECT_EQ(plan[1].offset, 2000u);
  EXPECT_EQ(plan[1].length, 2000u);
  EXPECT_EQ(Covered(plan).size(), 4u);
}

TEST_F(ReadPlanTest, AGapWiderThanTheLimitSplitsAnExtent) {
  const size_t t = AddTensor({{0, 0, 100, Codec::kZstd}, {0, 100 + 70000, 100, Codec::kZstd}});
  const TensorRequest request{t, nullptr};
  const std::vector<Extent> plan = PlanReads(index_, {&request, 1}, Options(false, {80000}));
  EXPECT_EQ(plan.size(), 2u);
  EXPECT_EQ(Covered(plan).size(), 2u);
}

TEST_F(ReadPlanTest, BufferedRawChunksContiguousInFileAndTensorReadInPlace) {
  const size_t t = AddTensor({{0, 0, 1000, Codec::kRaw},
                              {0, 1000, 1000, Codec::kRaw},
                              {0, 2000, 500, Codec::kZstd},
                              {0, 2500, 1000, Codec::kRaw}});
  std::vector<uint8_t> dst(index_.tensors[t].bytes);
  const TensorRequest request{t, dst.data()};
  const std::vector<Extent> plan = PlanReads(index_, {&request, 1}, Options(false, {3500}));
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].target, dst.data());
  EXPECT_EQ(plan[0].length, 2000u);
  EXPECT_EQ(plan[1].target, nullptr);  // the compressed chunk needs a buffer
  EXPECT_EQ(plan[2].target, dst.data() + index_.tensors[t].chunks[3].tensor_offset);
  for (const Extent& e : plan) {
    for (const PlannedChunk& p : e.chunks) {
      EXPECT_EQ(p.destination, dst.data() + index_.tensors[t].chunks[p.chunk].tensor_offset);
    }
  }
  EXPECT_EQ(Covered(plan).size(), 4u);
}

TEST_F(ReadPlanTest, ChunksContiguousInFileAndTensorButNotInTheirDestinationsReadApart) {
  // A box read sends two neighbouring raw chunks of one row-cut tensor to places that are not
  // next to each other in the caller's buffer: one extent would write the second one wrongly.
  const size_t t = AddTensor({{0, 0, 1000, Codec::kRaw}, {0, 1000, 1000, Codec::kRaw}});
  std::vector<uint8_t> dst(3000);
  const ChunkRequest requests[] = {{t, 0, dst.data()}, {t, 1, dst.data() + 2000}};
  const std::vector<Extent> plan = PlanChunkReads(index_, requests, Options(false, {2000}));
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].target, dst.data());
  EXPECT_EQ(plan[0].length, 1000u);
  EXPECT_EQ(plan[1].target, dst.data() + 2000);
  // Contiguous destinations still make one extent.
  const ChunkRequest together[] = {{t, 0, dst.data()}, {t, 1, dst.data() + 1000}};
  EXPECT_EQ(PlanChunkReads(index_, together, Options(false, {2000})).size(), 1u);
}

TEST_F(ReadPlanTest, OnlyTheRequestedChunksArePlanned) {
  const size_t t = AddTensor(
      {{0, 0, 1000, Codec::kZstd}, {0, 1000, 1000, Codec::kZstd}, {0, 2000, 1000, Codec::kZstd}});
  PlanOptions options = Options(false, {3000});
  options.max_gap_bytes = 0;
  const ChunkRequest requests[] = {{t, 0, nullptr}, {t, 2, nullptr}};
  const std::vector<Extent> plan = PlanChunkReads(index_, requests, options);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].offset, 0u);
  EXPECT_EQ(plan[1].offset, 2000u);
  EXPECT_EQ(plan[1].chunks[0].chunk, 2u);
}

TEST_F(ReadPlanTest, DirectExtentsAreAlignedAndNeverRunPastTheFile) {
  // Back to back, unaligned: the first extent widens to 4096 boundaries; the last one would end
  // past the 9000-byte file once aligned, so it stays exact and buffered.
  const size_t t = AddTensor({{0, 100, 3000, Codec::kZstd}, {0, 7000, 2000, Codec::kZstd}});
  PlanOptions options = Options(true, {9000});
  options.max_gap_bytes = 0;
  const TensorRequest request{t, nullptr};
  const std::vector<Extent> plan = PlanReads(index_, {&request, 1}, options);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_TRUE(plan[0].direct_io);
  EXPECT_EQ(plan[0].offset, 0u);
  EXPECT_EQ(plan[0].length, 4096u);
  EXPECT_EQ(plan[0].chunks[0].offset_in_extent, 100u);
  EXPECT_FALSE(plan[1].direct_io);
  EXPECT_EQ(plan[1].offset, 7000u);
  EXPECT_EQ(plan[1].length, 2000u);
  EXPECT_EQ(Covered(plan).size(), 2u);
}

TEST_F(ReadPlanTest, DirectRawChunksGoInPlaceOnlyWhenEverythingIsAligned) {
  const size_t t = AddTensor({{0, 0, 8192, Codec::kRaw}, {0, 8192, 4000, Codec::kRaw}});
  alignas(4096) static uint8_t dst[8192 + 4000];
  const TensorRequest request{t, dst};
  const std::vector<Extent> plan = PlanReads(index_, {&request, 1}, Options(true, {16384}));
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].target, dst);  // aligned offset, length and destination
  EXPECT_TRUE(plan[0].direct_io);
  EXPECT_EQ(plan[1].target, nullptr);  // 4000 bytes: not a whole number of blocks
  EXPECT_TRUE(plan[1].direct_io);
  EXPECT_EQ(plan[1].length, 4096u);
  // The same chunks into a destination one byte off alignment all go through buffers.
  const TensorRequest unaligned{t, dst + 1};
  for (const Extent& e : PlanReads(index_, {&unaligned, 1}, Options(true, {16384}))) {
    EXPECT_EQ(e.target, nullptr);
  }
}

TEST_F(ReadPlanTest, EveryFileIsReadFrontToBackAtOnce) {
  std::vector<std::tuple<uint32_t, uint64_t, uint64_t, Codec>> chunks;
  for (uint64_t i = 0; i < 6; ++i) {
    chunks.emplace_back(static_cast<uint32_t>(i % 2), (i / 2) * 1000, 1000, Codec::kZstd);
  }
  const size_t t = AddTensor(chunks);
  PlanOptions options = Options(false, {3000, 3000});
  options.max_extent_bytes = 1000;
  const TensorRequest request{t, nullptr};
  const std::vector<Extent> plan = PlanReads(index_, {&request, 1}, options);
  ASSERT_EQ(plan.size(), 6u);
  for (size_t i = 0; i < plan.size(); ++i) {
    EXPECT_EQ(plan[i].file, i % 2);
    EXPECT_EQ(plan[i].offset, (i / 2) * 1000);
  }
}

TEST_F(ReadPlanTest, ChunksOfSeveralTensorsShareExtentsButInPlaceRunsStayWithinATensor) {
  const size_t a = AddTensor({{0, 0, 1000, Codec::kRaw}});
  const size_t b = AddTensor({{0, 1000, 1000, Codec::kRaw}});
  const size_t c = AddTensor({{0, 2000, 100, Codec::kZstd}});
  const size_t d = AddTensor({{0, 2100, 100, Codec::kZstd}});
  std::vector<uint8_t> dst_a(1000), dst_b(1000);
  const std::vector<TensorRequest> requests = {
      {a, dst_a.data()}, {b, dst_b.data()}, {c, nullptr}, {d, nullptr}};
  const std::vector<Extent> plan = PlanReads(index_, requests, Options(false, {2200}));
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].target, dst_a.data());
  EXPECT_EQ(plan[1].target, dst_b.data());
  EXPECT_EQ(plan[2].chunks.size(), 2u);
  EXPECT_EQ(Covered(plan).size(), 4u);
}

}  // namespace
}  // namespace asyncckpt::reader
