#include "asyncckpt/reader.h"

#include <oneapi/tbb/enumerable_thread_specific.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <exception>
#include <iterator>
#include <mutex>
#include <new>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"
#include "src/codec/codec.h"
#include "src/format/format.h"
#include "src/reader/read_plan.h"
#include "src/reader/streaming_read.h"
#include "src/util/byte_buffer.h"
#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {
namespace {

using format::ChunkEntry;
using format::TensorEntry;

// Per-thread working memory for decoding.
struct ThreadScratch {
  codec::Scratch codec;
  ByteBuffer decoded;  // verify(): decoded bytes of one chunk
};

// A chunk that failed, with its position for ordering the report.
struct ChunkFailure {
  size_t tensor = 0;
  size_t chunk = 0;
  Status status;
};

bool ByPosition(const ChunkFailure& a, const ChunkFailure& b) {
  return std::tie(a.tensor, a.chunk) < std::tie(b.tensor, b.chunk);
}

std::string Quote(const std::string& name) { return "'" + name + "'"; }

std::string DescribeShape(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

void LogFallbackOnce(const std::string& reason) {
  static std::once_flag once;
  if (!reason.empty()) std::call_once(once, [&] { LogLine("checkpoint reader: " + reason); });
}

void LogDirectFallbackOnce(const std::string& reason) {
  static std::once_flag once;
  std::call_once(once, [&] { LogLine("checkpoint reader: " + reason); });
}

// "N bytes (X.Y GiB)" for a message about memory.
std::string DescribeBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double scaled = static_cast<double>(bytes);
  size_t unit = 0;
  while (scaled >= 1024.0 && unit + 1 < std::size(kUnits)) {
    scaled /= 1024.0;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof(text), "%llu bytes (%.1f %s)", static_cast<unsigned long long>(bytes),
                scaled, kUnits[unit]);
  return text;
}

// The Status for the exception in flight, which `what` (e.g. "reading tensor 'w' of 4096
// bytes from /ckpt/model.ckpt-5") describes: allocation failures are ResourceExhausted, anything
// else Internal. Call only from a catch block. Never throws: without the memory for the message,
// a short one that needs no allocation.
template <typename Describe>
Status StatusOfCurrentException(Describe&& what) noexcept {
  try {
    try {
      throw;
    } catch (const std::bad_alloc&) {
      return Status::ResourceExhausted("out of memory " + what());
    } catch (const std::length_error& e) {
      return Status::ResourceExhausted("out of memory " + what() + ": " + e.what());
    } catch (const std::exception& e) {
      return Status::Internal("unexpected error " + what() + ": " + e.what());
    } catch (...) {
      return Status::Internal("unexpected error " + what());
    }
  } catch (...) {
    return Status::ResourceExhausted("out of memory");
  }
}

class CheckpointReaderImpl final : public CheckpointReader {
 public:
  static Result<std::unique_ptr<CheckpointReader>> Open(const std::string& path,
                                                        const ReaderOptions& options) {
    std::unique_ptr<io::FileSystem> owned_fs;
    io::FileSystem* fs = options.file_system;
    if (fs == nullptr) {
      std::string fallback;
      owned_fs = io::NewDefaultFileSystem(io::IoOptions{options.queue_depth, options.force_posix},
                                          &fallback);
      LogFallbackOnce(fallback);
      fs = owned_fs.get();
    }
    std::unique_ptr<CheckpointReaderImpl> reader(
        new CheckpointReaderImpl(path, options, std::move(owned_fs), fs));
    RETURN_IF_ERROR(reader->Load());
    return std::unique_ptr<CheckpointReader>(std::move(reader));
  }

  const std::string& path() const override { return path_; }
  const CheckpointMetadata& metadata() const override { return index_.metadata; }
  const std::vector<TensorInfo>& tensors() const override { return infos_; }
  uint32_t num_data_files() const override { return index_.num_data_files; }

  const TensorInfo* find(const std::string& name) const override {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &infos_[it->second.info];
  }

