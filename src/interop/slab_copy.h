#pragma once

// Copies a checkpoint's tensors into one file, laid out back to back (a safetensors file's data
// section), through a few fixed slabs of memory: a reader thread reads and verifies the next
// slabs while the calling thread writes the previous one, so an export takes about as long as
// the slower of the two rather than their sum (issue 29).
//
//   plan:    PlanSlabs cuts the tensors into slabs of at most slab_bytes: small tensors share
//            one, a larger tensor is cut into boxes of whole rows (or of sub-rows, when one row
//            is larger than a slab), each a contiguous run of its bytes.
//   read:    one thread fills the free slabs in order, each with one CheckpointReader::restore
//            of its boxes (one streaming pass, every chunk checksummed).
//   write:   the calling thread writes each filled slab at its offset, in order, and frees it.

#include <cstdint>
#include <span>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/status.h"

namespace asyncckpt::interop {

/// The box [first, first + shape) of one tensor: a contiguous run of its row-major bytes.
struct TensorPiece {
  /// Borrowed from the reader; outlives the plan.
  const TensorInfo* tensor = nullptr;
  std::vector<int64_t> first;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

/// Pieces read together and written as one run of the file: [file_offset, file_offset + bytes),
/// the pieces back to back.
struct Slab {
  uint64_t file_offset = 0;
  uint64_t bytes = 0;
  std::vector<TensorPiece> pieces;
};

/// Smallest slab: one element of the widest dtype fits, so every tensor can be cut.
inline constexpr uint64_t kMinSlabBytes = 16;

/// Cuts `tensors`, laid out back to back from `file_offset`, into slabs of at most `slab_bytes`
/// (at least kMinSlabBytes) that together cover every byte once, in file order. Empty tensors
/// take no piece. A tensor's boxes are sized, where its rows allow, to whole multiples of its
/// chunks (a guess from TensorInfo: a power of two), so that no chunk is read for two slabs.
std::vector<Slab> PlanSlabs(std::span<const TensorInfo* const> tensors, uint64_t file_offset,
                            uint64_t slab_bytes);

/// How CopySlabs overlaps.
struct SlabCopyOptions {
  /// Slabs held at once: one written, the others read ahead (at least 2). Memory: this many
  /// times the largest slab of the plan.
  unsigned slabs = 3;
};

/// Reads every slab of `slabs` from `reader` and writes it to `out` at its offset, the reads
/// of later slabs on a thread of their own while this thread writes. Returns the first error
/// of either side, naming the slab's tensors (a read error also names the chunk and data file);
/// after an error nothing more is read or written, the thread has ended, and `out` holds an
/// unspecified prefix of the slabs. Does not sync `out`. ResourceExhausted when the slabs'
/// memory cannot be had. When `out` is direct (O_DIRECT), the slabs must lie back to back from
/// a page (4096) boundary, as PlanSlabs lays them out (else InvalidArgument); the bytes before
/// the first are the caller's, and the file ends at the last slab's end.
Status CopySlabs(CheckpointReader& reader, std::span<const Slab> slabs, io::File& out,
                 const SlabCopyOptions& options = {});

}  // namespace asyncckpt::interop
