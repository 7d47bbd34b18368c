#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/device.h"
#include "asyncckpt/dtype.h"
#include "asyncckpt/status.h"

namespace asyncckpt {

/// A named tensor to save or restore. Does not own its buffer: the caller keeps `data` alive
/// and unchanged while a save copies it (the hooks say when that copy is over).
struct TensorRef {
  /// Unique, non-empty name; data, never a file path.
  std::string name;
  /// Element type.
  DType dtype = DType::kF32;
  /// Dimensions; empty for a scalar.
  std::vector<int64_t> shape;
  /// The buffer on `device` (host memory when device is null or the host device).
  void* data = nullptr;
  /// Size of the buffer in bytes; must equal elements × dtype size.
  size_t bytes = 0;
  /// Where `data` lives; null means host memory.
  std::shared_ptr<Device> device;
  /// Multi-process jobs: the dimensions of the global tensor this buffer is a shard of. Empty
  /// (the default): the tensor is whole and `shape` is its shape.
  std::vector<int64_t> global_shape;
  /// With global_shape: this shard's first index in each global dimension (the box
  /// [global_offset, global_offset + shape) in the global index space). Several processes may
  /// hold the same box (replicas); it is written once.
  std::vector<int64_t> global_offset;
};

/// Whether `tensor` is registered as a shard of a global tensor.
inline bool IsShard(const TensorRef& tensor) { return !tensor.global_shape.empty(); }

/// The number of elements a shape holds, or -1 when a dimension is negative or it overflows.
int64_t NumElements(const std::vector<int64_t>& shape);

/// The named tensors of a job, kept in name order. Not thread-safe: fill it before training.
class TensorRegistry {
 public:
  /// Adds a tensor; InvalidArgument for an empty or duplicate name, a negative dimension, or
  /// a byte size that does not match shape × dtype, or a null buffer for a non-empty tensor.
  Status add(TensorRef tensor);
  /// Every tensor, in name order.
  const std::vector<TensorRef>& tensors() const { return tensors_; }
  /// The tensor with this name, or null.
  const TensorRef* find(const std::string& name) const;
  /// Sum of every tensor's bytes.
  uint64_t total_bytes() const { return total_bytes_; }
  /// Number of tensors.
  size_t size() const { return tensors_.size(); }

 private:
  std::vector<TensorRef> tensors_;
  uint64_t total_bytes_ = 0;
};

/// Small facts saved with every checkpoint.
struct CheckpointMetadata {
  /// The global step the checkpoint holds.
  int64_t step = 0;
  /// Seconds since the epoch when the snapshot was taken.
  double wall_time = 0;
  /// Free-form user key/values.
  std::map<std::string, std::string> user;
};

}  // namespace asyncckpt
