#include "src/staging/staging_pool.h"

#include <sys/mman.h>

#include <algorithm>

namespace asyncckpt {
namespace {

// Faults in every page of [data, data + bytes) for writing. One madvise takes the faults in the
// kernel, without a trap per page, which costs a virtual machine most (Linux 5.14 and later);
// where it is refused (an older kernel), a write per page.
void FaultInForWriting(uint8_t* data, uint64_t bytes, uint64_t page_bytes) {
  if (bytes == 0) return;
#ifdef MADV_POPULATE_WRITE
  if (madvise(data, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
  for (uint64_t offset = 0; offset < bytes; offset += page_bytes) data[offset] = 0;
}

}  // namespace

StagingLease& StagingLease::operator=(StagingLease&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    counted_ = std::exchange(other.counted_, true);
  }
  return *this;
}

void StagingLease::reset() {
  if (pool_ != nullptr && data_ != nullptr) pool_->Release(data_, capacity_, counted_);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  capacity_ = 0;
  counted_ = true;
}

StagingPool::StagingPool(std::shared_ptr<Device> device, uint64_t budget_bytes)
    : device_(std::move(device)), budget_(RoundUp(std::max<uint64_t>(budget_bytes, kPageBytes))) {}

StagingPool::~StagingPool() = default;

Status StagingPool::EnsureRegionLocked() {
  if (region_.data() != nullptr) return Status::OK();
  auto region = device_->allocate_pinned(budget_);
  if (!region.ok()) {
    return region.status().WithContext("allocating " + std::to_string(budget_) +
                                       " bytes of staging memory on " + device_->name());
  }
  region_ = std::move(region).value();
  free_.clear();
  free_[0] = budget_;
  ++allocations_;
  return Status::OK();
}

size_t StagingPool::CarveLocked(size_t capacity) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < capacity) continue;
    const size_t offset = it->first;
    const size_t left = it->second - capacity;
    free_.erase(it);
    if (left > 0) free_[offset + capacity] = left;
    in_use_ += capacity;
    high_water_ = std::max(high_water_, in_use_ + taken_);
    return offset;
  }
  return SIZE_MAX;
}

size_t StagingPool::CarveTopLocked(size_t capacity) {
  for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
    if (it->second < capacity) continue;
    it->second -= capacity;
    const size_t offset = it->first + it->second;
    if (it->second == 0) free_.erase(it->first);
    taken_ += capacity;
    high_water_ = std::max(high_water_, in_use_ + taken_);
    return offset;
  }
  return SIZE_MAX;
}

StagingLease StagingPool::take_charged(size_t bytes) {
  const size_t capacity = RoundUp(std::max<size_t>(bytes, 1));
  std::lock_guard lock(mu_);
  if (cancelled_ || !EnsureRegionLocked().ok()) return StagingLease();
  const size_t offset = CarveTopLocked(capacity);
  if (offset == SIZE_MAX) return StagingLease();
  return StagingLease(this, static_cast<uint8_t*>(region_.data()) + offset, bytes, capacity,
                      /*counted=*/false);
}

Result<StagingLease> StagingPool::lease(size_t bytes, const uint64_t* exempt) {
  const size_t capacity = RoundUp(std::max<size_t>(bytes, 1));
  if (capacity > budget_) {
    return Status::InvalidArgument("a staging lease of " + std::to_string(bytes) +
                                   " bytes exceeds the staging budget of " +
                                   std::to_string(budget_) + " bytes");
  }
  std::unique_lock lock(mu_);
  if (Status status = EnsureRegionLocked(); !status.ok()) return status;
  size_t offset = SIZE_MAX;
  freed_.wait(lock, [&] {
    return cancelled_ || (ChargesLeaveRoomLocked(capacity, exempt) &&
                          (offset = CarveLocked(capacity)) != SIZE_MAX);
  });
  if (offset == SIZE_MAX) return Status::Cancelled("the staging pool was shut down");
  return StagingLease(this, static_cast<uint8_t*>(region_.data()) + offset, bytes, capacity);
}

Result<StagingLease> StagingPool::try_lease(size_t bytes, const uint64_t* exempt) {
  const size_t capacity = RoundUp(std::max<size_t>(bytes, 1));
  std::lock_guard lock(mu_);
  if (capacity > budget_ || cancelled_) return StagingLease();
  if (!ChargesLeaveRoomLocked(capacity, exempt)) return StagingLease();
  if (Status status = EnsureRegionLocked(); !status.ok()) return status;
  const size_t offset = CarveLocked(capacity);
  if (offset == SIZE_MAX) return StagingLease();
  return StagingLease(this, static_cast<uint8_t*>(region_.data()) + offset, bytes, capacity);
}

Status StagingPool::Prepare() {
  std::lock_guard lock(mu_);
  const bool fresh = region_.data() == nullptr;
  if (Status status = EnsureRegionLocked(); !status.ok()) return status;
  if (fresh) FaultInForWriting(static_cast<uint8_t*>(region_.data()), budget_, kPageBytes);
  return Status::OK();
}

std::pair<uint8_t*, uint64_t> StagingPool::region() const {
  std::lock_guard lock(mu_);
  return {static_cast<uint8_t*>(region_.data()), region_.data() ? budget_ : 0};
}

void StagingPool::cancel() {
  std::lock_guard lock(mu_);
  cancelled_ = true;
  freed_.notify_all();
}

void StagingPool::Release(uint8_t* data, size_t capacity, bool counted) {
  std::lock_guard lock(mu_);
  size_t offset = static_cast<size_t>(data - static_cast<uint8_t*>(region_.data()));
  size_t size = capacity;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[offset] = size;
  (counted ? in_use_ : taken_) -= capacity;
  freed_.notify_all();
}

bool StagingPool::ChargesLeaveRoomLocked(size_t capacity, const uint64_t* exempt) const {
  const uint64_t charged = charged_ - std::min(charged_, exempt != nullptr ? *exempt : 0);
  return in_use_ + charged + capacity <= budget_;
}

void StagingPool::charge(uint64_t bytes, uint64_t* open) {
  std::lock_guard lock(mu_);
  charged_ += bytes;
  if (open != nullptr) *open += bytes;
}

void StagingPool::settle_open(uint64_t bytes, uint64_t* open) {
  {
    std::lock_guard lock(mu_);
    *open -= std::min(*open, bytes);
  }
  freed_.notify_all();
}

void StagingPool::uncharge(uint64_t bytes) {
  if (bytes == 0) return;
  {
    std::lock_guard lock(mu_);
    charged_ -= std::min(charged_, bytes);
  }
  freed_.notify_all();
}

uint64_t StagingPool::charged() const {
  std::lock_guard lock(mu_);
  return charged_;
}

uint64_t StagingPool::in_use() const {
  std::lock_guard lock(mu_);
  return in_use_;
}

uint64_t StagingPool::high_water() const {
  std::lock_guard lock(mu_);
  return high_water_;
}

uint64_t StagingPool::allocations() const {
  std::lock_guard lock(mu_);
  return allocations_;
}

}  // namespace asyncckpt
