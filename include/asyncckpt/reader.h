#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/dtype.h"
#include "asyncckpt/file_system.h"
#include "asyncckpt/limits.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"

namespace asyncckpt {

/// One slice of a tensor in a sharded checkpoint: a box of the global tensor, written by one rank.
struct SliceInfo {
  /// The box's first index in each global dimension.
  std::vector<int64_t> offset;
  /// The box's extent in each dimension.
  std::vector<int64_t> shape;
  /// The rank that wrote it (the lowest rank holding the box).
  uint32_t writer_rank = 0;
  /// Raw size in bytes.
  uint64_t bytes = 0;
  /// Bytes it takes in the data files.
  uint64_t stored_bytes = 0;
  /// Number of chunks.
  uint64_t num_chunks = 0;
};

/// What the index says about one tensor (in a sharded checkpoint: the global tensor).
struct TensorInfo {
  /// The tensor's name.
  std::string name;
  /// Element type.
  DType dtype = DType::kF32;
  /// Dimensions (sharded: of the global tensor).
  std::vector<int64_t> shape;
  /// Raw size in bytes (sharded: of the global tensor).
  uint64_t bytes = 0;
  /// Bytes it takes in the data files (sharded: all slices).
  uint64_t stored_bytes = 0;
  /// Number of chunks (sharded: all slices).
  uint64_t num_chunks = 0;
  /// Chunks per codec name ("raw", "zstd", "shuffle+zstd").
  std::map<std::string, uint64_t> chunks_by_codec;
  /// Sharded checkpoints: the slices that tile `shape`, in index order (rank order). Empty for
  /// an unsharded checkpoint.
  std::vector<SliceInfo> slices;
};

/// What a reader has read from the data files since it was opened (a resharded restore reads
/// only the chunks that overlap its boxes; this says how much that was).
struct ReadStats {
  /// Bytes read from the data files (whole reads, including gaps and O_DIRECT alignment).
  uint64_t bytes_read = 0;
  /// Chunks read, decoded and checksummed.
  uint64_t chunks_read = 0;
};

/// Options for opening a checkpoint.
struct ReaderOptions {
  /// Use the POSIX backend even where io_uring works (only when file_system is null).
  bool force_posix_io = false;
  /// Most reads in flight at once while reading, restoring or verifying (each up to 4 MiB of
  /// neighbouring chunks), in [1, kMaxQueueDepth].
  unsigned queue_depth = kDefaultQueueDepth;
  /// Read the data files with O_DIRECT, bypassing the page cache; where the file system
  /// refuses it the reader reads buffered, logging one line.
  bool use_o_direct = true;
  /// Most bytes of read buffers one read, restore or verify holds (compressed chunks, and raw
  /// chunks whose destination O_DIRECT cannot reach); a larger single chunk still reads alone.
  uint64_t read_buffer_bytes = 64ull << 20;
  /// Where the files are read from (borrowed; must outlive the reader). Null: io_uring where a
  /// ring can be set up, else POSIX.
  io::FileSystem* file_system = nullptr;
};

/// What verify() found: OK, or the first damage, naming the file, tensor and chunk.
struct VerifyReport {
  /// Chunks whose bytes were read, decoded and checksummed.
  uint64_t chunks_checked = 0;
  /// Raw bytes checked.
  uint64_t bytes_checked = 0;
  /// Every problem found (empty when the checkpoint is sound).
  std::vector<std::string> problems;
};

/// Reads a committed checkpoint. Trusts nothing on disk: every size and offset in the index is
/// bounded before any allocation or read, and every chunk is checksummed when read.
/// Thread-safe for concurrent reads.
///
/// Memory bound: Open() accepts only an index whose chunks lie inside their data files without
/// sharing a byte, and whose every chunk claims at most 1 GiB and at most what its stored bytes
/// can decode to (raw: exactly its stored bytes; zstd and shuffle+zstd: 32768 raw bytes per
/// stored byte, docs/format.md). So a tensor's claimed size, the most ReadXarray()
/// (asyncckpt/xtensor.h) allocates for it, is at most 32768 times the stored bytes of its
/// chunks, and all tensors together at most 32768 times the data files' real sizes. Open()
/// itself allocates at most the index's real size (at most 1 GiB) plus its parsed form; reads
/// add read buffers of at most options.read_buffer_bytes (or one chunk's stored bytes, when
/// larger) per call, and per-thread scratch of one chunk's raw bytes (1 GiB at most).
///
/// Reads stream: the chunks a call needs are planned as reads of up to 4 MiB of neighbouring
/// chunks per data file, up to options.queue_depth of them are in flight through the file
/// system's IoQueue, and each is decoded and checksummed (in parallel) as soon as it arrives,
/// while later ones are still being read. Raw chunks land straight in the destination when
/// O_DIRECT allows it (4096-aligned destination), else they are copied from a read buffer.
///
/// No exception crosses this API: a failed allocation is ResourceExhausted naming the tensor
/// (or the index) and the bytes it needed, anything else thrown inside is Internal.
class CheckpointReader {
 public:
  /// Opens the checkpoint directory at `path` (e.g. /ckpt/model.ckpt-1000) and validates its
  /// index. NotFound, Corruption (naming the file and what is wrong), FailedPrecondition for an
  /// intact index of another format version or with unknown flags (a newer release's), IOError, or
  /// ResourceExhausted when the index does not fit in memory. A symlinked index is never followed
  /// (Corruption).
  static Result<std::unique_ptr<CheckpointReader>> Open(const std::string& path,
                                                        const ReaderOptions& options = {});
  /// Opens the checkpoint a resume in `dir` would use (FindResumeCheckpoints: the state file's
  /// latest, passing over damaged ones), with its errors when there is none.
  static Result<std::unique_ptr<CheckpointReader>> OpenLatest(const std::string& dir,
                                                              const ReaderOptions& options = {});
  virtual ~CheckpointReader() = default;

