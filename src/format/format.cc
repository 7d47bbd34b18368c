// The index of one checkpoint: names, encoding and decoding (the parser with its bounds), and the
// merge of a sharded index's parts. The parser runs the checks of a sharded index's slices
// (sharded_index.h); the check of chunks against their data files is index_file.cc's.

#include "src/format/format.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "src/format/sharded_index.h"

namespace asyncckpt::format {

std::string CheckpointDirName(std::string_view basename, int64_t step) {
  return std::string(basename) + "-" + std::to_string(step);
}

uint64_t MaxRawBytes(codec::Codec codec, uint64_t stored_bytes) {
  if (codec == codec::Codec::kRaw) return stored_bytes;
  if (stored_bytes > UINT64_MAX / kMaxZstdRatio) return UINT64_MAX;
  return stored_bytes * kMaxZstdRatio;
}

std::string DataFileName(uint32_t index, uint32_t count) {
  char name[48];
  std::snprintf(name, sizeof(name), "data-%05u-of-%05u", index, count);
  return name;
}

namespace {

// ---- encoding ----------------------------------------------------------------------------------

class Encoder {
 public:
  void u8(uint8_t v) { out_.push_back(v); }
  void u32(uint32_t v) { fixed(v, 4); }
  void u64(uint64_t v) { fixed(v, 8); }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void f64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    u64(bits);
  }
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }
  std::vector<uint8_t>& bytes() { return out_; }

 private:
  void fixed(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t> out_;
};

void EncodeChunk(const ChunkEntry& chunk, Encoder& e) {
  e.u64(chunk.tensor_offset);
  e.u32(chunk.file_index);
  e.u64(chunk.file_offset);
  e.u64(chunk.stored_bytes);
  e.u64(chunk.raw_bytes);
  e.u8(static_cast<uint8_t>(chunk.codec));
  e.u64(chunk.xxh3);
}

void EncodeTensor(const TensorEntry& tensor, bool sharded, Encoder& e) {
  e.str(tensor.name);
  e.u8(static_cast<uint8_t>(tensor.dtype));
  e.u8(static_cast<uint8_t>(tensor.shape.size()));
  for (int64_t dim : tensor.shape) e.i64(dim);
  e.u64(tensor.bytes);
  if (sharded) {
    // An entry without a box is a whole tensor (see TensorEntry::global_shape).
    const bool whole = tensor.global_shape.empty() && tensor.box_offset.empty();
    // A box of another rank than the shape is written as a negative one, which no reader
    // accepts (MergeShardedParts reports it by name before encoding).
    const bool ranks_agree = tensor.global_shape.size() == tensor.shape.size() &&
                             tensor.box_offset.size() == tensor.shape.size();
    for (size_t d = 0; d < tensor.shape.size(); ++d) {
      e.i64(whole ? tensor.shape[d] : ranks_agree ? tensor.global_shape[d] : -1);
    }
    for (size_t d = 0; d < tensor.shape.size(); ++d) {
      e.i64(whole ? 0 : ranks_agree ? tensor.box_offset[d] : -1);
    }
    e.u32(tensor.writer_rank);
  }
  e.u64(tensor.chunks.size());
  for (const ChunkEntry& chunk : tensor.chunks) EncodeChunk(chunk, e);
}

uint64_t LoadU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint32_t LoadU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

}  // namespace

std::vector<uint8_t> EncodeIndex(const Index& index) {
  Encoder e;
  e.u64(kIndexMagic);
  e.u32(kFormatVersion);
  e.u32(index.sharded ? kIndexFlagSharded : 0);
  e.i64(index.metadata.step);
  e.f64(index.metadata.wall_time);
  e.u32(static_cast<uint32_t>(index.metadata.user.size()));
  for (const auto& [key, value] : index.metadata.user) {
    e.str(key);
    e.str(value);
  }
  e.u32(index.num_data_files);
  if (index.sharded) e.u32(index.world_size);
  e.u32(static_cast<uint32_t>(index.tensors.size()));
  for (const TensorEntry& tensor : index.tensors) EncodeTensor(tensor, index.sharded, e);
  const uint64_t body_length = e.bytes().size() - kIndexHeaderBytes;
  e.u64(body_length);
  e.u64(codec::Checksum(e.bytes()));
  e.u64(kIndexEndMagic);
  return std::move(e.bytes());
}

