#pragma once

// Indexes to test the format with, byte patching, and the expectations the format's test files
// (format_test.cc, sharded_index_test.cc) share.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/codec/codec.h"
#include "src/format/format.h"
#include "src/format/index_file.h"

namespace asyncckpt::format {

constexpr char kPath[] = "/ckpt/model.ckpt-7/index";

inline ChunkEntry Chunk(uint64_t tensor_offset, uint32_t file, uint64_t file_offset,
                        uint64_t stored, uint64_t raw, codec::Codec c = codec::Codec::kRaw,
                        uint64_t xxh3 = 42) {
  return ChunkEntry{tensor_offset, file, file_offset, stored, raw, c, xxh3};
}

// The smallest interesting index: one f32 tensor "a" of shape [2], one raw chunk, one data
// file. Its byte layout is pinned below (kNumUserAt...) so that tests can patch counts.
inline Index TinyIndex() {
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

inline Index RichIndex() {
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

inline std::vector<uint64_t> RichSizes() { return {15, 28, 8}; }

inline uint64_t Load64(const std::vector<uint8_t>& b, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[at + static_cast<size_t>(i)];
  return v;
}

inline void Store(std::vector<uint8_t>* b, size_t at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i)
    (*b)[at + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
}

// Recomputes the checksum after a patch, so that the decoder's other checks are what fails.
inline void Reseal(std::vector<uint8_t>* b) {
  const size_t at = b->size() - 16;
  Store(b, at, codec::Checksum(std::span<const uint8_t>(b->data(), at)), 8);
}

inline std::vector<uint8_t> Patched(const Index& index, size_t at, uint64_t value, int width) {
  std::vector<uint8_t> bytes = EncodeIndex(index);
  Store(&bytes, at, value, width);
  Reseal(&bytes);
  return bytes;
}

// What production does with an index's bytes and its data files' sizes (the reader, through
// LoadIndex): ParseIndex, then CheckChunkLocations.
inline Result<Index> ParseAndLocate(std::span<const uint8_t> bytes, std::string_view path,
                                    std::span<const uint64_t> data_file_sizes) {
  Result<Index> index = ParseIndex(bytes, path);
  if (!index.ok()) return index;
  Status status = CheckChunkLocations(*index, path, data_file_sizes);
  if (!status.ok()) return status;
  return index;
}

inline Status Decode(const std::vector<uint8_t>& bytes, std::vector<uint64_t> sizes = {1 << 20}) {
  return ParseAndLocate(bytes, kPath, sizes).status();
}

// Expects Corruption whose message names the index and contains every fragment.
inline void ExpectCorruption(const Status& status, std::initializer_list<std::string> fragments) {
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_THAT(status.message(), ::testing::HasSubstr(kPath));
  for (const std::string& fragment : fragments) {
    EXPECT_THAT(status.message(), ::testing::HasSubstr(fragment));
  }
}

// Encodes a mutated copy of the tiny index and expects Corruption with the fragments.
inline void ExpectTinyMutationRejected(const std::function<void(Index&)>& mutate,
                                       std::initializer_list<std::string> fragments) {
  Index index = TinyIndex();
  mutate(index);
  ExpectCorruption(Decode(EncodeIndex(index)), fragments);
}

}  // namespace asyncckpt::format
