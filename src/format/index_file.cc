// LoadIndex, the one reader of a checkpoint's index file, and the check of a whole checkpoint's
// index against the sizes of its data files (what the savers' start-up validator asks).

#include "src/format/index_file.h"

#include <cerrno>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <vector>

#include "src/util/io_status.h"
#include "src/util/status_macros.h"

namespace asyncckpt::format {
namespace {

// Looked at through lstat before it is opened: a symlink is never followed, a FIFO never opened.
Status CheckIndexEntry(io::FileSystem& fs, const std::string& checkpoint_path,
                       const std::string& index_path) {
  io::EntryType type = io::EntryType::kNone;
  RETURN_IF_ERROR(ToStatus(fs.entry_type(index_path, &type)));
  if (type == io::EntryType::kNone) {
    return Status::NotFound("checkpoint " + checkpoint_path + " has no index file " + index_path);
  }
  if (type != io::EntryType::kFile) {
    return Status::Corruption("index " + index_path + " is " + DescribeEntryType(type) +
                              ", not a regular file");
  }
  return Status::OK();
}

Result<Index> ReadAndParse(io::FileSystem& fs, const std::string& checkpoint_path,
                           const std::string& index_path) {
  RETURN_IF_ERROR(CheckIndexEntry(fs, checkpoint_path, index_path));
  std::unique_ptr<io::File> file;
  const io::IoStatus opened = fs.open(index_path, io::OpenOptions{}, &file);
  if (opened.error_number() == ENOENT) {  // removed since it was looked at
    return Status::NotFound("checkpoint " + checkpoint_path + " has no index file " + index_path);
  }
  RETURN_IF_ERROR(ToStatus(opened));
  uint64_t size = 0;
  RETURN_IF_ERROR(ToStatus(file->size(&size)));
  if (size > kMaxIndexBytes) {
    return Status::Corruption("index " + index_path + " is " + std::to_string(size) +
                              " bytes; at most " + std::to_string(kMaxIndexBytes) + " accepted");
  }
  std::vector<uint8_t> bytes(size);
  RETURN_IF_ERROR(ToStatus(file->read_at(0, bytes.data(), bytes.size())));
  return ParseIndex(bytes, index_path);
}

// The sizes of the index's data files, each looked at and sized, never opened: a FIFO named like
// a data file has size 0 and would block a read.
Result<std::vector<uint64_t>> DataFileSizes(io::FileSystem& fs, const std::string& checkpoint_path,
                                            uint32_t num_data_files) {
  std::vector<uint64_t> sizes;
  for (uint32_t i = 0; i < num_data_files; ++i) {
    const std::string data_path = checkpoint_path + "/" + DataFileName(i, num_data_files);
    io::EntryType type = io::EntryType::kNone;
    RETURN_IF_ERROR(ToStatus(fs.entry_type(data_path, &type)));
    if (type != io::EntryType::kFile && type != io::EntryType::kNone) {
      return Status::Corruption("checkpoint " + checkpoint_path + ": data file " + data_path +
                                " is " + DescribeEntryType(type) + ", not a regular file");
    }
    uint64_t data_size = 0;
    const io::IoStatus sized = fs.file_size(data_path, &data_size);
    if (sized.error_number() == ENOENT) {
      return Status::Corruption("checkpoint " + checkpoint_path + ": data file " + data_path +
                                " is missing");
    }
    RETURN_IF_ERROR(ToStatus(sized));
    sizes.push_back(data_size);
  }
  return sizes;
}

}  // namespace

std::string IndexPath(const std::string& checkpoint_path) {
  return checkpoint_path + "/" + kIndexFileName;
}

Result<Index> LoadIndex(io::FileSystem& fs, const std::string& checkpoint_path) {
  const std::string index_path = IndexPath(checkpoint_path);
  try {
    return ReadAndParse(fs, checkpoint_path, index_path);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("out of memory reading index " + index_path);
  } catch (const std::length_error& e) {
    return Status::ResourceExhausted("out of memory reading index " + index_path + ": " + e.what());
  }
}

Result<Index> LoadIndexCheckingDataFiles(io::FileSystem& fs, const std::string& checkpoint_path) {
  ASSIGN_OR_RETURN(Index index, LoadIndex(fs, checkpoint_path));
  ASSIGN_OR_RETURN(const std::vector<uint64_t> sizes,
                   DataFileSizes(fs, checkpoint_path, index.num_data_files));
  RETURN_IF_ERROR(CheckChunkLocations(index, IndexPath(checkpoint_path), sizes));
  return index;
}

namespace {

// Where one chunk's stored bytes lie, for finding chunks that share bytes.
struct StoredRange {
  uint64_t begin = 0;
  uint64_t end = 0;  // past the last byte; begin < end (stored_bytes > 0 was checked)
  uint64_t chunk = 0;
  uint32_t file = 0;
  uint32_t tensor = 0;
};

std::string ChunkName(const Index& index, const StoredRange& range) {
  return "tensor " + QuoteName(index.tensors[range.tensor].name) + " chunk " +
         std::to_string(range.chunk);
}

// Sorted by file and first byte, any overlap shows between neighbours: the earliest range that
// overlaps a later one also overlaps the range right after it.
Status CheckNoSharedBytes(const Index& index, const std::string& prefix) {
  size_t count = 0;
  for (const TensorEntry& tensor : index.tensors) count += tensor.chunks.size();
  std::vector<StoredRange> ranges;
  ranges.reserve(count);
  for (size_t t = 0; t < index.tensors.size(); ++t) {
    const TensorEntry& tensor = index.tensors[t];
    for (size_t i = 0; i < tensor.chunks.size(); ++i) {
      const ChunkEntry& c = tensor.chunks[i];
      ranges.push_back({c.file_offset, c.file_offset + c.stored_bytes, i, c.file_index,
                        static_cast<uint32_t>(t)});
    }
  }
  std::sort(ranges.begin(), ranges.end(), [](const StoredRange& a, const StoredRange& b) {
    return std::tie(a.file, a.begin) < std::tie(b.file, b.begin);
  });
  for (size_t k = 1; k < ranges.size(); ++k) {
    const StoredRange& before = ranges[k - 1];
    const StoredRange& after = ranges[k];
    if (after.file != before.file || after.begin >= before.end) continue;
    return Status::Corruption(prefix + ChunkName(index, before) + " and " +
                              ChunkName(index, after) + " share stored bytes [" +
                              std::to_string(after.begin) + ", " +
                              std::to_string(std::min(before.end, after.end)) + ") of " +
                              DataFileName(after.file, index.num_data_files) +
                              "; every chunk must have bytes of its own");
  }
  return Status::OK();
}

}  // namespace

Status CheckChunkLocations(const Index& index, std::string_view path,
                           std::span<const uint64_t> data_file_sizes) {
  const std::string prefix = "index " + std::string(path) + ": ";
  if (data_file_sizes.size() != index.num_data_files) {
    return Status::Corruption(prefix + "names " + std::to_string(index.num_data_files) +
                              " data files, but " + std::to_string(data_file_sizes.size()) +
                              " were found");
  }
  for (const TensorEntry& tensor : index.tensors) {
    for (size_t i = 0; i < tensor.chunks.size(); ++i) {
      const ChunkEntry& chunk = tensor.chunks[i];
      if (chunk.file_index >= data_file_sizes.size()) {
        return Status::Corruption(prefix + "tensor " + QuoteName(tensor.name) + " chunk " +
                                  std::to_string(i) + " is in data file " +
                                  std::to_string(chunk.file_index) + ", which does not exist");
      }
      const uint64_t size = data_file_sizes[chunk.file_index];
      if (chunk.file_offset > size || chunk.stored_bytes > size - chunk.file_offset) {
        return Status::Corruption(
            prefix + "tensor " + QuoteName(tensor.name) + " chunk " + std::to_string(i) +
            " lies at bytes [" + std::to_string(chunk.file_offset) + ", +" +
            std::to_string(chunk.stored_bytes) + ") of " +
            DataFileName(chunk.file_index, index.num_data_files) + ", which holds only " +
            std::to_string(size) + " bytes (truncated data file?)");
      }
    }
  }
  return CheckNoSharedBytes(index, prefix);
}

}  // namespace asyncckpt::format
