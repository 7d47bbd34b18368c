#pragma once

// The reader's read plan: which byte ranges of which data files a restore reads, and where each
// chunk's stored bytes land. Neighbouring chunks in a data file are coalesced into one larger
// read (an extent), so that a restore of many small chunks still issues few, large requests;
// raw chunks whose bytes can go straight to the caller's buffer skip the bounce buffer.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "src/format/format.h"

namespace asyncckpt::reader {

/// One chunk the plan reads: which tensor and chunk of the index, and where its stored bytes
/// begin in its extent's buffer.
struct PlannedChunk {
  /// Index into Index::tensors.
  size_t tensor = 0;
  /// Index into that tensor's chunks.
  size_t chunk = 0;
  /// First stored byte, counted from the extent's first byte.
  uint64_t offset_in_extent = 0;
  /// Where its raw bytes go (the tensor's destination plus the chunk's offset), or null.
  uint8_t* destination = nullptr;
};

/// One read: `length` bytes at `offset` of data file `file`, holding the stored bytes of
/// `chunks` (in file order; bytes between them are read and ignored).
struct Extent {
  /// The data file (0-based).
  uint32_t file = 0;
  /// First byte read.
  uint64_t offset = 0;
  /// Bytes read.
  uint64_t length = 0;
  /// True: read through the data file's O_DIRECT handle (offset, length and buffer aligned).
  bool direct_io = false;
  /// Non-null: the bytes go straight to this caller memory (raw chunks of one tensor that are
  /// contiguous both in the file and in the tensor); null: into a bounce buffer.
  uint8_t* target = nullptr;
  /// The chunks it holds.
  std::vector<PlannedChunk> chunks;
};

/// One tensor to read and where to (null: no destination, the verify path).
struct TensorRequest {
  /// Index into Index::tensors.
  size_t tensor = 0;
  /// Its raw bytes go here (Index::tensors[tensor].bytes of them), or nowhere when null.
  uint8_t* destination = nullptr;
};

/// One chunk to read and where its raw bytes go (null: nowhere, the caller decodes into scratch).
struct ChunkRequest {
  /// Index into Index::tensors.
  size_t tensor = 0;
  /// Index into that tensor's chunks.
  size_t chunk = 0;
  /// Where all of its raw bytes go, or null.
  uint8_t* destination = nullptr;
};

/// How to plan.
struct PlanOptions {
  /// Per data file: true when an O_DIRECT handle is open for it.
  std::vector<bool> direct;
  /// Per data file: its size in bytes (an aligned read may not run past it).
  std::vector<uint64_t> file_sizes;
  /// O_DIRECT alignment of offsets, lengths and buffers.
  uint64_t alignment = 4096;
  /// Chunks are coalesced into one extent up to this many bytes; a larger chunk is one extent.
  uint64_t max_extent_bytes = 4ull << 20;
  /// Most unrequested bytes between two chunks that are read anyway to coalesce them.
  uint64_t max_gap_bytes = 64ull << 10;
};

/// The extents that read every chunk of `requests` from `index` (whose chunk locations were
/// checked against options.file_sizes), ordered by file offset and interleaved across files so
/// that every data file is read front to back at once. Every chunk appears in exactly one extent.
std::vector<Extent> PlanReads(const format::Index& index, std::span<const TensorRequest> requests,
                              const PlanOptions& options);

/// PlanReads for single chunks (a box of a tensor needs only the chunks that overlap it); each
/// chunk at most once in `requests`.
std::vector<Extent> PlanChunkReads(const format::Index& index,
                                   std::span<const ChunkRequest> requests,
                                   const PlanOptions& options);

}  // namespace asyncckpt::reader
