#include "src/format/format.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

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

// Quotes a name for a message, cut short so that a hostile 64 KiB name cannot flood a log.
std::string Quote(std::string_view name) {
  constexpr size_t kMax = 80;
  if (name.size() <= kMax) return "'" + std::string(name) + "'";
  return "'" + std::string(name.substr(0, kMax)) + "...' (" + std::to_string(name.size()) +
         " bytes)";
}

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
        return Error(what + "'s key " + Quote(key) + " is a duplicate or out of order");
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
        return Error("tensor " + Quote(name) + " appears twice");
      }
      tensor.name = std::string(name);
      status = ParseTensor(&tensor);
      if (!status.ok()) return status;
      tensors->push_back(std::move(tensor));
    }
    return Status::OK();
  }

  Status ParseTensor(TensorEntry* tensor) {
    const std::string what = "tensor " + Quote(tensor->name);
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
  const uint32_t version = LoadU32(bytes.data() + 8);
  if (version != kFormatVersion) {
    return Status::Corruption(prefix + "unsupported format version " + std::to_string(version) +
                              " (this build reads version " + std::to_string(kFormatVersion) + ")");
  }
  const uint32_t flags = LoadU32(bytes.data() + 12);
  if ((flags & ~kIndexFlagSharded) != 0) {
    return Status::Corruption(prefix + "unknown flags " + std::to_string(flags));
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

// "[4:7, 0:8]": a box as first:end per dimension, for messages.
std::string BoxText(const std::vector<int64_t>& first, const std::vector<int64_t>& extent) {
  std::string text = "[";
  for (size_t d = 0; d < extent.size(); ++d) {
    if (d > 0) text += ", ";
    const int64_t begin = d < first.size() ? first[d] : 0;
    int64_t end = 0;
    // A hostile box may not fit in 64 bits; the message must not overflow to say so.
    const bool fits = !__builtin_add_overflow(begin, extent[d], &end);
    text += std::to_string(begin) + ":" + (fits ? std::to_string(end) : std::string("overflow"));
  }
  return text + "]";
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    text += (d > 0 ? ", " : "") + std::to_string(shape[d]);
  }
  return text + "]";
}

// "tensor 'w' slice 2 (box [4:7, 0:8] by rank 1)": slice k is the name's k-th entry.
std::string SliceName(const TensorEntry& tensor, size_t k) {
  return "tensor " + Quote(tensor.name) + " slice " + std::to_string(k) + " (box " +
         BoxText(tensor.box_offset, tensor.shape) + " by rank " +
         std::to_string(tensor.writer_rank) + ")";
}

// One slice on its own: a box of the right rank inside a global shape whose byte size fits,
// written by a rank of the job into that rank's data files.
Status CheckSlice(const Index& index, const TensorEntry& tensor, size_t k,
                  const std::string& prefix) {
  const std::string what = SliceName(tensor, k);
  const size_t rank = tensor.shape.size();
  if (tensor.global_shape.size() != rank || tensor.box_offset.size() != rank) {
    return Status::Corruption(prefix + what + " has shape rank " + std::to_string(rank) +
                              " but global shape rank " +
                              std::to_string(tensor.global_shape.size()) + " and box offset rank " +
                              std::to_string(tensor.box_offset.size()));
  }
  const int64_t global = NumElements(tensor.global_shape);
  if (global < 0 || static_cast<uint64_t>(global) > UINT64_MAX / DTypeSize(tensor.dtype)) {
    return Status::Corruption(prefix + what + " has a negative or overflowing global shape " +
                              ShapeText(tensor.global_shape));
  }
  for (size_t d = 0; d < rank; ++d) {
    const int64_t first = tensor.box_offset[d];
    if (first < 0 || first > tensor.global_shape[d] ||
        tensor.shape[d] > tensor.global_shape[d] - first) {
      return Status::Corruption(prefix + what + " leaves the global shape " +
                                ShapeText(tensor.global_shape) + " in dimension " +
                                std::to_string(d));
    }
  }
  if (tensor.writer_rank >= index.world_size) {
    return Status::Corruption(prefix + what + " names writer rank " +
                              std::to_string(tensor.writer_rank) + " but the world size is " +
                              std::to_string(index.world_size));
  }
  const uint32_t files_per_rank = index.num_data_files / index.world_size;
  for (size_t i = 0; i < tensor.chunks.size(); ++i) {
    const uint32_t file = tensor.chunks[i].file_index;
    if (file / files_per_rank != tensor.writer_rank) {
      return Status::Corruption(prefix + what + " chunk " + std::to_string(i) +
                                " is in data file " + std::to_string(file) + ", written by rank " +
                                std::to_string(file / files_per_rank) + ", not by its writer");
    }
  }
  return Status::OK();
}

int64_t End(const TensorEntry& t, size_t d) { return t.box_offset[d] + t.shape[d]; }

bool Overlap(const TensorEntry& a, const TensorEntry& b) {
  for (size_t d = 0; d < a.shape.size(); ++d) {
    if (std::max(a.box_offset[d], b.box_offset[d]) >= std::min(End(a, d), End(b, d))) return false;
  }
  return true;
}

// The slices of one name (indices into index.tensors, in index order, each already through
// CheckSlice): one dtype and global shape, one slice per writer rank, no two sharing an element,
// and with `tiling`, every element of the global shape in a slice.
Status CheckSlicesOfOneName(const Index& index, const std::vector<size_t>& slices, bool tiling,
                            const std::string& prefix) {
  const TensorEntry& first = index.tensors[slices[0]];
  std::vector<uint32_t> ranks;
  ranks.reserve(slices.size());
  for (size_t k = 1; k < slices.size(); ++k) {
    const TensorEntry& t = index.tensors[slices[k]];
    if (t.dtype != first.dtype || t.global_shape != first.global_shape) {
      return Status::Corruption(prefix + SliceName(t, k) + " is " +
                                std::string(DTypeName(t.dtype)) + " of global shape " +
                                ShapeText(t.global_shape) + " but slice 0 is " +
                                std::string(DTypeName(first.dtype)) + " of global shape " +
                                ShapeText(first.global_shape));
    }
  }
  // Several entries per rank would make the overlap search quadratic in a hostile index.
  std::vector<std::pair<uint32_t, size_t>> by_rank;
  by_rank.reserve(slices.size());
  for (size_t k = 0; k < slices.size(); ++k) {
    by_rank.emplace_back(index.tensors[slices[k]].writer_rank, k);
  }
  std::sort(by_rank.begin(), by_rank.end());
  for (size_t i = 1; i < by_rank.size(); ++i) {
    if (by_rank[i].first == by_rank[i - 1].first) {
      return Status::Corruption(
          prefix + SliceName(index.tensors[slices[by_rank[i - 1].second]], by_rank[i - 1].second) +
          " and slice " + std::to_string(by_rank[i].second) + " have the same writer rank");
    }
  }
  // Sweep along the dimension with the most distinct offsets: slices leave the active set once
  // the sweep passes their end, so a slice is compared only with those it could touch there.
  const size_t rank = first.shape.size();
  std::vector<size_t> live;  // positions k of slices with at least one element
  for (size_t k = 0; k < slices.size(); ++k) {
    if (NumElements(index.tensors[slices[k]].shape) > 0) live.push_back(k);
  }
  size_t sweep = 0;
  size_t most = 0;
  for (size_t d = 0; d < rank; ++d) {
    std::vector<int64_t> offsets;
    offsets.reserve(live.size());
    for (size_t k : live) offsets.push_back(index.tensors[slices[k]].box_offset[d]);
    std::sort(offsets.begin(), offsets.end());
    const size_t distinct =
        static_cast<size_t>(std::unique(offsets.begin(), offsets.end()) - offsets.begin());
    if (distinct > most) {
      most = distinct;
      sweep = d;
    }
  }
  auto at = [&](size_t k) -> const TensorEntry& { return index.tensors[slices[k]]; };
  auto start = [&](size_t k) { return rank == 0 ? 0 : at(k).box_offset[sweep]; };
  std::stable_sort(live.begin(), live.end(),
                   [&](size_t a, size_t b) { return start(a) < start(b); });
  std::vector<size_t> active;
  uint64_t covered = 0;
  for (size_t k : live) {
    if (rank > 0) {
      std::erase_if(active, [&](size_t a) { return End(at(a), sweep) <= start(k); });
    }
    for (size_t a : active) {
      if (Overlap(at(a), at(k))) {
        const size_t lo = std::min(a, k);
        const size_t hi = std::max(a, k);
        return Status::Corruption(prefix + SliceName(at(lo), lo) + " and slice " +
                                  std::to_string(hi) + " (box " +
                                  BoxText(at(hi).box_offset, at(hi).shape) +
                                  ") overlap; every element must be written once");
      }
    }
    active.push_back(k);
    covered += static_cast<uint64_t>(NumElements(at(k).shape));
  }
  const uint64_t global = static_cast<uint64_t>(NumElements(first.global_shape));
  // Inside the global shape and without overlap, the slices tile it exactly when their
  // elements add up to its own.
  if (tiling && covered != global) {
    return Status::Corruption(
        prefix + "tensor " + Quote(first.name) + ": its " + std::to_string(slices.size()) +
        " slices cover " + std::to_string(covered) + " of the " + std::to_string(global) +
        " elements of its global shape " + ShapeText(first.global_shape) + " (a gap)");
  }
  return Status::OK();
}

Status CheckSlices(const Index& index, bool tiling, const std::string& prefix) {
  std::unordered_map<std::string_view, std::vector<size_t>> by_name;
  std::vector<std::string_view> order;
  for (size_t i = 0; i < index.tensors.size(); ++i) {
    const TensorEntry& tensor = index.tensors[i];
    std::vector<size_t>& slices = by_name[tensor.name];
    if (slices.empty()) order.push_back(tensor.name);
    Status status = CheckSlice(index, tensor, slices.size(), prefix);
    if (!status.ok()) return status;
    slices.push_back(i);
  }
  for (std::string_view name : order) {
    Status status = CheckSlicesOfOneName(index, by_name[name], tiling, prefix);
    if (!status.ok()) return status;
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
        return Status::Corruption(prefix + "the " + what + " holds tensor " + Quote(tensor.name) +
                                  " written by rank " + std::to_string(tensor.writer_rank));
      }
      if (tensor.global_shape.empty() && tensor.box_offset.empty()) {
        tensor.global_shape = tensor.shape;
        tensor.box_offset.assign(tensor.shape.size(), 0);
      }
      // The encoding has one rank per entry, so a mismatch must be caught before encoding.
      if (tensor.global_shape.size() != tensor.shape.size() ||
          tensor.box_offset.size() != tensor.shape.size()) {
        return Status::Corruption(
            prefix + "the " + what + " holds tensor " + Quote(tensor.name) + " of shape rank " +
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
  return "tensor " + Quote(index.tensors[range.tensor].name) + " chunk " +
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
        return Status::Corruption(prefix + "tensor " + Quote(tensor.name) + " chunk " +
                                  std::to_string(i) + " is in data file " +
                                  std::to_string(chunk.file_index) + ", which does not exist");
      }
      const uint64_t size = data_file_sizes[chunk.file_index];
      if (chunk.file_offset > size || chunk.stored_bytes > size - chunk.file_offset) {
        return Status::Corruption(
            prefix + "tensor " + Quote(tensor.name) + " chunk " + std::to_string(i) +
            " lies at bytes [" + std::to_string(chunk.file_offset) + ", +" +
            std::to_string(chunk.stored_bytes) + ") of " +
            DataFileName(chunk.file_index, index.num_data_files) + ", which holds only " +
            std::to_string(size) + " bytes (truncated data file?)");
      }
    }
  }
  return CheckNoSharedBytes(index, prefix);
}

Result<Index> DecodeIndex(std::span<const uint8_t> bytes, std::string_view path,
                          std::span<const uint64_t> data_file_sizes) {
  Result<Index> index = ParseIndex(bytes, path);
  if (!index.ok()) return index;
  Status status = CheckChunkLocations(*index, path, data_file_sizes);
  if (!status.ok()) return status;
  return index;
}

}  // namespace asyncckpt::format
