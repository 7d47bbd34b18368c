#pragma once

// A TensorRef built field by field, for tests: GCC's -Wmissing-field-initializers rejects
// aggregate and designated initialisers that leave TensorRef's later fields out.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "asyncckpt/tensor.h"

namespace asyncckpt::testing_support {

/// A host tensor; a shard of a global tensor when global_shape is given.
inline TensorRef Ref(std::string name, DType dtype, std::vector<int64_t> shape, void* data,
                     size_t bytes, std::vector<int64_t> global_shape = {},
                     std::vector<int64_t> global_offset = {}) {
  TensorRef t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = data;
  t.bytes = bytes;
  t.global_shape = std::move(global_shape);
  t.global_offset = std::move(global_offset);
  return t;
}

}  // namespace asyncckpt::testing_support