  Status read(const std::string& name, void* dst, size_t dst_bytes) override {
    try {
      return Read(name, dst, dst_bytes);
    } catch (...) {
      return StatusOfCurrentException([&] {
        return "reading tensor " + Quote(name) + " of " + DescribeBytes(dst_bytes) + " from " +
               path_;
      });
    }
  }

  Status restore(const TensorRegistry& registry) override {
    try {
      return Restore(registry);
    } catch (...) {
      return StatusOfCurrentException([&] {
        return "restoring " + std::to_string(registry.size()) + " tensors of " +
               DescribeBytes(registry.total_bytes()) + " from " + path_;
      });
    }
  }

  VerifyReport verify() override {
    try {
      return Verify();
    } catch (...) {
      VerifyReport report;
      Status status = StatusOfCurrentException([&] { return "verifying " + path_; });
      try {
        report.problems.push_back(status.ToString());
      } catch (...) {
        // Not even the report fits: the caller still learns that nothing was checked.
      }
      return report;
    }
  }

 private:
  Status Read(const std::string& name, void* dst, size_t dst_bytes) {
    auto it = by_name_.find(name);
    if (it == by_name_.end())
      return Status::NotFound("no tensor named " + Quote(name) + " in " + path_);
    const TensorEntry& tensor = index_.tensors[it->second.entry];
    if (dst_bytes != tensor.bytes) {
      return Status::InvalidArgument("tensor " + Quote(name) + " in " + path_ + " holds " +
                                     std::to_string(tensor.bytes) + " bytes; the destination has " +
                                     std::to_string(dst_bytes));
    }
    if (tensor.bytes > 0 && dst == nullptr) {
      return Status::InvalidArgument("null destination for tensor " + Quote(name));
    }
    const reader::TensorRequest request{it->second.entry, static_cast<uint8_t*>(dst)};
    std::vector<ChunkFailure> failures = Stream({&request, 1});
    if (failures.empty()) return Status::OK();
    return failures.front().status;
  }

  Status Restore(const TensorRegistry& registry) {
    RETURN_IF_ERROR(CheckRegistry(registry));
    RETURN_IF_ERROR(RestoreHostTensors(registry));
    std::shared_ptr<Device> staging_device;
    PinnedBuffer staging;
    for (const TensorRef& ref : registry.tensors()) {
      if (ref.device == nullptr || ref.device->kind() == DeviceKind::kHost) continue;
      if (ref.bytes == 0) continue;
      // One pinned buffer, grown to the largest device tensor, serves them all.
      if (staging.size() < ref.bytes || staging_device != ref.device) {
        staging.reset();
        ASSIGN_OR_RETURN(staging, ref.device->allocate_pinned(ref.bytes));
        staging_device = ref.device;
      }
      RETURN_IF_ERROR(read(ref.name, staging.data(), ref.bytes));
      RETURN_IF_ERROR(
          ref.device->copy_from_host(staging.data(), ref.data, ref.bytes)
              .WithContext("restoring tensor " + Quote(ref.name) + " to " + ref.device->name()));
    }
    return Status::OK();
  }

  // Every host tensor of the registry in one streaming pass, so that their reads overlap.
  // CheckRegistry has matched every name, dtype and shape, hence every size.
  Status RestoreHostTensors(const TensorRegistry& registry) {
    std::vector<reader::TensorRequest> requests;
    for (const TensorRef& ref : registry.tensors()) {
      if (ref.device != nullptr && ref.device->kind() != DeviceKind::kHost) continue;
      const Location& where = by_name_.at(ref.name);
      if (ref.bytes != index_.tensors[where.entry].bytes) {
        return Status::InvalidArgument("tensor " + Quote(ref.name) + " in " + path_ + " holds " +
                                       std::to_string(index_.tensors[where.entry].bytes) +
                                       " bytes; the registry's buffer has " +
                                       std::to_string(ref.bytes));
      }
      if (ref.bytes > 0 && ref.data == nullptr) {
        return Status::InvalidArgument("null destination for tensor " + Quote(ref.name));
      }
      requests.push_back({where.entry, static_cast<uint8_t*>(ref.data)});
    }
    std::vector<ChunkFailure> failures = Stream(requests);
    if (failures.empty()) return Status::OK();
    return failures.front().status;
  }

