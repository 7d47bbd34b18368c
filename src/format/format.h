#pragma once

// The on-disk format of one checkpoint directory, in the one header that the writer and the
// reader both include. docs/format.md describes it byte by byte; change both together.
//
//   <basename>-<step>/
//     index                      header | body | footer (all little-endian)
//     data-00000-of-00002        chunk payloads, no framing: back to back, or (engine, O_DIRECT)
//                                each at a 4096-byte boundary with zero gaps; the index says where
//     data-00001-of-00002
//
// The index names every chunk (tensor, offset in the tensor, data file, offset in the file,
// stored size, raw size, codec, XXH3-64 of the raw bytes) and checksums itself. Reading it from a
// file system is src/format/index_file.h's LoadIndex.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "asyncckpt/dtype.h"
#include "asyncckpt/limits.h"
#include "asyncckpt/status.h"
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

/// Most raw bytes one stored byte of a zstd or shuffle+zstd chunk may claim (docs/format.md,
/// "Decompression ratio"). A zstd block decodes to at most 128 KiB (Block_Maximum_Size) and costs
/// at least 4 bytes (a 3-byte block header and, for the densest kind, an RLE block, one byte of
/// payload), and a frame adds at least 6 bytes of magic number and header that decode to
/// nothing. So n stored bytes decode to at most 131072 / 4 * (n - 6) < 32768 * n raw bytes, and
/// raw_bytes <= 32768 * stored_bytes holds for every frame the zstd format allows, with no slack
/// needed for the header. (zstd at any level writes 1 GiB of zeros at a ratio of 32749.)
inline constexpr uint64_t kMaxZstdRatio = 32768;
/// Most raw bytes `stored_bytes` of `codec` may claim: stored_bytes for raw (exactly 1:1),
/// kMaxZstdRatio times it for zstd and shuffle+zstd. A reader allocates for a chunk only what this
/// allows, and for a tensor only the sum over its chunks, whose stored bytes lie in the data files
/// without overlap.
uint64_t MaxRawBytes(codec::Codec codec, uint64_t stored_bytes);

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

/// "<basename>-<step>", the name of a committed checkpoint directory.
std::string CheckpointDirName(std::string_view basename, int64_t step);
/// "data-00000-of-00002": the name of data file `index` of `count` (at least 5 digits each).
std::string DataFileName(uint32_t index, uint32_t count);

/// Serialises an index. The caller gives a valid index (the writer builds it); the encoding
/// itself cannot fail.
std::vector<uint8_t> EncodeIndex(const Index& index);

/// Parses and checks an index without looking at the data files: magic, version and checksum
/// first, then every count, length and value against bounds before anything is allocated, and
/// every tensor's chunks against the tensor. A sharded index also has every slice checked
/// (inside its global shape, written by a rank < world_size into that rank's data files) and
/// every name's slices (one dtype and global shape, at most one per writer rank, no two
/// overlapping, together tiling the global shape). Corruption naming `path` and what is wrong
/// (the tensor, slice and chunk number when one is).
Result<Index> ParseIndex(std::span<const uint8_t> bytes, std::string_view path);

/// ParseIndex for one rank's part of a sharded index (`index.part-<rank>`): every check but
/// the tiling, since a part holds only that rank's slices. Refuses an unsharded index. (This and
/// MergeShardedParts are defined in sharded_index.cc.)
Result<Index> ParseIndexPart(std::span<const uint8_t> bytes, std::string_view path);

/// The global index of a sharded checkpoint from the parts of its `world_size` ranks, `parts[r]`
/// being rank r's (each holding only slices that rank wrote, with global data file numbers).
/// The parts must agree on the step, the user metadata, num_data_files and world_size; the
/// merged index keeps rank 0's wall time and lists the slices in rank order. The result passes
/// every check of ParseIndex (it is encoded and parsed again), tiling included. InvalidArgument
/// when parts.size() != world_size; otherwise Corruption naming the part or the tensor and slice.
Result<Index> MergeShardedParts(std::vector<Index> parts, uint32_t world_size);

/// Checks that every chunk lies inside its data file, whose sizes are `data_file_sizes`
/// (one per data file; a file may be longer than its last chunk), and that no two chunks share a
/// stored byte (the writer never does; shared bytes would let a small file claim many times its
/// size). Corruption naming `path`, the data file, the tensor and the chunk (both chunks for an
/// overlap).
Status CheckChunkLocations(const Index& index, std::string_view path,
                           std::span<const uint64_t> data_file_sizes);

}  // namespace asyncckpt::format
