// CheckpointReader: opening a checkpoint (its index through format::LoadIndex, its data files,
// the tensor list), and reading, restoring and verifying it through the streaming read plan. The
// geometry of box reads lives in box.{h,cc}.

#include "asyncckpt/reader.h"

#include <oneapi/tbb/enumerable_thread_specific.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"
#include "src/codec/bounded_verify.h"
#include "src/codec/codec.h"
#include "src/format/format.h"
#include "src/format/index_file.h"
#include "src/reader/box.h"
#include "src/reader/device_restore.h"
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
using reader::BoxRequest;
using reader::CutSlice;
using reader::DescribeShape;
using reader::ForEachPiece;
using reader::Quote;
using reader::SliceCut;

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

void LogFallbackOnce(const std::string& reason) {
  static std::once_flag once;
  if (!reason.empty()) std::call_once(once, [&] { LogWarning("checkpoint reader: " + reason); });
}

void LogDirectFallbackOnce(const std::string& reason) {
  static std::once_flag once;
  std::call_once(once, [&] { LogWarning("checkpoint reader: " + reason); });
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
    RETURN_IF_ERROR(ValidateQueueDepth(options.queue_depth).WithContext("opening " + path));
    std::unique_ptr<io::FileSystem> owned_fs;
    io::FileSystem* fs = options.file_system;
    if (fs == nullptr) {
      std::string fallback;
      owned_fs = io::NewDefaultFileSystem(io::IoOptions{.force_posix_io = options.force_posix_io},
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
  bool sharded() const override { return index_.sharded; }
  uint32_t world_size() const override { return index_.sharded ? index_.world_size : 1; }
  ReadStats read_stats() const override {
    return ReadStats{bytes_read_.load(std::memory_order_relaxed),
                     chunks_read_.load(std::memory_order_relaxed)};
  }

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

  Status read_box(const std::string& name, const std::vector<int64_t>& offset,
                  const std::vector<int64_t>& shape, void* dst, size_t dst_bytes) override {
    try {
      const BoxRequest request{&name,     &offset, &shape, static_cast<uint8_t*>(dst),
                               dst_bytes, false};
      return ReadBoxes({&request, 1});
    } catch (...) {
      return StatusOfCurrentException([&] {
        return "reading a box of tensor " + Quote(name) + " of " + DescribeBytes(dst_bytes) +
               " from " + path_;
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
    const std::vector<int64_t>& shape = infos_[it->second.info].shape;
    const std::vector<int64_t> first(shape.size(), 0);
    const BoxRequest request{&name, &first, &shape, static_cast<uint8_t*>(dst), dst_bytes, true};
    return ReadBoxes({&request, 1});
  }

  // Reads every box of `requests` in one streaming pass, so that their reads overlap: chunks
  // that lie inside one run of a box decode straight into its buffer; a chunk that only partly
  // belongs to a box, or to several runs, decodes into scratch and is copied piece by piece.
  // With `register_destinations`, the boxes that reads land in directly are registered with
  // the file system while they run (RegisteredDestinations).
  Status ReadBoxes(std::span<const BoxRequest> requests, bool register_destinations = false) {
    std::vector<SliceCut> cuts;
    std::vector<reader::ChunkRequest> chunks;
    std::unordered_map<uint64_t, size_t> scattered;  // (entry << 32 | chunk) -> cut
    for (const BoxRequest& request : requests) {
      auto it = by_name_.find(*request.name);
      if (it == by_name_.end()) {
        return Status::NotFound("no tensor named " + Quote(*request.name) + " in " + path_);
      }
      RETURN_IF_ERROR(CheckBox(request, infos_[it->second.info], path_));
      if (request.dst_bytes == 0) continue;
      for (size_t entry : it->second.entries) {
        const TensorEntry& t = index_.tensors[entry];
        std::optional<SliceCut> cut =
            CutSlice(entry, t, *request.first, *request.shape, request.dst);
        if (!cut) continue;
        for (size_t i = 0; i < t.chunks.size(); ++i) {
          const ChunkEntry& c = t.chunks[i];
          int pieces = 0;
          uint8_t* first_dst = nullptr;
          uint64_t first_length = 0;
          ForEachPiece(*cut, c.tensor_offset, c.tensor_offset + c.raw_bytes,
                       [&](uint64_t, uint64_t length, uint8_t* dst) {
                         if (pieces++ == 0) {
                           first_dst = dst;
                           first_length = length;
                         }
                         return pieces < 2;
                       });
          if (pieces == 0) continue;
          if (pieces == 1 && first_length == c.raw_bytes) {
            chunks.push_back({entry, i, first_dst});
          } else {
            chunks.push_back({entry, i, nullptr});
            scattered[static_cast<uint64_t>(entry) << 32 | i] = cuts.size();
          }
        }
        cuts.push_back(std::move(*cut));
      }
    }
    const Scatter scatter = [&](const reader::PlannedChunk& p, std::span<const uint8_t> raw) {
      const SliceCut& cut = cuts[scattered.at(static_cast<uint64_t>(p.tensor) << 32 | p.chunk)];
      const uint64_t a = index_.tensors[p.tensor].chunks[p.chunk].tensor_offset;
      ForEachPiece(cut, a, a + raw.size(), [&](uint64_t from, uint64_t length, uint8_t* dst) {
        std::memcpy(dst, raw.data() + (from - a), length);
        return true;
      });
    };
    std::vector<std::pair<uint8_t*, uint64_t>> regions;
    for (const BoxRequest& r : requests) {
      if (r.dst_bytes > 0 && register_destinations) regions.emplace_back(r.dst, r.dst_bytes);
    }
    std::vector<ChunkFailure> failures =
        Stream(chunks, scattered.empty() ? nullptr : &scatter, regions);
    if (failures.empty()) return Status::OK();
    return failures.front().status;
  }

  Status Restore(const TensorRegistry& registry) {
    RETURN_IF_ERROR(reader::CheckRegistry(*this, registry));
    RETURN_IF_ERROR(RestoreHostTensors(registry));
    // Device tensors: piece by piece through pinned bounce buffers, each piece's copy to the
    // device overlapping the next piece's reads.
    return reader::RestoreDevicePieces(
        reader::PlanDevicePieces(registry, reader::kDevicePieceBytes),
        [&](const reader::DevicePiece& piece, uint8_t* host) {
          const BoxRequest request{&piece.ref->name, &piece.first, &piece.shape, host,
                                   piece.bytes,      false};
          return ReadBoxes({&request, 1});
        });
  }

  // Every host tensor of the registry in one streaming pass, so that their reads overlap.
  // CheckRegistry has matched every name, dtype and (global) shape. A shard reads its box.
  Status RestoreHostTensors(const TensorRegistry& registry) {
    std::vector<BoxRequest> requests;
    std::vector<std::vector<int64_t>> zeros;  // the first index of whole tensors
    zeros.reserve(registry.size());
    for (const TensorRef& ref : registry.tensors()) {
      if (ref.device != nullptr && ref.device->kind() != DeviceKind::kHost) continue;
      const std::vector<int64_t>* first = &ref.global_offset;
      if (!IsShard(ref)) {
        zeros.emplace_back(ref.shape.size(), 0);
        first = &zeros.back();
      }
      requests.push_back({&ref.name, first, &ref.shape, static_cast<uint8_t*>(ref.data), ref.bytes,
                          !IsShard(ref)});
    }
    return ReadBoxes(requests, /*register_destinations=*/true);
  }

  VerifyReport Verify() {
    std::vector<reader::ChunkRequest> requests;
    VerifyReport report;
    for (size_t t = 0; t < index_.tensors.size(); ++t) {
      for (size_t i = 0; i < index_.tensors[t].chunks.size(); ++i) requests.push_back({t, i});
      report.chunks_checked += index_.tensors[t].chunks.size();
      report.bytes_checked += index_.tensors[t].bytes;
    }
    std::vector<ChunkFailure> failures = Stream(requests, nullptr);
    for (const ChunkFailure& failure : failures) {
      report.problems.push_back(failure.status.ToString());
    }
    return report;
  }

  struct Location {
    size_t info = 0;              // index into infos_
    std::vector<size_t> entries;  // its slices: indices into index_.tensors (one when unsharded)
  };

  CheckpointReaderImpl(std::string path, const ReaderOptions& options,
                       std::unique_ptr<io::FileSystem> owned_fs, io::FileSystem* fs)
      : path_(std::move(path)), options_(options), owned_fs_(std::move(owned_fs)), fs_(fs) {}

  Status Load() {
    io::EntryType type = io::EntryType::kNone;
    RETURN_IF_ERROR(ToStatus(fs_->entry_type(path_, &type, io::Symlinks::kFollow)));
    if (type == io::EntryType::kNone) {
      // An empty path is shown as '' so that the message never ends in nothing.
      return Status::NotFound("no checkpoint at " + (path_.empty() ? std::string("''") : path_));
    }
    if (type != io::EntryType::kDirectory) {
      return Status::NotFound(path_ + " is not a checkpoint directory");
    }
    index_path_ = format::IndexPath(path_);
    ASSIGN_OR_RETURN(index_, format::LoadIndex(*fs_, path_));
    std::vector<uint64_t> sizes;
    RETURN_IF_ERROR(OpenDataFiles(&sizes));
    RETURN_IF_ERROR(format::CheckChunkLocations(index_, index_path_, sizes));
    file_sizes_ = std::move(sizes);
    // An unsharded tensor is one slice covering itself, so that one box path reads both kinds.
    if (!index_.sharded) {
      for (TensorEntry& t : index_.tensors) {
        t.global_shape = t.shape;
        t.box_offset.assign(t.shape.size(), 0);
      }
    }
    if (options_.use_o_direct) OpenDirectHandles();
    BuildInfos();
    return Status::OK();
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

  // One TensorInfo per name (sharded: the global tensor, with its slices), in name order.
  void BuildInfos() {
    std::vector<size_t> order(index_.tensors.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return index_.tensors[a].name < index_.tensors[b].name;
    });
    for (size_t entry : order) {
      const TensorEntry& t = index_.tensors[entry];
      auto [it, added] = by_name_.try_emplace(t.name, Location{infos_.size(), {}});
      if (added) {
        TensorInfo info;
        info.name = t.name;
        info.dtype = t.dtype;
        info.shape = t.global_shape;
        // ParseIndex checked that the global shape's bytes fit in 64 bits.
        info.bytes = static_cast<uint64_t>(NumElements(t.global_shape)) * DTypeSize(t.dtype);
        infos_.push_back(std::move(info));
      }
      it->second.entries.push_back(entry);
      TensorInfo& info = infos_[it->second.info];
      info.num_chunks += t.chunks.size();
      SliceInfo slice{t.box_offset, t.shape, t.writer_rank, t.bytes, 0, t.chunks.size()};
      for (const ChunkEntry& c : t.chunks) {
        slice.stored_bytes += c.stored_bytes;
        ++info.chunks_by_codec[std::string(codec::CodecName(c.codec))];
      }
      info.stored_bytes += slice.stored_bytes;
      if (index_.sharded) info.slices.push_back(std::move(slice));
    }
  }

  // "<dir>/data-00001-of-00002: tensor 'w' chunk 3 (N stored bytes at offset X, zstd)"
  std::string DescribeChunk(const TensorEntry& tensor, size_t i) const {
    const ChunkEntry& c = tensor.chunks[i];
    return files_[c.file_index]->path() + ": tensor " + Quote(tensor.name) + " chunk " +
           std::to_string(i) + " (" + std::to_string(c.stored_bytes) + " stored bytes at offset " +
           std::to_string(c.file_offset) + ", " + std::string(codec::CodecName(c.codec)) + ")";
  }

  // Receives the decoded, verified raw bytes of a chunk that had no destination.
  using Scatter = std::function<void(const reader::PlannedChunk&, std::span<const uint8_t>)>;

  // Reads every chunk of `requests` through the streaming plan, decoding each into its
  // destination, or into scratch and then to `scatter` (null: nowhere, for verify), as it
  // arrives; those of `destinations` (the caller's buffers) that reads land in directly are
  // registered with the file system meanwhile. Returns every failed chunk.
  std::vector<ChunkFailure> Stream(
      std::span<const reader::ChunkRequest> requests, const Scatter* scatter,
      std::span<const std::pair<uint8_t*, uint64_t>> destinations = {}) {
    std::vector<reader::DataFileHandles> handles;
    reader::PlanOptions plan_options;
    for (size_t i = 0; i < files_.size(); ++i) {
      io::File* direct = i < direct_files_.size() ? direct_files_[i].get() : nullptr;
      handles.push_back({files_[i].get(), direct});
      plan_options.direct.push_back(direct != nullptr);
    }
    plan_options.file_sizes = file_sizes_;
    const std::vector<reader::Extent> plan = reader::PlanChunkReads(index_, requests, plan_options);
    uint64_t planned_bytes = 0;
    for (const reader::Extent& extent : plan) planned_bytes += extent.length;
    bytes_read_.fetch_add(planned_bytes, std::memory_order_relaxed);
    chunks_read_.fetch_add(requests.size(), std::memory_order_relaxed);
    // Pins only what a read lands in: registration faults in every page of a region.
    reader::RegisteredDestinations registered(owned_fs_ ? fs_ : nullptr,
                                              reader::RegionsReadInPlace(destinations, plan));

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
      Status status = DecodeChunk(p, stored, scatter);
      if (!status.ok()) record(p, status);
    };
    auto chunk_bytes = [&](const reader::PlannedChunk& p) {
      return index_.tensors[p.tensor].chunks[p.chunk].stored_bytes;
    };
    reader::StreamOptions stream_options;
    stream_options.queue_depth = options_.queue_depth;
    stream_options.buffer_bytes = options_.read_buffer_bytes;
    reader::RunReadPlan(*fs_, handles, plan, chunk_bytes, stream_options, sink, record);
    std::sort(failures.begin(), failures.end(), ByPosition);
    return failures;
  }

  // Decodes and checksums one chunk's stored bytes into its destination, or into this thread's
  // scratch when it has none. A failed allocation fails the chunk, naming the bytes it needed.
  Status DecodeChunk(const reader::PlannedChunk& p, std::span<uint8_t> stored,
                     const Scatter* scatter) noexcept {
    const TensorEntry& tensor = index_.tensors[p.tensor];
    const ChunkEntry& c = tensor.chunks[p.chunk];
    try {
      if (p.destination == nullptr && scatter == nullptr && c.codec != codec::Codec::kRaw &&
          c.raw_bytes > codec::kStreamingVerifyBytes) {
        // verify(): nothing needs the bytes, so a large chunk (a bomb, perhaps) is checked
        // through small windows instead of decoded whole.
        return codec::VerifyStreaming(c.codec, stored, DTypeSize(tensor.dtype), c.raw_bytes,
                                      c.xxh3);
      }
      ThreadScratch& scratch = scratch_.local();
      uint8_t* out = p.destination;
      if (out == nullptr) {
        out = c.codec == codec::Codec::kRaw ? stored.data() : scratch.decoded.reserve(c.raw_bytes);
      }
      RETURN_IF_ERROR(codec::Decode(c.codec, stored, DTypeSize(tensor.dtype), c.xxh3,
                                    std::span<uint8_t>(out, c.raw_bytes), scratch.codec));
      if (p.destination == nullptr && scatter != nullptr) {
        (*scatter)(p, std::span<const uint8_t>(out, c.raw_bytes));
      }
      return Status::OK();
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
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> chunks_read_{0};
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
    ASSIGN_OR_RETURN(const ResumeCheckpoints resume,
                     FindResumeCheckpoints(dir, "", kCheckpointStateFileName, options.file_system));
    return Open(resume.latest_path, options);
  } catch (...) {
    return StatusOfCurrentException([&] { return "opening the latest checkpoint in " + dir; });
  }
}

}  // namespace asyncckpt