  VerifyReport Verify() {
    std::vector<reader::TensorRequest> requests;
    VerifyReport report;
    for (size_t t = 0; t < index_.tensors.size(); ++t) {
      requests.push_back({t, nullptr});
      report.chunks_checked += index_.tensors[t].chunks.size();
      report.bytes_checked += index_.tensors[t].bytes;
    }
    std::vector<ChunkFailure> failures = Stream(requests);
    for (const ChunkFailure& failure : failures) {
      report.problems.push_back(failure.status.ToString());
    }
    return report;
  }

  struct Location {
    size_t info = 0;   // index into infos_
    size_t entry = 0;  // index into index_.tensors
  };

  CheckpointReaderImpl(std::string path, const ReaderOptions& options,
                       std::unique_ptr<io::FileSystem> owned_fs, io::FileSystem* fs)
      : path_(std::move(path)), options_(options), owned_fs_(std::move(owned_fs)), fs_(fs) {}

  Status Load() {
    bool exists = false, is_dir = false;
    RETURN_IF_ERROR(ToStatus(fs_->stat(path_, &exists, &is_dir)));
    if (!exists) return Status::NotFound("no checkpoint at " + path_);
    if (!is_dir) return Status::NotFound(path_ + " is not a checkpoint directory");
    ASSIGN_OR_RETURN(index_, ReadIndex());
    std::vector<uint64_t> sizes;
    RETURN_IF_ERROR(OpenDataFiles(&sizes));
    RETURN_IF_ERROR(format::CheckChunkLocations(index_, index_path_, sizes));
    file_sizes_ = std::move(sizes);
    if (options_.use_o_direct) OpenDirectHandles();
    BuildInfos();
    return Status::OK();
  }

  Result<format::Index> ReadIndex() {
    index_path_ = path_ + "/" + format::kIndexFileName;
    std::unique_ptr<io::File> file;
    io::IoStatus opened = fs_->open(index_path_, io::OpenOptions{}, &file);
    if (opened.error_number() == ENOENT) {
      return Status::NotFound("checkpoint " + path_ + " has no index file " + index_path_);
    }
    RETURN_IF_ERROR(ToStatus(opened));
    uint64_t size = 0;
    RETURN_IF_ERROR(ToStatus(file->size(&size)));
    if (size > format::kMaxIndexBytes) {
      return Status::Corruption("index " + index_path_ + " is " + std::to_string(size) +
                                " bytes; at most " + std::to_string(format::kMaxIndexBytes) +
                                " accepted");
    }
    std::vector<uint8_t> bytes;
    try {
      bytes.resize(size);
    } catch (...) {
      return StatusOfCurrentException(
          [&] { return "reading index " + index_path_ + " of " + DescribeBytes(size); });
    }
    RETURN_IF_ERROR(ToStatus(file->read_at(0, bytes.data(), bytes.size())));
    return format::ParseIndex(bytes, index_path_);
  }

  // The first chunk stored in data file `file`, for naming what a missing file takes away.
  std::string FirstChunkIn(uint32_t file) const {
    for (const TensorEntry& tensor : index_.tensors) {
      for (size_t i = 0; i < tensor.chunks.size(); ++i) {
        if (tensor.chunks[i].file_index == file) {
          return "; it holds tensor " + Quote(tensor.name) + " chunk " + std::to_string(i);
        }
      }
    }
    return "";
  }

  Status OpenDataFiles(std::vector<uint64_t>* sizes) {
    const uint32_t count = index_.num_data_files;
    for (uint32_t i = 0; i < count; ++i) {
      std::string file_path = path_ + "/" + format::DataFileName(i, count);
      std::unique_ptr<io::File> file;
      io::IoStatus opened = fs_->open(file_path, io::OpenOptions{}, &file);
      if (opened.error_number() == ENOENT) {
        return Status::Corruption("checkpoint " + path_ + ": data file " + file_path +
                                  " is missing (the index names " + std::to_string(count) +
                                  " data files" + FirstChunkIn(i) + ")");
      }
      RETURN_IF_ERROR(ToStatus(opened));
      uint64_t size = 0;
      RETURN_IF_ERROR(ToStatus(file->size(&size)));
      sizes->push_back(size);
      files_.push_back(std::move(file));
    }
    return Status::OK();
  }

