#pragma once

// Test support: writes the files of one checkpoint into an existing directory, on the calling
// thread, with the library's own chunk plan, codec and placement (format::DataFilePlacer), so
// reader and validator tests can make checkpoints without an engine. Not a second writer: the
// savers write through src/engine only.

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "asyncckpt/compression.h"
#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"
#include "src/codec/codec.h"
#include "src/format/format.h"
#include "src/format/index_file.h"
#include "src/format/placement.h"
#include "src/format/writer.h"
#include "src/util/io_status.h"
#include "src/util/status_macros.h"

namespace asyncckpt::testing_support {

/// How WriteCheckpointFiles writes.
struct WriterOptions {
  /// Target raw bytes per chunk.
  uint64_t chunk_bytes = 4ull << 20;
  /// Data files.
  uint32_t num_data_files = 2;
  /// Codec and level of every chunk.
  CompressionOptions compression;
  /// Ask for O_DIRECT data files.
  bool use_o_direct = false;
};

/// What WriteCheckpointFiles wrote.
struct WriteStats {
  /// Sum of the tensors' raw bytes.
  uint64_t bytes_raw = 0;
  /// Stored bytes of every chunk.
  uint64_t bytes_stored = 0;
  /// Chunks.
  uint64_t chunks = 0;
  /// Chunks per codec name.
  std::map<std::string, uint64_t> chunks_by_codec;
};

namespace checkpoint_files_detail {

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};

inline Status WriteWholeFile(io::FileSystem& fs, const std::string& path, bool direct,
                             const std::vector<uint8_t>& bytes, uint64_t written_end) {
  io::OpenOptions options{.write = true, .create = true, .truncate = true, .direct = direct};
  std::unique_ptr<io::File> file;
  RETURN_IF_ERROR(ToStatus(fs.open(path, options, &file)));
  const size_t padded = (written_end + format::kDirectAlignment - 1) / format::kDirectAlignment *
                        format::kDirectAlignment;
  std::unique_ptr<uint8_t, AlignedFree> buffer(
      static_cast<uint8_t*>(std::aligned_alloc(format::kDirectAlignment, padded + 4096)));
  std::memset(buffer.get(), 0, padded);
  if (!bytes.empty()) std::memcpy(buffer.get(), bytes.data(), bytes.size());  // data() may be null
  const size_t length = file->is_direct() ? padded : bytes.size();
  if (length > 0) RETURN_IF_ERROR(ToStatus(file->write_at(0, buffer.get(), length)));
  if (length != bytes.size()) RETURN_IF_ERROR(ToStatus(file->truncate(bytes.size())));
  return ToStatus(file->sync());
}

}  // namespace checkpoint_files_detail

/// Writes every data file and the index of one checkpoint into the existing directory `dir`,
/// syncing each file. InvalidArgument for bad tensors, metadata or options.
inline Result<WriteStats> WriteCheckpointFiles(io::FileSystem& fs, const std::string& dir,
                                               std::span<const format::HostTensor> tensors,
                                               const CheckpointMetadata& metadata,
                                               const WriterOptions& options) {
  RETURN_IF_ERROR(ValidateCompressionOptions(options.compression));
  RETURN_IF_ERROR(format::ValidateTensors(tensors));
  RETURN_IF_ERROR(format::ValidateMetadata(metadata));
  const uint32_t files = options.num_data_files;
  const std::vector<format::ChunkJob> jobs =
      format::PlanChunks(tensors, options.chunk_bytes, files);
  const uint64_t alignment = options.use_o_direct ? format::kDirectAlignment : 1;
  format::DataFilePlacer placer(files, alignment);
  std::vector<std::vector<uint8_t>> contents(files);
  std::vector<format::ChunkEntry> entries;
  WriteStats stats;
  codec::Scratch scratch;
  for (const format::ChunkJob& job : jobs) {
    const format::HostTensor& tensor = tensors[job.tensor];
    std::vector<uint8_t> out(job.length);
    const auto* base = static_cast<const uint8_t*>(tensor.data);
    ASSIGN_OR_RETURN(codec::EncodedChunk encoded,
                     codec::Encode(std::span<const uint8_t>(base + job.offset, job.length),
                                   DTypeSize(tensor.dtype), options.compression, scratch, out));
    const format::ChunkPlacement placed = placer.Place(job.file_index, encoded.stored.size());
    std::vector<uint8_t>& content = contents[job.file_index];
    if (content.size() < placed.offset + encoded.stored.size()) {
      content.resize(placed.offset + encoded.stored.size());
    }
    std::memcpy(content.data() + placed.offset, encoded.stored.data(), encoded.stored.size());
    entries.push_back(format::ChunkEntry{job.offset, job.file_index, placed.offset,
                                         encoded.stored.size(), job.length, encoded.codec,
                                         encoded.xxh3});
    stats.bytes_stored += encoded.stored.size();
    ++stats.chunks_by_codec[std::string(codec::CodecName(encoded.codec))];
  }
  (void)placer.Finish();
  for (uint32_t i = 0; i < files; ++i) {
    RETURN_IF_ERROR(checkpoint_files_detail::WriteWholeFile(
        fs, dir + "/" + format::DataFileName(i, files), options.use_o_direct, contents[i],
        placer.written_end(i)));
  }
  ASSIGN_OR_RETURN(format::Index index,
                   format::AssembleIndex(tensors, metadata, files, jobs, entries));
  const std::vector<uint8_t> index_bytes = format::EncodeIndex(index);
  std::unique_ptr<io::File> file;
  RETURN_IF_ERROR(
      ToStatus(fs.open(dir + "/" + format::kIndexFileName,
                       io::OpenOptions{.write = true, .create = true, .truncate = true}, &file)));
  RETURN_IF_ERROR(ToStatus(file->write_at(0, index_bytes.data(), index_bytes.size())));
  RETURN_IF_ERROR(ToStatus(file->sync()));
  for (const format::HostTensor& t : tensors) stats.bytes_raw += t.bytes;
  stats.chunks = jobs.size();
  return stats;
}

