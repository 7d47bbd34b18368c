// LoadIndex, the one reader of a checkpoint's index file, and the check of a whole checkpoint's
// index against the sizes of its data files (what the savers' start-up validator asks).

#include "src/format/index_file.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <vector>

#include "src/codec/codec.h"
#include "src/util/io_status.h"
#include "src/util/status_macros.h"

namespace asyncckpt::format {
namespace {

uint64_t LoadU64(const uint8_t* p) {
  uint64_t value = 0;
  std::memcpy(&value, p, sizeof(value));  // the format is little-endian, as is every target
  return value;
}

// True for an intact index (magic, end magic, checksum) of a format version this build does
// not read: a newer library's checkpoint, which must never be taken for debris.
bool IsIntactIndexOfAnotherVersion(std::span<const uint8_t> bytes) {
  if (bytes.size() < kIndexHeaderBytes + kIndexFooterBytes) return false;
  if (LoadU64(bytes.data()) != kIndexMagic ||
      LoadU64(bytes.data() + bytes.size() - 8) != kIndexEndMagic) {
    return false;
  }
  const size_t checksum_at = bytes.size() - 16;
  if (codec::Checksum(bytes.first(checksum_at)) != LoadU64(bytes.data() + checksum_at)) {
    return false;
  }
  uint32_t version = 0;
  std::memcpy(&version, bytes.data() + 8, sizeof(version));
  return version != kFormatVersion;
}

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
  if (IsIntactIndexOfAnotherVersion(bytes)) {
    uint32_t version = 0;
    std::memcpy(&version, bytes.data() + 8, sizeof(version));
    return Status::FailedPrecondition("index " + index_path +
                                      " was written in another format version (" +
                                      std::to_string(version) + "; this build reads version " +
                                      std::to_string(kFormatVersion) + ")");
  }
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

}  // namespace asyncckpt::format