  // A second, O_DIRECT handle per data file, so that restores bypass the page cache. Where the
  // file system refuses (tmpfs, some wrappers), reads stay buffered: slower, never wrong.
  void OpenDirectHandles() {
    std::string refused;
    for (const auto& file : files_) {
      std::unique_ptr<io::File> direct;
      io::OpenOptions open_options;
      open_options.direct = true;
      io::IoStatus opened = fs_->open(file->path(), open_options, &direct);
      if (!opened.ok() || direct == nullptr || !direct->is_direct()) {
        if (refused.empty()) refused = opened.ok() ? file->path() : opened.message();
        direct.reset();
      }
      direct_files_.push_back(std::move(direct));
    }
    if (!refused.empty()) {
      LogDirectFallbackOnce("O_DIRECT refused (" + refused + "); reading through the page cache");
    }
  }

  void BuildInfos() {
    std::vector<size_t> order(index_.tensors.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return index_.tensors[a].name < index_.tensors[b].name; });
    for (size_t entry : order) {
      const TensorEntry& t = index_.tensors[entry];
      TensorInfo info{t.name, t.dtype, t.shape, t.bytes, 0, t.chunks.size(), {}};
      for (const ChunkEntry& c : t.chunks) {
        info.stored_bytes += c.stored_bytes;
        ++info.chunks_by_codec[std::string(codec::CodecName(c.codec))];
      }
      by_name_[t.name] = Location{infos_.size(), entry};
      infos_.push_back(std::move(info));
    }
  }

  Status CheckRegistry(const TensorRegistry& registry) const {
    std::string problems;
    for (const TensorRef& ref : registry.tensors()) {
      const TensorInfo* info = find(ref.name);
      std::string problem;
      if (info == nullptr) {
        problem = "tensor " + Quote(ref.name) + " is not in the checkpoint";
      } else if (info->dtype != ref.dtype) {
        problem = "tensor " + Quote(ref.name) + " is " + std::string(DTypeName(ref.dtype)) +
                  " in the registry but " + std::string(DTypeName(info->dtype)) +
                  " in the checkpoint";
      } else if (info->shape != ref.shape) {
        problem = "tensor " + Quote(ref.name) + " has shape " + DescribeShape(ref.shape) +
                  " in the registry but " + DescribeShape(info->shape) + " in the checkpoint";
      }
      if (!problem.empty()) problems += (problems.empty() ? "" : "; ") + problem;
    }
    if (problems.empty()) return Status::OK();
    return Status::InvalidArgument("cannot restore from " + path_ + ": " + problems);
  }

  // "<dir>/data-00001-of-00002: tensor 'w' chunk 3 (N stored bytes at offset X, zstd)"
  std::string DescribeChunk(const TensorEntry& tensor, size_t i) const {
    const ChunkEntry& c = tensor.chunks[i];
    return files_[c.file_index]->path() + ": tensor " + Quote(tensor.name) + " chunk " +
           std::to_string(i) + " (" + std::to_string(c.stored_bytes) + " stored bytes at offset " +
           std::to_string(c.file_offset) + ", " + std::string(codec::CodecName(c.codec)) + ")";
  }

