#pragma once

// The index of one checkpoint as data: its constants and its types, which the encoder and the
// parser (format.h) and the checks of a sharded index's slices (sharded_index.h) share. Nothing
// here reads or writes bytes.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "asyncckpt/dtype.h"
#include "asyncckpt/limits.h"
#include "asyncckpt/tensor.h"
#include "src/codec/codec.h"

namespace asyncckpt::format {

/// The index file's name inside a checkpoint directory.
inline constexpr char kIndexFileName[] = "index";
/// First 8 bytes of an index: "ACKPTIDX".
inline constexpr uint64_t kIndexMagic = 0x58444954504B4341ULL;
/// Last 8 bytes of an index: "ACKPTEND".
inline constexpr uint64_t kIndexEndMagic = 0x444E4554504B4341ULL;
/// The only format version this code reads and writes.
inline constexpr uint32_t kFormatVersion = 1;
/// Header bytes: magic u64, version u32, flags u32 (zero).
inline constexpr size_t kIndexHeaderBytes = 16;
/// Footer bytes: body length u64, XXH3-64 of everything before it u64, end magic u64.
inline constexpr size_t kIndexFooterBytes = 24;
/// Bytes of one chunk record in the body.
inline constexpr size_t kChunkRecordBytes = 45;

/// Longest tensor name.
inline constexpr size_t kMaxNameBytes = 64 * 1024;
/// Most dimensions of a tensor.
inline constexpr size_t kMaxRank = 64;
/// Most data files in one checkpoint.
inline constexpr uint32_t kMaxDataFiles = 65536;
/// Longest metadata key.
inline constexpr size_t kMaxMetadataKeyBytes = 64 * 1024;
/// Longest metadata value.
inline constexpr size_t kMaxMetadataValueBytes = 1024 * 1024;
// The largest raw chunk is kMaxChunkBytes (asyncckpt/limits.h), which chunk_bytes is held to.
/// Largest index a reader accepts.
inline constexpr uint64_t kMaxIndexBytes = 1ULL << 30;

/// Where one chunk of a tensor lives and how it is stored.
struct ChunkEntry {
  /// First byte of the chunk within the tensor's raw bytes.
  uint64_t tensor_offset = 0;
  /// Which data file holds it (0-based).
  uint32_t file_index = 0;
  /// First byte of its stored bytes in that data file.
  uint64_t file_offset = 0;
  /// Bytes it takes in the data file.
  uint64_t stored_bytes = 0;
  /// Bytes it decodes to.
  uint64_t raw_bytes = 0;
  /// How the stored bytes encode the raw bytes.
  codec::Codec codec = codec::Codec::kRaw;
  /// XXH3-64 of the raw bytes.
  uint64_t xxh3 = 0;

  bool operator==(const ChunkEntry&) const = default;
};

/// One tensor: what it is and where its chunks are, in tensor order.
struct TensorEntry {
  /// Unique, non-empty name.
  std::string name;
  /// Element type.
  DType dtype = DType::kF32;
  /// Dimensions; empty for a scalar.
  std::vector<int64_t> shape;
  /// Raw size: elements × dtype size.
  uint64_t bytes = 0;
  /// Chunks covering [0, bytes) in order, without gaps or overlap (none when bytes is 0).
  std::vector<ChunkEntry> chunks;
  /// Sharded indexes only (kIndexFlagSharded): the global tensor's dimensions, as many as
  /// `shape`; `shape` is then this slice's extent and `bytes` its raw size. Empty in an unsharded
  /// index. In a sharded index an entry left empty here (and in box_offset) is a whole tensor:
  /// EncodeIndex and MergeShardedParts write it as global_shape = shape, box_offset = zeros.
  std::vector<int64_t> global_shape;
  /// Sharded only: the slice's first index in each global dimension; the slice is the box
  /// [box_offset, box_offset + shape).
  std::vector<int64_t> box_offset;
  /// Sharded only: the rank that wrote the slice (the lowest rank holding the box).
  uint32_t writer_rank = 0;

  bool operator==(const TensorEntry&) const = default;
};

/// An unsharded tensor's entry.
inline TensorEntry WholeTensorEntry(std::string name, DType dtype, std::vector<int64_t> shape,
                                    uint64_t bytes, std::vector<ChunkEntry> chunks) {
  TensorEntry entry;
  entry.name = std::move(name);
  entry.dtype = dtype;
  entry.shape = std::move(shape);
  entry.bytes = bytes;
  entry.chunks = std::move(chunks);
  return entry;
}

/// Header flag of an index whose tensors are slices of global tensors, written by
/// `world_size` processes: one TensorEntry per slice, several per name; together a name's slices
/// tile its global shape without overlap. Readers that predate it refuse the index by its flags.
inline constexpr uint32_t kIndexFlagSharded = 1;

/// The whole index of one checkpoint.
struct Index {
  /// Step, wall time and user key/values.
  CheckpointMetadata metadata;
  /// Number of data files (data-00000-of-N ... data-(N-1)-of-N).
  uint32_t num_data_files = 0;
  /// Every tensor, in the order the writer listed them (sharded: every slice).
  std::vector<TensorEntry> tensors;
  /// Sharded (kIndexFlagSharded set) when the processes of a multi-process job wrote it.
  bool sharded = false;
  /// Sharded only: processes that wrote the checkpoint; data files rank r wrote are numbered
  /// r * (num_data_files / world_size) onwards.
  uint32_t world_size = 1;
};

/// 'name' for a message, cut short so that a hostile 64 KiB name cannot flood a log.
inline std::string QuoteName(std::string_view name) {
  constexpr size_t kMax = 80;
  // Appended piece by piece: GCC 12 at -O3 takes "'" + std::string(...) for an overlapping
  // memcpy (-Wrestrict, a false positive).
  std::string quoted;
  quoted.reserve(std::min(name.size(), kMax) + 32);
  quoted.push_back('\'');
  quoted.append(name.substr(0, kMax));
  if (name.size() <= kMax) {
    quoted.push_back('\'');
    return quoted;
  }
  quoted.append("...' (");
  quoted.append(std::to_string(name.size()));
  quoted.append(" bytes)");
  return quoted;
}

}  // namespace asyncckpt::format