/// One rank's slice of a global tensor, for WriteShardedCheckpointFiles.
struct HostSlice {
  /// The slice's bytes, shape and dtype (tensor.shape is the box's extent).
  format::HostTensor tensor;
  /// The global tensor's dimensions.
  std::vector<int64_t> global_shape;
  /// The box's first index in each global dimension.
  std::vector<int64_t> box_offset;
};

/// Writes a sharded checkpoint into the existing directory `dir` as `slices.size()` ranks would:
/// rank r writes its slices (slices[r]) with WriteCheckpointFiles into data files
/// r * F .. r * F + F - 1 of R * F (F = options.num_data_files), its part index is made from
/// that, and the parts are merged with format::MergeShardedParts into `index`. Each box must be
/// written by one rank only (replicas filtered by the caller, as the savers do).
inline Result<format::Index> WriteShardedCheckpointFiles(
    io::FileSystem& fs, const std::string& dir, const std::vector<std::vector<HostSlice>>& slices,
    const CheckpointMetadata& metadata, const WriterOptions& options) {
  const uint32_t world = static_cast<uint32_t>(slices.size());
  const uint32_t per_rank = options.num_data_files;
  std::vector<format::Index> parts;
  for (uint32_t r = 0; r < world; ++r) {
    std::string rank_dir = dir;  // appended: GCC 12 -O3 -Wrestrict false positive otherwise
    rank_dir += "/rank-";
    rank_dir += std::to_string(r);
    RETURN_IF_ERROR(ToStatus(fs.create_dir(rank_dir)));
    std::vector<format::HostTensor> tensors;
    for (const HostSlice& slice : slices[r]) tensors.push_back(slice.tensor);
    RETURN_IF_ERROR(WriteCheckpointFiles(fs, rank_dir, tensors, metadata, options).status());
    std::unique_ptr<io::File> file;
    RETURN_IF_ERROR(ToStatus(fs.open(rank_dir + "/" + format::kIndexFileName, {}, &file)));
    uint64_t size = 0;
    RETURN_IF_ERROR(ToStatus(file->size(&size)));
    std::vector<uint8_t> bytes(size);
    RETURN_IF_ERROR(ToStatus(file->read_at(0, bytes.data(), bytes.size())));
    ASSIGN_OR_RETURN(format::Index part, format::ParseIndex(bytes, rank_dir));
    part.sharded = true;
    part.world_size = world;
    part.num_data_files = world * per_rank;
    for (size_t t = 0; t < part.tensors.size(); ++t) {
      format::TensorEntry& entry = part.tensors[t];
      entry.global_shape = slices[r][t].global_shape;
      entry.box_offset = slices[r][t].box_offset;
      entry.writer_rank = r;
      for (format::ChunkEntry& chunk : entry.chunks) chunk.file_index += r * per_rank;
    }
    for (uint32_t i = 0; i < per_rank; ++i) {
      RETURN_IF_ERROR(ToStatus(
          fs.rename(rank_dir + "/" + format::DataFileName(i, per_rank),
                    dir + "/" + format::DataFileName(r * per_rank + i, world * per_rank))));
    }
    RETURN_IF_ERROR(ToStatus(fs.remove_tree(rank_dir)));
    parts.push_back(std::move(part));
  }
  ASSIGN_OR_RETURN(format::Index index, format::MergeShardedParts(std::move(parts), world));
  const std::vector<uint8_t> index_bytes = format::EncodeIndex(index);
  std::unique_ptr<io::File> file;
  RETURN_IF_ERROR(
      ToStatus(fs.open(dir + "/" + format::kIndexFileName,
                       io::OpenOptions{.write = true, .create = true, .truncate = true}, &file)));
  RETURN_IF_ERROR(ToStatus(file->write_at(0, index_bytes.data(), index_bytes.size())));
  RETURN_IF_ERROR(ToStatus(file->sync()));
  return index;
}

/// Flips one byte in the middle of chunk `chunk` of tensor `name` of `checkpoint`: damage that
/// only the chunk's checksum can see. NotFound for a tensor or chunk the index does not list.
inline Status DamageChunk(io::FileSystem& fs, const std::string& checkpoint,
                          const std::string& name, size_t chunk) {
  ASSIGN_OR_RETURN(format::Index index, format::LoadIndex(fs, checkpoint));
  for (const auto& tensor : index.tensors) {
    if (tensor.name != name) continue;
    if (chunk >= tensor.chunks.size()) break;
    const auto& c = tensor.chunks[chunk];
    const std::string data =
        checkpoint + "/" + format::DataFileName(c.file_index, index.num_data_files);
    std::fstream file(data, std::ios::binary | std::ios::in | std::ios::out);
    if (!file) return Status::IOError("cannot open " + data);
    const auto middle = static_cast<std::streamoff>(c.file_offset + c.stored_bytes / 2);
    file.seekg(middle);
    const char byte = static_cast<char>(file.get() ^ 0x5a);
    file.seekp(middle);
    file.put(byte);
    return file ? Status::OK() : Status::IOError("cannot rewrite a byte of " + data);
  }
  return Status::NotFound("no chunk " + std::to_string(chunk) + " of tensor " + name + " in " +
                          checkpoint);
}

}  // namespace asyncckpt::testing_support