  // Reads every chunk of `requests` through the streaming plan, decoding each into its
  // destination (or into scratch, for verify) as it arrives. Returns every failed chunk.
  std::vector<ChunkFailure> Stream(std::span<const reader::TensorRequest> requests) {
    std::vector<reader::DataFileHandles> handles;
    reader::PlanOptions plan_options;
    for (size_t i = 0; i < files_.size(); ++i) {
      io::File* direct = i < direct_files_.size() ? direct_files_[i].get() : nullptr;
      handles.push_back({files_[i].get(), direct});
      plan_options.direct.push_back(direct != nullptr);
    }
    plan_options.file_sizes = file_sizes_;
    const std::vector<reader::Extent> plan = reader::PlanReads(index_, requests, plan_options);

    std::mutex failures_mu;
    std::vector<ChunkFailure> failures;
    auto failed = [&](const reader::PlannedChunk& p, const Status& status) {
      Status described = status.WithContext(DescribeChunk(index_.tensors[p.tensor], p.chunk));
      std::lock_guard lock(failures_mu);
      failures.push_back({p.tensor, p.chunk, std::move(described)});
    };
    auto record = [&](const reader::PlannedChunk& p, const Status& status) noexcept {
      try {
        failed(p, status);
      } catch (...) {
        // No memory to describe it: the bare status still names the failure.
        try {
          std::lock_guard lock(failures_mu);
          failures.push_back({p.tensor, p.chunk, status});
        } catch (...) {
        }
      }
    };
    auto sink = [&](const reader::PlannedChunk& p, std::span<uint8_t> stored) noexcept {
      Status status = DecodeChunk(p, stored);
      if (!status.ok()) record(p, status);
    };
    auto chunk_bytes = [&](const reader::PlannedChunk& p) {
      return index_.tensors[p.tensor].chunks[p.chunk].stored_bytes;
    };
    reader::StreamOptions stream_options;
    stream_options.queue_depth = std::max(options_.queue_depth, 1u);
    stream_options.buffer_bytes = options_.read_buffer_bytes;
    reader::RunReadPlan(*fs_, handles, plan, chunk_bytes, stream_options, sink, record);
    std::sort(failures.begin(), failures.end(), ByPosition);
    return failures;
  }

  // Decodes and checksums one chunk's stored bytes into its destination, or into this thread's
  // scratch when it has none. A failed allocation fails the chunk, naming the bytes it needed.
  Status DecodeChunk(const reader::PlannedChunk& p, std::span<uint8_t> stored) noexcept {
    const TensorEntry& tensor = index_.tensors[p.tensor];
    const ChunkEntry& c = tensor.chunks[p.chunk];
    try {
      ThreadScratch& scratch = scratch_.local();
      uint8_t* out = p.destination;
      if (out == nullptr) {
        out = c.codec == codec::Codec::kRaw ? stored.data() : scratch.decoded.reserve(c.raw_bytes);
      }
      return codec::Decode(c.codec, stored, DTypeSize(tensor.dtype), c.xxh3,
                           std::span<uint8_t>(out, c.raw_bytes), scratch.codec);
    } catch (...) {
      return StatusOfCurrentException([&] {
        return "reading tensor " + Quote(tensor.name) + " (" + DescribeBytes(tensor.bytes) +
               ") chunk " + std::to_string(p.chunk) + " from " + path_ + "; the step needed " +
               DescribeBytes(c.raw_bytes) + " of scratch memory";
      });
    }
  }

  std::string path_;
  std::string index_path_;
  ReaderOptions options_;
  std::unique_ptr<io::FileSystem> owned_fs_;  // the default backend when none was given
  io::FileSystem* fs_;
  std::vector<std::unique_ptr<io::File>> files_;         // one per data file, buffered
  std::vector<std::unique_ptr<io::File>> direct_files_;  // O_DIRECT ones, null where refused
  std::vector<uint64_t> file_sizes_;
  format::Index index_;
  std::vector<TensorInfo> infos_;  // in name order
  std::unordered_map<std::string, Location> by_name_;
  tbb::enumerable_thread_specific<ThreadScratch> scratch_;
};

}  // namespace

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& path,
                                                                 const ReaderOptions& options) {
  try {
    return CheckpointReaderImpl::Open(path, options);
  } catch (...) {
    return StatusOfCurrentException([&] { return "opening checkpoint " + path; });
  }
}

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::OpenLatest(
    const std::string& dir, const ReaderOptions& options) {
  try {
    ASSIGN_OR_RETURN(std::string latest,
                     LatestCheckpoint(dir, kCheckpointStateFileName, options.file_system));
    return Open(latest, options);
  } catch (...) {
    return StatusOfCurrentException([&] { return "opening the latest checkpoint in " + dir; });
  }
}

}  // namespace asyncckpt
