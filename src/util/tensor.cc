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

}  // namespace asyncckpt
