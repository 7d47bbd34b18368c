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
// stored size, raw size, codec, XXH3-64 of the raw bytes) and checksums itself. Its constants and
// types are in src/format/index.h, which this header includes; the checks of a sharded index's
// slices, which the parser runs, in src/format/sharded_index.h. Reading it from a file system,
// and checking its chunks against the data files, is src/format/index_file.h.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "asyncckpt/status.h"
#include "src/codec/codec.h"
#include "src/format/index.h"

namespace asyncckpt::format {

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
/// (the tensor, slice and chunk number when one is); FailedPrecondition for an intact index (its
/// checksum right) of another format version or with header flags this build does not know: a
/// newer release's checkpoint, never damage.
Result<Index> ParseIndex(std::span<const uint8_t> bytes, std::string_view path);

/// ParseIndex for one rank's part of a sharded index (`index.part-<rank>`): every check but
/// the tiling, since a part holds only that rank's slices. Refuses an unsharded index.
Result<Index> ParseIndexPart(std::span<const uint8_t> bytes, std::string_view path);

/// The global index of a sharded checkpoint from the parts of its `world_size` ranks, `parts[r]`
/// being rank r's (each holding only slices that rank wrote, with global data file numbers).
/// The parts must agree on the step, the user metadata, num_data_files and world_size; the
/// merged index keeps rank 0's wall time and lists the slices in rank order. The result passes
/// every check of ParseIndex (it is encoded and parsed again), tiling included. InvalidArgument
/// when parts.size() != world_size; otherwise Corruption naming the part or the tensor and slice.
Result<Index> MergeShardedParts(std::vector<Index> parts, uint32_t world_size);

}  // namespace asyncckpt::format
