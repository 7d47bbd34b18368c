#pragma once

// What every saver's write path shares before placement (src/format/placement.h): checks of
// the tensors and metadata, the chunk plan, and the assembly of the index from where each
// chunk landed. The engine (src/engine) runs them; there is no other writer.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "asyncckpt/dtype.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"
#include "src/codec/codec.h"
#include "src/format/format.h"

namespace asyncckpt::format {

/// A tensor in host memory to write. Does not own `data`, which stays alive and unchanged
/// until the write returns.
struct HostTensor {
  /// Unique, non-empty name (at most kMaxNameBytes).
  std::string name;
  /// Element type.
  DType dtype = DType::kF32;
  /// Dimensions; empty for a scalar.
  std::vector<int64_t> shape;
  /// The bytes to write (may be null when bytes is 0).
  const void* data = nullptr;
  /// Size in bytes: elements × dtype size.
  uint64_t bytes = 0;
};

/// InvalidArgument naming the tensor when a name is empty, too long or repeated, a dtype is
/// unknown, a rank exceeds kMaxRank, the byte size does not match shape × dtype, or a
/// non-empty tensor has no data.
Status ValidateTensors(std::span<const HostTensor> tensors);
/// InvalidArgument naming the key when a metadata key or value is longer than the format allows.
Status ValidateMetadata(const CheckpointMetadata& metadata);

/// The bytes per chunk for `dtype`: chunk_bytes rounded down to whole elements, at least one.
uint64_t ChunkBytesFor(uint64_t chunk_bytes, DType dtype);

/// One chunk to encode and write.
struct ChunkJob {
  /// Index of the tensor in the span given to PlanChunks.
  uint32_t tensor = 0;
  /// Index of the chunk within its tensor.
  uint32_t chunk = 0;
  /// First byte within the tensor.
  uint64_t offset = 0;
  /// Raw bytes.
  uint64_t length = 0;
  /// The data file it goes to.
  uint32_t file_index = 0;
};

/// Splits every tensor into chunks of ChunkBytesFor(chunk_bytes, dtype) (the last one of a
/// tensor shorter) and gives each chunk to the data file with the fewest raw bytes planned so
/// far (ties: the lowest index), which balances the files' sizes even when tensors are small
/// or their chunks uneven. Jobs come in tensor order, then chunk order; a job's position is
/// its chunk id. Empty tensors get no chunks. Expects validated tensors and options.
std::vector<ChunkJob> PlanChunks(std::span<const HostTensor> tensors, uint64_t chunk_bytes,
                                 uint32_t num_data_files);

/// Builds the index from the planned jobs and, for each job at the same position, the entry
/// saying where it landed. InvalidArgument when the tensors (data pointers aside), metadata or
/// file count would make an index that readers refuse; Internal when an entry does not match
/// its job (a bug in the caller).
Result<Index> AssembleIndex(std::span<const HostTensor> tensors, const CheckpointMetadata& metadata,
                            uint32_t num_data_files, std::span<const ChunkJob> jobs,
                            std::span<const ChunkEntry> entries);

}  // namespace asyncckpt::format
