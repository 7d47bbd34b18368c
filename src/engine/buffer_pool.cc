#include "src/engine/buffer_pool.h"

#include <algorithm>
#include <cstdlib>
#include <new>

namespace asyncckpt {

namespace {
constexpr size_t kPage = 4096;
}  // namespace

PooledBuffer& PooledBuffer::operator=(PooledBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void PooledBuffer::reset() {
  if (data_ != nullptr) pool_->put(data_, capacity_);
  pool_ = nullptr;
  data_ = nullptr;
  capacity_ = 0;
}

BufferPool::~BufferPool() {
  for (auto& [capacity, data] : free_) std::free(data);
}

PooledBuffer BufferPool::get(size_t bytes) {
  const size_t capacity = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  {
    std::lock_guard lock(mu_);
    auto it = free_.lower_bound(capacity);
    if (it != free_.end()) {
      PooledBuffer buffer(this, it->second, it->first);
      free_.erase(it);
      return buffer;
    }
    ++allocations_;
  }
  auto* data = static_cast<uint8_t*>(std::aligned_alloc(kPage, capacity));
  if (data == nullptr) throw std::bad_alloc();
  return PooledBuffer(this, data, capacity);
}

uint64_t BufferPool::allocations() const {
  std::lock_guard lock(mu_);
  return allocations_;
}

void BufferPool::put(uint8_t* data, size_t capacity) {
  std::lock_guard lock(mu_);
  free_.emplace(capacity, data);
}

}  // namespace asyncckpt
