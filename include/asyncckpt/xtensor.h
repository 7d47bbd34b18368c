#pragma once

// Optional: reading a tensor of a checkpoint into an xtensor array. Only a program that includes
// this header needs xtensor (and links it, e.g. target_link_libraries(... xtensor)); the rest of
// the API does not depend on it.

#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>
#include <xtensor/xarray.hpp>

#include "asyncckpt/dtype.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/status.h"

namespace asyncckpt {

/// Reads tensor `name` of `reader` into an xtensor array (CheckpointReader::read, every chunk
/// verified). NotFound for an unknown tensor; InvalidArgument when T does not match its dtype;
/// ResourceExhausted (naming the tensor and its size) when the array cannot be allocated. Never
/// throws.
template <typename T>
Result<xt::xarray<T>> ReadXarray(CheckpointReader& reader, const std::string& name) {
  const TensorInfo* info = reader.find(name);
  if (info == nullptr) {
    return Status::NotFound("no tensor named '" + name + "' in " + reader.path());
  }
  constexpr auto wanted = DTypeOf<T>();
  if (!wanted || *wanted != info->dtype) {
    return Status::InvalidArgument("tensor '" + name + "' has dtype " +
                                   std::string(DTypeName(info->dtype)) +
                                   ", which does not match the requested element type");
  }
  try {
    std::vector<size_t> shape(info->shape.begin(), info->shape.end());
    xt::xarray<T> out(shape);
    Status status = reader.read(name, out.data(), out.size() * sizeof(T));
    if (!status.ok()) return status;
    return out;
  } catch (const std::exception& e) {
    const bool no_memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
                           dynamic_cast<const std::length_error*>(&e) != nullptr;
    try {
      const std::string what = "tensor '" + name + "' of " + std::to_string(info->bytes) +
                               " bytes from " + reader.path();
      if (no_memory) return Status::ResourceExhausted("out of memory for " + what);
      return Status::Internal("reading " + what + ": " + e.what());
    } catch (...) {
      return Status::ResourceExhausted("out of memory");  // short enough to need no allocation
    }
  }
}

}  // namespace asyncckpt
