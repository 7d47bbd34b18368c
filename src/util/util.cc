#include <cerrno>
#include <iostream>
#include <mutex>

#include "asyncckpt/compression.h"
#include "asyncckpt/dtype.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"
#include "src/util/io_status.h"
#include "src/util/log.h"

namespace asyncckpt {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kAlreadyExists:
      return "AlreadyExists";
    case StatusCode::kIOError:
      return "IOError";
    case StatusCode::kCorruption:
      return "Corruption";
    case StatusCode::kCancelled:
      return "Cancelled";
    case StatusCode::kOutOfRange:
      return "OutOfRange";
    case StatusCode::kFailedPrecondition:
      return "FailedPrecondition";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kInternal:
      return "Internal";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

Status ToStatus(const io::IoStatus& status) {
  if (status.ok()) return Status::OK();
  switch (status.error_number()) {
    case ENOENT:
      return Status::NotFound(status.message());
    case EEXIST:
      return Status::AlreadyExists(status.message());
    default:
      return Status::IOError(status.message());
  }
}

namespace {
struct DTypeInfo {
  DType dtype;
  size_t size;
  std::string_view name;
};
constexpr DTypeInfo kDTypeInfos[] = {
    {DType::kF64, 8, "f64"},   {DType::kF32, 4, "f32"},       {DType::kF16, 2, "f16"},
    {DType::kBF16, 2, "bf16"}, {DType::kF8E4M3, 1, "f8e4m3"}, {DType::kF8E5M2, 1, "f8e5m2"},
    {DType::kI8, 1, "i8"},     {DType::kI16, 2, "i16"},       {DType::kI32, 4, "i32"},
    {DType::kI64, 8, "i64"},   {DType::kU8, 1, "u8"},         {DType::kU16, 2, "u16"},
    {DType::kU32, 4, "u32"},   {DType::kU64, 8, "u64"},       {DType::kBool, 1, "bool"},
};
const DTypeInfo* FindDType(DType dtype) {
  for (const auto& info : kDTypeInfos) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}
}  // namespace

size_t DTypeSize(DType dtype) {
  const DTypeInfo* info = FindDType(dtype);
  return info ? info->size : 0;
}

std::string_view DTypeName(DType dtype) {
  const DTypeInfo* info = FindDType(dtype);
  return info ? info->name : "invalid";
}

std::optional<DType> ParseDType(std::string_view name) {
  for (const auto& info : kDTypeInfos) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

std::optional<DType> DTypeFromByte(uint8_t byte) {
  for (const auto& info : kDTypeInfos) {
    if (static_cast<uint8_t>(info.dtype) == byte) return info.dtype;
  }
  return std::nullopt;
}

std::string_view CompressionKindName(CompressionKind kind) {
  switch (kind) {
    case CompressionKind::kNone:
      return "none";
    case CompressionKind::kZstd:
      return "zstd";
    case CompressionKind::kShuffleZstd:
      return "shuffle+zstd";
  }
  return "invalid";
}

std::optional<CompressionKind> ParseCompressionKind(std::string_view name) {
  if (name == "none") return CompressionKind::kNone;
  if (name == "zstd") return CompressionKind::kZstd;
  if (name == "shuffle+zstd" || name == "shuffle_zstd") return CompressionKind::kShuffleZstd;
  return std::nullopt;
}

Status ValidateCompressionOptions(const CompressionOptions& options) {
  if (options.level < -7 || options.level > 19) {
    return Status::InvalidArgument("compression level must be in [-7, 19], got " +
                                   std::to_string(options.level));
  }
  if (!(options.min_saving >= 0.0 && options.min_saving < 1.0)) {
    return Status::InvalidArgument("compression min_saving must be in [0, 1), got " +
                                   std::to_string(options.min_saving));
  }
  return Status::OK();
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return -1;
    if (dim != 0 && count > INT64_MAX / dim) return -1;
    count *= dim;
  }
  return count;
}

Status TensorRegistry::add(TensorRef tensor) {
  if (tensor.name.empty()) return Status::InvalidArgument("tensor name must not be empty");
  const std::string what = "tensor '" + tensor.name + "'";
  if (find(tensor.name) != nullptr) return Status::InvalidArgument(what + " is registered twice");
  if (DTypeSize(tensor.dtype) == 0) return Status::InvalidArgument(what + " has an invalid dtype");
  const int64_t elements = NumElements(tensor.shape);
  if (elements < 0) return Status::InvalidArgument(what + " has a negative or overflowing shape");
  const uint64_t expected = static_cast<uint64_t>(elements) * DTypeSize(tensor.dtype);
  if (expected / DTypeSize(tensor.dtype) != static_cast<uint64_t>(elements) ||
      expected != tensor.bytes) {
    return Status::InvalidArgument(what + " holds " + std::to_string(tensor.bytes) +
                                   " bytes but its shape and dtype need " +
                                   std::to_string(expected));
  }
  if (tensor.bytes > 0 && tensor.data == nullptr) {
    return Status::InvalidArgument(what + " has no buffer");
  }
  total_bytes_ += tensor.bytes;
  auto pos = std::lower_bound(tensors_.begin(), tensors_.end(), tensor.name,
                              [](const TensorRef& t, const std::string& n) { return t.name < n; });
  tensors_.insert(pos, std::move(tensor));
  return Status::OK();
}

const TensorRef* TensorRegistry::find(const std::string& name) const {
  auto pos = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                              [](const TensorRef& t, const std::string& n) { return t.name < n; });
  return (pos != tensors_.end() && pos->name == name) ? &*pos : nullptr;
}

namespace {
std::mutex& LogMutex() {
  static std::mutex mutex;
  return mutex;
}
std::function<void(std::string_view)>& LogSink() {
  static std::function<void(std::string_view)> sink;
  return sink;
}
}  // namespace

void LogLine(std::string_view message) {
  std::lock_guard lock(LogMutex());
  if (LogSink()) {
    LogSink()(message);
  } else {
    std::cerr << "asyncckpt: " << message << '\n';
  }
}

std::function<void(std::string_view)> SetLogSink(std::function<void(std::string_view)> sink) {
  std::lock_guard lock(LogMutex());
  return std::exchange(LogSink(), std::move(sink));
}

}  // namespace asyncckpt
