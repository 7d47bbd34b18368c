#pragma once

// A growable byte buffer for per-thread scratch space on hot paths.

#include <cstddef>
#include <cstdint>
#include <memory>

namespace asyncckpt {

/// Grows to the largest size asked for and never zero-fills: callers write every byte they
/// later read. Not thread-safe.
class ByteBuffer {
 public:
  /// At least `n` writable bytes; earlier contents are lost when it grows.
  uint8_t* reserve(size_t n) {
    if (n > capacity_) {
      data_ = std::make_unique_for_overwrite<uint8_t[]>(n);
      capacity_ = n;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t capacity_ = 0;
};

}  // namespace asyncckpt
