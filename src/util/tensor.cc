#include "asyncckpt/tensor.h"

#include <algorithm>
#include <climits>

namespace asyncckpt {

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return -1;
    if (dim != 0 && count > INT64_MAX / dim) return -1;
    count *= dim;
  }
  return count;
}

namespace {

// A shard's box must lie inside its global tensor, in as many dimensions as the tensor has.
Status CheckShardBox(const TensorRef& tensor, const std::string& what) {
  if (tensor.global_shape.empty()) {
    if (tensor.global_offset.empty()) return Status::OK();
    return Status::InvalidArgument(what + " has a global_offset but no global_shape");
  }
  const size_t rank = tensor.global_shape.size();
  if (tensor.shape.size() != rank || tensor.global_offset.size() != rank) {
    return Status::InvalidArgument(
        what + " is a shard: shape, global_shape and global_offset need the same rank (" +
        std::to_string(tensor.shape.size()) + ", " + std::to_string(rank) + ", " +
        std::to_string(tensor.global_offset.size()) + ")");
  }
  if (NumElements(tensor.global_shape) < 0) {
    return Status::InvalidArgument(what + " has a negative or overflowing global_shape");
  }
  for (size_t d = 0; d < rank; ++d) {
    const int64_t first = tensor.global_offset[d];
    if (first < 0 || first > tensor.global_shape[d] ||
        tensor.shape[d] > tensor.global_shape[d] - first) {
      return Status::InvalidArgument(
          what + " is a shard whose box leaves the global tensor in dimension " +
          std::to_string(d) + ": offset " + std::to_string(first) + " + extent " +
          std::to_string(tensor.shape[d]) + " > " + std::to_string(tensor.global_shape[d]));
    }
  }
  return Status::OK();
}

}  // namespace

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
  if (Status box = CheckShardBox(tensor, what); !box.ok()) return box;
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

}  // namespace asyncckpt
