#pragma once

// Writes the files of one checkpoint into an existing directory: the data files and the index.
// Committing (syncing the parent directory and renaming the temporary directory into place) is
// the caller's job (src/state).
//
// The parts are separate so that the asynchronous engine can run them as graph nodes:
//   PlanChunks       tensors -> chunk jobs, each with its data file
//   EncodeChunk      one job -> codec, stored bytes, checksum (any thread, one Scratch each)
//   DataFileAppender stored bytes -> offset in one data file (one appender per file, serial)
//   AssembleIndex    jobs + where each landed -> Index; WriteIndexFile writes it
// WriteCheckpointFiles strings them together for the synchronous saver.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "asyncckpt/compression.h"
#include "asyncckpt/dtype.h"
#include "asyncckpt/file_system.h"
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

/// How a checkpoint's files are written.
struct WriterOptions {
  /// Target raw bytes per chunk, rounded down to a whole number of elements (at least one).
  uint64_t chunk_bytes = 4ull << 20;
  /// Data files to spread the chunks over (1 to kMaxDataFiles).
  uint32_t num_data_files = 2;
  /// Codec, level and minimum saving tried on every chunk.
  CompressionOptions compression;
  /// Ask for O_DIRECT data files. Where the file system refuses, the files are written
  /// buffered; either way the index records the real sizes.
  bool use_o_direct = false;
};

/// What a write did.
struct WriteStats {
  /// Sum of the tensors' raw bytes.
  uint64_t bytes_raw = 0;
  /// Bytes written to the data files (without O_DIRECT padding).
  uint64_t bytes_stored = 0;
  /// Number of chunks.
  uint64_t chunks = 0;
  /// Chunks per codec name ("raw", "zstd", "shuffle+zstd").
  std::map<std::string, uint64_t> chunks_by_codec;
  /// Wall time of the whole write, syncs included.
  double seconds = 0;
};

/// InvalidArgument naming the option when chunk_bytes, num_data_files or the compression
/// options are out of range.
Status ValidateWriterOptions(const WriterOptions& options);
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

/// Encodes the bytes of `job` from `tensor` (codec::Encode with the tensor's element size).
/// `out` holds at least job.length bytes; see codec::Encode for where the stored bytes live.
Result<codec::EncodedChunk> EncodeChunk(const HostTensor& tensor, const ChunkJob& job,
                                        const CompressionOptions& options, codec::Scratch& scratch,
                                        std::span<uint8_t> out);

/// Appends stored chunks to one data file, handing out their offsets. For O_DIRECT files it
/// gathers bytes into 4096-aligned blocks, so chunks lie back to back as in a buffered file;
/// finish() writes the last block padded and trims the padding away. Not thread-safe: one
/// appender per data file, fed from one thread at a time. After a failure the file's content
/// is unspecified and the appender must not be used again.
class DataFileAppender {
 public:
  /// Creates (or truncates) the file at `path` through `fs`; direct asks for O_DIRECT.
  static Result<std::unique_ptr<DataFileAppender>> Open(io::FileSystem& fs, const std::string& path,
                                                        bool direct);
  ~DataFileAppender();
  DataFileAppender(const DataFileAppender&) = delete;
  DataFileAppender& operator=(const DataFileAppender&) = delete;

  /// Appends `bytes`; *offset receives where they start in the file.
  Status append(std::span<const uint8_t> bytes, uint64_t* offset);
  /// Writes what is buffered, trims O_DIRECT padding and syncs (fdatasync). Call once, last.
  Status finish();
  /// Bytes appended so far: the file's size once finish() returned.
  uint64_t size() const { return size_; }
  /// True when the file was opened with O_DIRECT.
  bool is_direct() const;
  /// The file's path.
  const std::string& path() const;

 private:
  struct AlignedFree {
    void operator()(uint8_t* p) const;
  };
  explicit DataFileAppender(std::unique_ptr<io::File> file);
  Status Flush(size_t bytes);

  std::unique_ptr<io::File> file_;
  std::unique_ptr<uint8_t, AlignedFree> block_;  // O_DIRECT only: bytes not yet written
  size_t block_used_ = 0;
  uint64_t flushed_ = 0;  // O_DIRECT only: bytes written so far (a multiple of 4096)
  uint64_t size_ = 0;
};

/// Builds the index from the planned jobs and, for each job at the same position, the entry
/// saying where it landed. InvalidArgument when the tensors (data pointers aside), metadata or
/// file count would make an index that readers refuse; Internal when an entry does not match
/// its job (a bug in the caller).
Result<Index> AssembleIndex(std::span<const HostTensor> tensors, const CheckpointMetadata& metadata,
                            uint32_t num_data_files, std::span<const ChunkJob> jobs,
                            std::span<const ChunkEntry> entries);

/// Writes `index` to `dir`/index and syncs it.
Status WriteIndexFile(io::FileSystem& fs, const std::string& dir, const Index& index);

/// Writes every data file and the index of one checkpoint into the existing directory `dir`,
/// syncing each file; the caller syncs `dir` and renames it. Chunks are encoded in parallel
/// (oneTBB) and appended in chunk order. InvalidArgument for bad tensors, metadata or options
/// (nothing written); IOError naming the file on a write failure, after which `dir` holds
/// partial files the caller removes.
Result<WriteStats> WriteCheckpointFiles(io::FileSystem& fs, const std::string& dir,
                                        std::span<const HostTensor> tensors,
                                        const CheckpointMetadata& metadata,
                                        const WriterOptions& options);

}  // namespace asyncckpt::format