  /// The checkpoint directory's path.
  virtual const std::string& path() const = 0;
  /// Step, wall time and user key/values.
  virtual const CheckpointMetadata& metadata() const = 0;
  /// Every tensor, in name order.
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  /// The tensor named `name`, or null.
  virtual const TensorInfo* find(const std::string& name) const = 0;
  /// Number of data files.
  virtual uint32_t num_data_files() const = 0;
  /// Whether the checkpoint was written by the processes of a multi-process job (its tensors
  /// then have slices, TensorInfo::slices).
  virtual bool sharded() const = 0;
  /// Processes that wrote the checkpoint (1 when not sharded).
  virtual uint32_t world_size() const = 0;
  /// What this reader has read so far; safe to call while reads run.
  virtual ReadStats read_stats() const = 0;

  /// Reads tensor `name` into host memory `dst` of `dst_bytes` (must equal the tensor's size;
  /// sharded: the global tensor, assembled from its slices), verifying every chunk's checksum.
  /// ResourceExhausted when scratch memory runs out.
  virtual Status read(const std::string& name, void* dst, size_t dst_bytes) = 0;
  /// Reads the box [offset, offset + shape) of tensor `name` (the global tensor in a sharded
  /// checkpoint; works on any checkpoint) into host memory `dst` of `dst_bytes` (the box's
  /// elements × dtype size), row-major in the box. Reads and decodes only the chunks that
  /// overlap the box, verifying each one's checksum. NotFound for an unknown tensor;
  /// InvalidArgument naming the tensor for a box of another rank or outside its shape, or a
  /// destination of another size.
  virtual Status read_box(const std::string& name, const std::vector<int64_t>& offset,
                          const std::vector<int64_t>& shape, void* dst, size_t dst_bytes) = 0;
  /// Restores every tensor of `registry` from the checkpoint: names and dtypes must match. A
  /// shard (TensorRef::global_shape set) gets its box of the tensor, whose global shape must be
  /// its global_shape; any other TensorRef gets the whole tensor, whose (global) shape must be
  /// its shape. So a checkpoint restores onto any number of processes, each reading only the
  /// chunks its boxes overlap. Device tensors are written through their device.
  virtual Status restore(const TensorRegistry& registry) = 0;
  /// Reads, decodes and checksums every chunk; the report lists all damage found (and a chunk
  /// that could not be checked for want of memory, as a problem).
  virtual VerifyReport verify() = 0;
};

}  // namespace asyncckpt
