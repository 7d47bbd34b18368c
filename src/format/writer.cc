#include "src/format/writer.h"

#include <oneapi/tbb/enumerable_thread_specific.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/parallel_pipeline.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <unordered_set>
#include <utility>

#include "src/util/byte_buffer.h"
#include "src/util/io_status.h"
#include "src/util/status_macros.h"

namespace asyncckpt::format {

namespace {

constexpr size_t kDirectAlignment = 4096;
// Bytes gathered before one O_DIRECT write: large enough for full-speed writes, small enough
// to keep per-file memory low.
constexpr size_t kDirectBlockBytes = 1 << 20;

std::string Quote(const std::string& name) { return "'" + name + "'"; }

}  // namespace

Status ValidateWriterOptions(const WriterOptions& options) {
  if (options.chunk_bytes == 0 || options.chunk_bytes > kMaxChunkBytes) {
    return Status::InvalidArgument("chunk_bytes must be 1 to " + std::to_string(kMaxChunkBytes) +
                                   ", got " + std::to_string(options.chunk_bytes));
  }
  if (options.num_data_files == 0 || options.num_data_files > kMaxDataFiles) {
    return Status::InvalidArgument("num_data_files must be 1 to " + std::to_string(kMaxDataFiles) +
                                   ", got " + std::to_string(options.num_data_files));
  }
  return ValidateCompressionOptions(options.compression);
}

namespace {

// Everything the index needs from the tensors; data pointers only when asked (assembling an
// index reads names, types and shapes, never the bytes).
Status CheckTensors(std::span<const HostTensor> tensors, bool check_data) {
  if (tensors.size() > UINT32_MAX) {
    return Status::InvalidArgument("too many tensors: " + std::to_string(tensors.size()));
  }
  std::unordered_set<std::string_view> names;
  names.reserve(tensors.size());
  for (const HostTensor& t : tensors) {
    if (t.name.empty()) return Status::InvalidArgument("a tensor has an empty name");
    const std::string what = "tensor " + Quote(t.name.substr(0, 200));
    if (t.name.size() > kMaxNameBytes) {
      return Status::InvalidArgument(what + ": name is " + std::to_string(t.name.size()) +
                                     " bytes long; at most " + std::to_string(kMaxNameBytes));
    }
    if (!names.insert(t.name).second) return Status::InvalidArgument(what + " appears twice");
    const uint64_t elem = DTypeSize(t.dtype);
    if (elem == 0) return Status::InvalidArgument(what + " has an invalid dtype");
    if (t.shape.size() > kMaxRank) {
      return Status::InvalidArgument(what + " has rank " + std::to_string(t.shape.size()) +
                                     "; at most " + std::to_string(kMaxRank));
    }
    const int64_t elements = NumElements(t.shape);
    if (elements < 0 || static_cast<uint64_t>(elements) > UINT64_MAX / elem) {
      return Status::InvalidArgument(what + " has a negative or overflowing shape");
    }
    if (t.bytes != static_cast<uint64_t>(elements) * elem) {
      return Status::InvalidArgument(what + " holds " + std::to_string(t.bytes) +
                                     " bytes but its shape and dtype need " +
                                     std::to_string(static_cast<uint64_t>(elements) * elem));
    }
    if (check_data && t.bytes > 0 && t.data == nullptr) {
      return Status::InvalidArgument(what + " has no data");
    }
  }
  return Status::OK();
}

}  // namespace

Status ValidateTensors(std::span<const HostTensor> tensors) { return CheckTensors(tensors, true); }

Status ValidateMetadata(const CheckpointMetadata& metadata) {
  if (metadata.user.size() > UINT32_MAX) {
    return Status::InvalidArgument("too many metadata entries");
  }
  for (const auto& [key, value] : metadata.user) {
    if (key.size() > kMaxMetadataKeyBytes) {
      return Status::InvalidArgument("metadata key of " + std::to_string(key.size()) +
                                     " bytes; at most " + std::to_string(kMaxMetadataKeyBytes));
    }
    if (value.size() > kMaxMetadataValueBytes) {
      return Status::InvalidArgument("metadata value of key " + Quote(key.substr(0, 200)) + " is " +
                                     std::to_string(value.size()) + " bytes; at most " +
                                     std::to_string(kMaxMetadataValueBytes));
    }
  }
  return Status::OK();
}

uint64_t ChunkBytesFor(uint64_t chunk_bytes, DType dtype) {
  const uint64_t elem = std::max<uint64_t>(1, DTypeSize(dtype));
  return std::max(elem, chunk_bytes - chunk_bytes % elem);
}

std::vector<ChunkJob> PlanChunks(std::span<const HostTensor> tensors, uint64_t chunk_bytes,
                                 uint32_t num_data_files) {
  std::vector<ChunkJob> jobs;
  std::vector<uint64_t> planned(std::max<uint32_t>(1, num_data_files), 0);
  for (size_t t = 0; t < tensors.size(); ++t) {
    const uint64_t step = ChunkBytesFor(chunk_bytes, tensors[t].dtype);
    uint32_t chunk = 0;
    for (uint64_t offset = 0; offset < tensors[t].bytes; offset += step, ++chunk) {
      const uint64_t length = std::min(step, tensors[t].bytes - offset);
      const auto lightest = std::min_element(planned.begin(), planned.end());
      *lightest += length;
      jobs.push_back(ChunkJob{static_cast<uint32_t>(t), chunk, offset, length,
                              static_cast<uint32_t>(lightest - planned.begin())});
    }
  }
  return jobs;
}

Result<codec::EncodedChunk> EncodeChunk(const HostTensor& tensor, const ChunkJob& job,
                                        const CompressionOptions& options, codec::Scratch& scratch,
                                        std::span<uint8_t> out) {
  const auto* base = static_cast<const uint8_t*>(tensor.data);
  return codec::Encode(std::span<const uint8_t>(base + job.offset, job.length),
                       DTypeSize(tensor.dtype), options, scratch, out);
}

// ---- DataFileAppender --------------------------------------------------------------------------

void DataFileAppender::AlignedFree::operator()(uint8_t* p) const { std::free(p); }

DataFileAppender::DataFileAppender(std::unique_ptr<io::File> file) : file_(std::move(file)) {}
DataFileAppender::~DataFileAppender() = default;

Result<std::unique_ptr<DataFileAppender>> DataFileAppender::Open(io::FileSystem& fs,
                                                                 const std::string& path,
                                                                 bool direct) {
  io::OpenOptions options;
  options.write = true;
  options.create = true;
  options.truncate = true;
  options.direct = direct;
  std::unique_ptr<io::File> file;
  RETURN_IF_ERROR(ToStatus(fs.open(path, options, &file)));
  std::unique_ptr<DataFileAppender> appender(new DataFileAppender(std::move(file)));
  if (appender->is_direct()) {
    void* block = std::aligned_alloc(kDirectAlignment, kDirectBlockBytes);
    if (block == nullptr) {
      return Status::Internal("cannot allocate the O_DIRECT block for " + path);
    }
    appender->block_.reset(static_cast<uint8_t*>(block));
  }
  return appender;
}

bool DataFileAppender::is_direct() const { return file_->is_direct(); }
const std::string& DataFileAppender::path() const { return file_->path(); }

Status DataFileAppender::append(std::span<const uint8_t> bytes, uint64_t* offset) {
  *offset = size_;
  if (!block_) {
    if (!bytes.empty())
      RETURN_IF_ERROR(ToStatus(file_->write_at(size_, bytes.data(), bytes.size())));
    size_ += bytes.size();
    return Status::OK();
  }
  while (!bytes.empty()) {
    const size_t n = std::min(bytes.size(), kDirectBlockBytes - block_used_);
    std::memcpy(block_.get() + block_used_, bytes.data(), n);
    block_used_ += n;
    size_ += n;
    bytes = bytes.subspan(n);
    if (block_used_ == kDirectBlockBytes) RETURN_IF_ERROR(Flush(kDirectBlockBytes));
  }
  return Status::OK();
}

Status DataFileAppender::Flush(size_t bytes) {
  RETURN_IF_ERROR(ToStatus(file_->write_at(flushed_, block_.get(), bytes)));
  flushed_ += bytes;
  block_used_ = 0;
  return Status::OK();
}

Status DataFileAppender::finish() {
  if (block_ && block_used_ > 0) {
    const size_t padded =
        (block_used_ + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
    std::memset(block_.get() + block_used_, 0, padded - block_used_);
    RETURN_IF_ERROR(Flush(padded));
    RETURN_IF_ERROR(ToStatus(file_->truncate(size_)));
  }
  return ToStatus(file_->sync());
}

// ---- index -------------------------------------------------------------------------------------

Result<Index> AssembleIndex(std::span<const HostTensor> tensors, const CheckpointMetadata& metadata,
                            uint32_t num_data_files, std::span<const ChunkJob> jobs,
                            std::span<const ChunkEntry> entries) {
  if (jobs.size() != entries.size()) {
    return Status::Internal("index assembly: " + std::to_string(jobs.size()) + " jobs but " +
                            std::to_string(entries.size()) + " chunk entries");
  }
  // Refuse to write an index that no reader would accept.
  RETURN_IF_ERROR(CheckTensors(tensors, false));
  RETURN_IF_ERROR(ValidateMetadata(metadata));
  if (num_data_files == 0 || num_data_files > kMaxDataFiles) {
    return Status::InvalidArgument("num_data_files must be 1 to " + std::to_string(kMaxDataFiles) +
                                   ", got " + std::to_string(num_data_files));
  }
  Index index;
  index.metadata = metadata;
  index.num_data_files = num_data_files;
  index.tensors.reserve(tensors.size());
  for (const HostTensor& t : tensors) {
    index.tensors.push_back(TensorEntry{t.name, t.dtype, t.shape, t.bytes, {}});
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    const ChunkJob& job = jobs[i];
    const ChunkEntry& entry = entries[i];
    if (job.tensor >= index.tensors.size() || entry.tensor_offset != job.offset ||
        entry.raw_bytes != job.length || entry.file_index != job.file_index ||
        entry.stored_bytes == 0 || entry.stored_bytes > entry.raw_bytes ||
        (entry.codec == codec::Codec::kRaw && entry.stored_bytes != entry.raw_bytes) ||
        index.tensors[job.tensor].chunks.size() != job.chunk) {
      return Status::Internal("index assembly: chunk " + std::to_string(i) +
                              " does not match its job");
    }
    index.tensors[job.tensor].chunks.push_back(entry);
  }
  return index;
}

Status WriteIndexFile(io::FileSystem& fs, const std::string& dir, const Index& index) {
  const std::vector<uint8_t> bytes = EncodeIndex(index);
  io::OpenOptions options;
  options.write = true;
  options.create = true;
  options.truncate = true;
  std::unique_ptr<io::File> file;
  RETURN_IF_ERROR(ToStatus(fs.open(dir + "/" + kIndexFileName, options, &file)));
  RETURN_IF_ERROR(ToStatus(file->write_at(0, bytes.data(), bytes.size())));
  return ToStatus(file->sync());
}

// ---- the synchronous writer --------------------------------------------------------------------

namespace {

// One chunk travelling through the pipeline. The slots are owned by the writer and reused, so
// nothing leaks when the pipeline is cancelled and buffers are allocated once per slot.
struct InFlight {
  size_t job = 0;
  ByteBuffer out;
  codec::EncodedChunk encoded;
  Status status;

  std::span<uint8_t> Reserve(size_t n) { return {out.reserve(n), n}; }
};

class SyncWriter {
 public:
  SyncWriter(std::span<const HostTensor> tensors, const WriterOptions& options,
             std::vector<std::unique_ptr<DataFileAppender>>& files)
      : tensors_(tensors), options_(options), files_(files) {}

  // Encodes (in parallel) and appends (in chunk order) every job; fills entries_.
  Status Run(std::span<const ChunkJob> jobs) {
    jobs_ = jobs;
    entries_.resize(jobs.size());
    const size_t tokens = 2 * static_cast<size_t>(tbb::this_task_arena::max_concurrency());
    slots_.resize(tokens);
    auto next = [this](tbb::flow_control& fc) { return Next(fc); };
    auto encode = [this](InFlight* chunk) {
      Encode(chunk);
      return chunk;
    };
    auto append = [this](InFlight* chunk) { Append(chunk); };
    const auto filters =
        tbb::make_filter<void, InFlight*>(tbb::filter_mode::serial_in_order, next) &
        tbb::make_filter<InFlight*, InFlight*>(tbb::filter_mode::parallel, encode) &
        tbb::make_filter<InFlight*, void>(tbb::filter_mode::serial_in_order, append);
    tbb::parallel_pipeline(tokens, filters);
    return status_;
  }

  std::vector<ChunkEntry>& entries() { return entries_; }

 private:
  InFlight* Next(tbb::flow_control& fc) {
    if (next_ == jobs_.size() || failed_.load(std::memory_order_relaxed)) {
      fc.stop();
      return nullptr;
    }
    // At most `tokens` chunks are alive and they leave in order, so when job j + tokens
    // enters, job j has left its slot.
    InFlight* chunk = &slots_[next_ % slots_.size()];
    chunk->job = next_++;
    chunk->status = Status::OK();
    return chunk;
  }

  void Encode(InFlight* chunk) {
    if (failed_.load(std::memory_order_relaxed)) return;
    const ChunkJob& job = jobs_[chunk->job];
    Result<codec::EncodedChunk> encoded =
        EncodeChunk(tensors_[job.tensor], job, options_.compression, scratch_.local(),
                    chunk->Reserve(job.length));
    if (encoded.ok()) {
      chunk->encoded = *encoded;
    } else {
      chunk->status = encoded.status();
    }
  }

  void Append(InFlight* chunk) {
    if (!status_.ok()) return;
    const ChunkJob& job = jobs_[chunk->job];
    const std::string where =
        "tensor " + Quote(tensors_[job.tensor].name) + " chunk " + std::to_string(job.chunk);
    if (!chunk->status.ok()) {
      Fail(chunk->status.WithContext("encoding " + where));
      return;
    }
    DataFileAppender& file = *files_[job.file_index];
    uint64_t offset = 0;
    Status status = file.append(chunk->encoded.stored, &offset);
    if (!status.ok()) {
      Fail(status.WithContext("writing " + where));
      return;
    }
    entries_[chunk->job] = ChunkEntry{
        job.offset,           job.file_index,     offset, chunk->encoded.stored.size(), job.length,
        chunk->encoded.codec, chunk->encoded.xxh3};
  }

  void Fail(Status status) {
    status_ = std::move(status);
    failed_.store(true, std::memory_order_relaxed);
  }

  std::span<const HostTensor> tensors_;
  const WriterOptions& options_;
  std::vector<std::unique_ptr<DataFileAppender>>& files_;
  std::span<const ChunkJob> jobs_;
  std::vector<ChunkEntry> entries_;
  std::vector<InFlight> slots_;
  tbb::enumerable_thread_specific<codec::Scratch> scratch_;
  size_t next_ = 0;  // touched by the serial input filter only
  Status status_;    // touched by the serial output filter only
  std::atomic<bool> failed_{false};
};

Result<std::vector<std::unique_ptr<DataFileAppender>>> OpenDataFiles(io::FileSystem& fs,
                                                                     const std::string& dir,
                                                                     const WriterOptions& options) {
  std::vector<std::unique_ptr<DataFileAppender>> files;
  files.reserve(options.num_data_files);
  for (uint32_t i = 0; i < options.num_data_files; ++i) {
    ASSIGN_OR_RETURN(std::unique_ptr<DataFileAppender> file,
                     DataFileAppender::Open(fs, dir + "/" + DataFileName(i, options.num_data_files),
                                            options.use_o_direct));
    files.push_back(std::move(file));
  }
  return files;
}

// Syncs the data files in parallel: each fdatasync waits on its own device queue.
Status FinishDataFiles(std::vector<std::unique_ptr<DataFileAppender>>& files) {
  std::vector<Status> results(files.size());
  auto finish = [&](size_t i) { results[i] = files[i]->finish(); };
  tbb::parallel_for(size_t{0}, files.size(), finish);
  for (Status& status : results) RETURN_IF_ERROR(status);
  return Status::OK();
}

WriteStats Summarise(std::span<const HostTensor> tensors, std::span<const ChunkEntry> entries) {
  WriteStats stats;
  for (const HostTensor& t : tensors) stats.bytes_raw += t.bytes;
  stats.chunks = entries.size();
  for (const ChunkEntry& e : entries) {
    stats.bytes_stored += e.stored_bytes;
    ++stats.chunks_by_codec[std::string(codec::CodecName(e.codec))];
  }
  return stats;
}

Result<WriteStats> WriteFiles(io::FileSystem& fs, const std::string& dir,
                              std::span<const HostTensor> tensors,
                              const CheckpointMetadata& metadata, const WriterOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(ValidateWriterOptions(options));
  RETURN_IF_ERROR(ValidateTensors(tensors));
  RETURN_IF_ERROR(ValidateMetadata(metadata));
  const std::vector<ChunkJob> jobs =
      PlanChunks(tensors, options.chunk_bytes, options.num_data_files);
  ASSIGN_OR_RETURN(std::vector<std::unique_ptr<DataFileAppender>> files,
                   OpenDataFiles(fs, dir, options));
  SyncWriter writer(tensors, options, files);
  RETURN_IF_ERROR(writer.Run(jobs));
  RETURN_IF_ERROR(FinishDataFiles(files));
  ASSIGN_OR_RETURN(Index index, AssembleIndex(tensors, metadata, options.num_data_files, jobs,
                                              writer.entries()));
  RETURN_IF_ERROR(WriteIndexFile(fs, dir, index));
  WriteStats stats = Summarise(tensors, writer.entries());
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace

Result<WriteStats> WriteCheckpointFiles(io::FileSystem& fs, const std::string& dir,
                                        std::span<const HostTensor> tensors,
                                        const CheckpointMetadata& metadata,
                                        const WriterOptions& options) {
  // oneTBB and allocation failures throw; no exception crosses this API.
  try {
    return WriteFiles(fs, dir, tensors, metadata, options);
  } catch (const std::exception& e) {
    return Status::Internal("writing checkpoint files in " + dir + ": " + e.what());
  }
}

}  // namespace asyncckpt::format
