#pragma once

// Page-aligned buffers for encoded chunks and packed writes, recycled so that steady-state
// saves allocate nothing. Every buffer is a whole number of 4 KiB pages, so O_DIRECT writes can
// come straight from it, padding included.

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

namespace asyncckpt {

class BufferPool;

/// A buffer of the pool, returned to it when destroyed. Move-only; the pool must outlive it.
class PooledBuffer {
 public:
  /// An empty buffer.
  PooledBuffer() = default;
  PooledBuffer(PooledBuffer&& other) noexcept { *this = std::move(other); }
  PooledBuffer& operator=(PooledBuffer&& other) noexcept;
  PooledBuffer(const PooledBuffer&) = delete;
  PooledBuffer& operator=(const PooledBuffer&) = delete;
  ~PooledBuffer() { reset(); }

  /// First byte (4096-aligned); null when empty.
  uint8_t* data() const { return data_; }
  /// Usable bytes (whole pages).
  size_t capacity() const { return capacity_; }
  /// Returns the buffer to its pool now.
  void reset();

 private:
  friend class BufferPool;
  PooledBuffer(BufferPool* pool, uint8_t* data, size_t capacity)
      : pool_(pool), data_(data), capacity_(capacity) {}

  BufferPool* pool_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
};

/// The pool. Thread-safe.
class BufferPool {
 public:
  BufferPool() = default;
  /// Every buffer must have been returned.
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  /// A buffer of at least `bytes` (at least one page), reused when one is free. Throws
  /// std::bad_alloc when memory runs out (the graph's nodes catch it).
  PooledBuffer get(size_t bytes);
  /// Buffers allocated so far (not reused ones).
  uint64_t allocations() const;

 private:
  friend class PooledBuffer;
  void put(uint8_t* data, size_t capacity);

  mutable std::mutex mu_;
  std::multimap<size_t, uint8_t*> free_;  // capacity -> buffer
  uint64_t allocations_ = 0;
};

}  // namespace asyncckpt
