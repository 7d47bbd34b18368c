#include "src/format/writer.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "src/util/status_macros.h"

namespace asyncckpt::format {

namespace {

std::string Quote(const std::string& name) { return "'" + name + "'"; }

}  // namespace

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
    index.tensors.push_back(WholeTensorEntry(t.name, t.dtype, t.shape, t.bytes, {}));
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

}  // namespace asyncckpt::format