namespace {

// ---- decoding ----------------------------------------------------------------------------------

// A read-only cursor that never steps past its end; every read says whether it fit.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  size_t remaining() const { return bytes_.size() - pos_; }
  size_t position() const { return pos_; }
  bool u8(uint8_t* v) {
    if (remaining() < 1) return false;
    *v = bytes_[pos_++];
    return true;
  }
  bool u32(uint32_t* v) {
    if (remaining() < 4) return false;
    *v = LoadU32(bytes_.data() + pos_);
    pos_ += 4;
    return true;
  }
  bool u64(uint64_t* v) {
    if (remaining() < 8) return false;
    *v = LoadU64(bytes_.data() + pos_);
    pos_ += 8;
    return true;
  }
  bool i64(int64_t* v) {
    uint64_t u;
    if (!u64(&u)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool f64(double* v) {
    uint64_t bits;
    if (!u64(&bits)) return false;
    std::memcpy(v, &bits, sizeof(bits));
    return true;
  }
  // A view of the next n bytes; the caller checked n against its own bound first.
  bool bytes(size_t n, std::string_view* v) {
    if (remaining() < n) return false;
    *v = std::string_view(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return true;
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

// Parses the body, producing Corruption messages prefixed with the index path.
class BodyParser {
 public:
  BodyParser(std::span<const uint8_t> body, std::string_view path, bool sharded)
      : in_(body), path_(path), sharded_(sharded) {}

  Result<Index> Parse() {
    Index index;
    index.sharded = sharded_;
    Status status = ParseMetadata(&index.metadata);
    if (!status.ok()) return status;
    if (!in_.u32(&index.num_data_files)) return Truncated("the number of data files");
    if (index.num_data_files == 0 || index.num_data_files > kMaxDataFiles) {
      return Error("names " + std::to_string(index.num_data_files) + " data files; must be 1 to " +
                   std::to_string(kMaxDataFiles));
    }
    num_data_files_ = index.num_data_files;
    if (sharded_) {
      if (!in_.u32(&index.world_size)) return Truncated("the world size");
      if (index.world_size == 0 || index.num_data_files % index.world_size != 0) {
        return Error("world size " + std::to_string(index.world_size) + " must be at least 1 " +
                     "and divide the " + std::to_string(index.num_data_files) + " data files");
      }
    }
    status = ParseTensors(&index.tensors);
    if (!status.ok()) return status;
    if (in_.remaining() != 0) {
      return Error(std::to_string(in_.remaining()) + " unexpected bytes after the last tensor");
    }
    return index;
  }

 private:
  // Smallest encodings, used to bound counts by the bytes left before anything is allocated.
  static constexpr size_t kMinUserEntryBytes = 8;
  static constexpr size_t kMinTensorBytes = 4 + 1 + 1 + 1 + 8 + 8;
  // A sharded entry adds at least its writer rank.
  static constexpr size_t kMinSliceBytes = kMinTensorBytes + 4;

  Status Error(const std::string& what) const {
    return Status::Corruption("index " + std::string(path_) + ": " + what);
  }
  Status Truncated(const std::string& what) const {
    return Error("truncated body: it ends before " + what + " (at body byte " +
                 std::to_string(in_.position()) + ")");
  }

  Status String(size_t max, const std::string& what, std::string_view* out) {
    uint32_t length;
    if (!in_.u32(&length)) return Truncated("the length of " + what);
    if (length > max) {
      return Error(what + " is " + std::to_string(length) + " bytes long; at most " +
                   std::to_string(max) + " allowed");
    }
    if (!in_.bytes(length, out)) {
      return Error(what + " claims " + std::to_string(length) + " bytes but only " +
                   std::to_string(in_.remaining()) + " remain");
    }
    return Status::OK();
  }

  Status ParseMetadata(CheckpointMetadata* metadata) {
    if (!in_.i64(&metadata->step)) return Truncated("the step");
    if (!in_.f64(&metadata->wall_time)) return Truncated("the wall time");
    uint32_t count;
    if (!in_.u32(&count)) return Truncated("the number of metadata entries");
    if (count > in_.remaining() / kMinUserEntryBytes) {
      return Error("claims " + std::to_string(count) + " metadata entries but only " +
                   std::to_string(in_.remaining()) + " bytes remain");
    }
    std::string_view previous;
    for (uint32_t i = 0; i < count; ++i) {
      const std::string what = "metadata entry " + std::to_string(i);
      std::string_view key, value;
      Status status = String(kMaxMetadataKeyBytes, what + "'s key", &key);
      if (!status.ok()) return status;
      status = String(kMaxMetadataValueBytes, what + "'s value", &value);
      if (!status.ok()) return status;
      // The writer emits keys in map order; anything else is damage (and catches duplicates).
      if (i > 0 && !(previous < key)) {
        return Error(what + "'s key " + QuoteName(key) + " is a duplicate or out of order");
      }
      previous = key;
      metadata->user.emplace_hint(metadata->user.end(), std::string(key), std::string(value));
    }
    return Status::OK();
  }

  Status ParseTensors(std::vector<TensorEntry>* tensors) {
    uint32_t count;
    if (!in_.u32(&count)) return Truncated("the number of tensors");
    if (count > in_.remaining() / (sharded_ ? kMinSliceBytes : kMinTensorBytes)) {
      return Error("claims " + std::to_string(count) + " tensors but only " +
                   std::to_string(in_.remaining()) + " bytes remain");
    }
    tensors->reserve(count);
    std::unordered_set<std::string_view> names;
    names.reserve(count);
    for (uint32_t i = 0; i < count; ++i) {
      TensorEntry tensor;
      std::string_view name;
      Status status = String(kMaxNameBytes, "the name of tensor " + std::to_string(i), &name);
      if (!status.ok()) return status;
      if (name.empty()) return Error("tensor " + std::to_string(i) + " has an empty name");
      // A sharded index lists one entry per slice; its names are checked with the slices.
      if (!sharded_ && !names.insert(name).second) {
        return Error("tensor " + QuoteName(name) + " appears twice");
      }
      tensor.name = std::string(name);
      status = ParseTensor(&tensor);
      if (!status.ok()) return status;
      tensors->push_back(std::move(tensor));
    }
    return Status::OK();
  }

  Status ParseTensor(TensorEntry* tensor) {
    const std::string what = "tensor " + QuoteName(tensor->name);
    uint8_t dtype_byte, rank;
    if (!in_.u8(&dtype_byte)) return Truncated(what + "'s dtype");
    const std::optional<DType> dtype = DTypeFromByte(dtype_byte);
    if (!dtype) return Error(what + " has unknown dtype " + std::to_string(dtype_byte));
    tensor->dtype = *dtype;
    if (!in_.u8(&rank)) return Truncated(what + "'s rank");
    if (rank > kMaxRank) {
      return Error(what + " has rank " + std::to_string(rank) + "; at most " +
                   std::to_string(kMaxRank) + " allowed");
    }
    tensor->shape.resize(rank);
    for (int64_t& dim : tensor->shape) {
      if (!in_.i64(&dim)) return Truncated(what + "'s shape");
    }
    const int64_t elements = NumElements(tensor->shape);
    const uint64_t elem_size = DTypeSize(tensor->dtype);
    if (elements < 0 || static_cast<uint64_t>(elements) > UINT64_MAX / elem_size) {
      return Error(what + " has a negative or overflowing shape");
    }
    if (!in_.u64(&tensor->bytes)) return Truncated(what + "'s byte size");
    if (tensor->bytes != static_cast<uint64_t>(elements) * elem_size) {
      return Error(what + " claims " + std::to_string(tensor->bytes) + " bytes but its shape and " +
                   std::string(DTypeName(tensor->dtype)) + " dtype make " +
                   std::to_string(static_cast<uint64_t>(elements) * elem_size));
    }
    if (sharded_) {
      tensor->global_shape.resize(rank);
      tensor->box_offset.resize(rank);
      for (int64_t& dim : tensor->global_shape) {
        if (!in_.i64(&dim)) return Truncated(what + "'s global shape");
      }
      for (int64_t& first : tensor->box_offset) {
        if (!in_.i64(&first)) return Truncated(what + "'s box offset");
      }
      if (!in_.u32(&tensor->writer_rank)) return Truncated(what + "'s writer rank");
    }
    return ParseChunks(what, tensor);
  }

  Status ParseChunks(const std::string& what, TensorEntry* tensor) {
    uint64_t count;
    if (!in_.u64(&count)) return Truncated(what + "'s number of chunks");
    if (count > in_.remaining() / kChunkRecordBytes) {
      return Error(what + " claims " + std::to_string(count) + " chunks but only " +
                   std::to_string(in_.remaining()) + " bytes remain");
    }
    tensor->chunks.resize(count);
    uint64_t covered = 0;
    for (uint64_t i = 0; i < count; ++i) {
      const std::string where = what + " chunk " + std::to_string(i);
      Status status = ParseChunk(where, &tensor->chunks[i]);
      if (!status.ok()) return status;
      status = CheckChunk(where, *tensor, tensor->chunks[i], &covered);
      if (!status.ok()) return status;
    }
    if (covered != tensor->bytes) {
      return Error(what + "'s chunks cover " + std::to_string(covered) + " of its " +
                   std::to_string(tensor->bytes) + " bytes");
    }
    return Status::OK();
  }

  Status ParseChunk(const std::string& where, ChunkEntry* chunk) {
    uint8_t codec_byte = 0;
    // Every field is fixed-size and the count was bounded by the bytes left, so these reads
    // cannot fall short; checked anyway so that a bug cannot read past the end.
    if (!in_.u64(&chunk->tensor_offset) || !in_.u32(&chunk->file_index) ||
        !in_.u64(&chunk->file_offset) || !in_.u64(&chunk->stored_bytes) ||
        !in_.u64(&chunk->raw_bytes) || !in_.u8(&codec_byte) || !in_.u64(&chunk->xxh3)) {
      return Truncated(where);
    }
    const std::optional<codec::Codec> codec = codec::CodecFromByte(codec_byte);
    if (!codec) return Error(where + " has unknown codec " + std::to_string(codec_byte));
    chunk->codec = *codec;
    return Status::OK();
  }

  Status CheckChunk(const std::string& where, const TensorEntry& tensor, const ChunkEntry& chunk,
                    uint64_t* covered) const {
    if (chunk.tensor_offset != *covered) {
      return Error(where + " starts at tensor byte " + std::to_string(chunk.tensor_offset) +
                   " but the chunks before it end at " + std::to_string(*covered) +
                   (chunk.tensor_offset < *covered ? " (overlap)" : " (gap)"));
    }
    if (chunk.raw_bytes == 0 || chunk.raw_bytes > kMaxChunkBytes) {
      return Error(where + " has " + std::to_string(chunk.raw_bytes) + " raw bytes; must be 1 to " +
                   std::to_string(kMaxChunkBytes));
    }
    if (chunk.raw_bytes > tensor.bytes - *covered) {
      return Error(where + " ends at tensor byte " + std::to_string(*covered + chunk.raw_bytes) +
                   ", past the tensor's " + std::to_string(tensor.bytes) + " bytes");
    }
    if (chunk.codec == codec::Codec::kRaw && chunk.stored_bytes != chunk.raw_bytes) {
      return Error(where + " is stored raw but its stored size " +
                   std::to_string(chunk.stored_bytes) + " differs from its raw size " +
                   std::to_string(chunk.raw_bytes));
    }
    // A compressed chunk that does not shrink is stored raw, so stored > raw is damage.
    if (chunk.stored_bytes == 0 || chunk.stored_bytes > chunk.raw_bytes) {
      return Error(where + " has " + std::to_string(chunk.stored_bytes) + " stored bytes for " +
                   std::to_string(chunk.raw_bytes) + " raw bytes");
    }
    if (chunk.raw_bytes > MaxRawBytes(chunk.codec, chunk.stored_bytes)) {
      return Error(where + " claims " + std::to_string(chunk.raw_bytes) + " raw bytes from " +
                   std::to_string(chunk.stored_bytes) + " stored bytes of " +
                   std::string(codec::CodecName(chunk.codec)) + "; at most " +
                   std::to_string(kMaxZstdRatio) + " raw bytes per stored byte are possible");
    }
    if (chunk.file_index >= num_data_files_) {
      return Error(where + " is in data file " + std::to_string(chunk.file_index) +
                   " but the checkpoint has " + std::to_string(num_data_files_));
    }
    *covered += chunk.raw_bytes;
    return Status::OK();
  }

  Cursor in_;
  std::string_view path_;
  bool sharded_ = false;
  uint32_t num_data_files_ = 0;
};

// "0x5": header flags for a message.
std::string HexFlags(uint32_t flags) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string digits;
  do {
    digits.insert(digits.begin(), kDigits[flags & 0xF]);
    flags >>= 4;
  } while (flags != 0);
  return "0x" + digits;
}

Status CheckEnvelope(std::span<const uint8_t> bytes, std::string_view path, bool* sharded) {
  const std::string prefix = "index " + std::string(path) + ": ";
  if (bytes.size() < kIndexHeaderBytes + kIndexFooterBytes) {
    return Status::Corruption(prefix + "truncated: " + std::to_string(bytes.size()) +
                              " bytes, shorter than its header and footer");
  }
  if (LoadU64(bytes.data()) != kIndexMagic) {
    return Status::Corruption(prefix + "bad magic number: not an asyncckpt index");
  }
  if (LoadU64(bytes.data() + bytes.size() - 8) != kIndexEndMagic) {
    return Status::Corruption(prefix + "bad end magic number: truncated or damaged");
  }
  const size_t checksum_at = bytes.size() - 16;
  const uint64_t stored = LoadU64(bytes.data() + checksum_at);
  if (codec::Checksum(bytes.first(checksum_at)) != stored) {
    return Status::Corruption(prefix + "checksum mismatch: the index is damaged");
  }
  // Past the checksum the bytes are as written: a version or a flag this build does not know is
  // a newer release's checkpoint (FailedPrecondition), never damage to quarantine.
  const uint32_t version = LoadU32(bytes.data() + 8);
  if (version != kFormatVersion) {
    return Status::FailedPrecondition(
        prefix + "written in format version " + std::to_string(version) +
        (version > kFormatVersion ? " by a newer release of asyncckpt" : "") +
        "; this build reads version " + std::to_string(kFormatVersion));
  }
  const uint32_t flags = LoadU32(bytes.data() + 12);
  if ((flags & ~kIndexFlagSharded) != 0) {
    return Status::FailedPrecondition(prefix + "written in format version 1 with flags " +
                                      HexFlags(flags) +
                                      " by a newer release of asyncckpt; this build knows flags " +
                                      HexFlags(kIndexFlagSharded) + " (sharded) only");
  }
  *sharded = (flags & kIndexFlagSharded) != 0;
  const uint64_t body_length = LoadU64(bytes.data() + bytes.size() - kIndexFooterBytes);
  if (body_length != bytes.size() - kIndexHeaderBytes - kIndexFooterBytes) {
    return Status::Corruption(prefix + "footer says the body is " + std::to_string(body_length) +
                              " bytes, but it is " +
                              std::to_string(bytes.size() - kIndexHeaderBytes - kIndexFooterBytes));
  }
  return Status::OK();
}

enum class Want { kIndex, kPart };

Result<Index> Parse(std::span<const uint8_t> bytes, std::string_view path, Want want) {
  bool sharded = false;
  Status status = CheckEnvelope(bytes, path, &sharded);
  if (!status.ok()) return status;
  const std::string prefix = "index " + std::string(path) + ": ";
  if (want == Want::kPart && !sharded) {
    return Status::Corruption(prefix + "a rank's part of a sharded index must be sharded");
  }
  const auto body =
      bytes.subspan(kIndexHeaderBytes, bytes.size() - kIndexHeaderBytes - kIndexFooterBytes);
  Result<Index> index = BodyParser(body, path, sharded).Parse();
  if (!index.ok() || !sharded) return index;
  status = CheckSlices(*index, want == Want::kIndex, prefix);
  if (!status.ok()) return status;
  return index;
}

}  // namespace

Result<Index> ParseIndex(std::span<const uint8_t> bytes, std::string_view path) {
  return Parse(bytes, path, Want::kIndex);
}

Result<Index> ParseIndexPart(std::span<const uint8_t> bytes, std::string_view path) {
  return Parse(bytes, path, Want::kPart);
}

Result<Index> MergeShardedParts(std::vector<Index> parts, uint32_t world_size) {
  const std::string prefix =
      "index merged from the parts of " + std::to_string(world_size) + " ranks: ";
  if (world_size == 0 || parts.size() != world_size) {
    return Status::InvalidArgument(prefix + "got " + std::to_string(parts.size()) +
                                   " parts; need one per rank");
  }
  Index merged;
  merged.sharded = true;
  merged.world_size = world_size;
  merged.metadata = parts[0].metadata;
  merged.num_data_files = parts[0].num_data_files;
  size_t count = 0;
  for (const Index& part : parts) count += part.tensors.size();
  merged.tensors.reserve(count);
  for (uint32_t r = 0; r < world_size; ++r) {
    Index& part = parts[r];
    const std::string what = "part of rank " + std::to_string(r);
    if (!part.sharded || part.world_size != world_size) {
      return Status::Corruption(prefix + "the " + what + " is " +
                                (part.sharded ? "of world size " + std::to_string(part.world_size)
                                              : std::string("not sharded")));
    }
    if (part.metadata.step != merged.metadata.step) {
      return Status::Corruption(prefix + "the " + what + " holds step " +
                                std::to_string(part.metadata.step) + " but rank 0's holds step " +
                                std::to_string(merged.metadata.step));
    }
    if (part.metadata.user != merged.metadata.user) {
      return Status::Corruption(prefix + "the " + what + " has other user metadata than rank 0's");
    }
    if (part.num_data_files != merged.num_data_files) {
      return Status::Corruption(prefix + "the " + what + " names " +
                                std::to_string(part.num_data_files) + " data files but rank 0's " +
                                std::to_string(merged.num_data_files));
    }
    for (TensorEntry& tensor : part.tensors) {
      if (tensor.writer_rank != r) {
        return Status::Corruption(prefix + "the " + what + " holds tensor " +
                                  QuoteName(tensor.name) + " written by rank " +
                                  std::to_string(tensor.writer_rank));
      }
      if (tensor.global_shape.empty() && tensor.box_offset.empty()) {
        tensor.global_shape = tensor.shape;
        tensor.box_offset.assign(tensor.shape.size(), 0);
      }
      // The encoding has one rank per entry, so a mismatch must be caught before encoding.
      if (tensor.global_shape.size() != tensor.shape.size() ||
          tensor.box_offset.size() != tensor.shape.size()) {
        return Status::Corruption(
            prefix + "the " + what + " holds tensor " + QuoteName(tensor.name) + " of shape rank " +
            std::to_string(tensor.shape.size()) + " but global shape rank " +
            std::to_string(tensor.global_shape.size()) + " and box offset rank " +
            std::to_string(tensor.box_offset.size()));
      }
      merged.tensors.push_back(std::move(tensor));
    }
  }
  // Encoding and parsing again runs every check a reader will run on the written index.
  const std::vector<uint8_t> bytes = EncodeIndex(merged);
  return ParseIndex(bytes, "merged from the parts of " + std::to_string(world_size) + " ranks");
}

}  // namespace asyncckpt::format
