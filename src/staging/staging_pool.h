#pragma once

// A fixed budget of pinned host memory that snapshots are copied into. The whole budget is one
// pinned region, allocated on first use and kept for the pool's life: after the first save no
// save allocates or pins memory again. Leases are carved out of it first-fit in 4 KiB pages
// (every lease starts 4096-aligned, so O_DIRECT writes can come straight from it) and returned
// by their destructor, which wakes whoever waits for room.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "asyncckpt/device.h"
#include "asyncckpt/status.h"

namespace asyncckpt {

class StagingPool;

/// A piece of the pool, returned to it when destroyed. Move-only. The pool must outlive it.
class StagingLease {
 public:
  /// An empty lease.
  StagingLease() = default;
  StagingLease(StagingLease&& other) noexcept { *this = std::move(other); }
  StagingLease& operator=(StagingLease&& other) noexcept;
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;
  ~StagingLease() { reset(); }

  /// First byte (4096-aligned); null for an empty lease.
  uint8_t* data() const { return data_; }
  /// Bytes asked for.
  size_t size() const { return size_; }
  /// Bytes reserved (size rounded up to whole pages): writes may cover this much.
  size_t capacity() const { return capacity_; }
  /// Returns the memory to the pool now.
  void reset();

 private:
  friend class StagingPool;
  StagingLease(StagingPool* pool, uint8_t* data, size_t size, size_t capacity, bool counted = true)
      : pool_(pool), data_(data), size_(size), capacity_(capacity), counted_(counted) {}

  StagingPool* pool_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
  bool counted_ = true;  // in in_use(); false for take_charged()'s memory, which charges stand for
};

/// The pool. Thread-safe.
class StagingPool {
 public:
  /// Page size of the pool: leases start and end on multiples of it.
  static constexpr size_t kPageBytes = 4096;

  /// A pool of `budget_bytes` (rounded up to pages) of memory pinned by `device`.
  StagingPool(std::shared_ptr<Device> device, uint64_t budget_bytes);
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  /// Every lease must have been returned.
  ~StagingPool();

  /// Blocks until `bytes` are free, then leases them. InvalidArgument when `bytes` exceeds the
  /// whole budget; Unavailable when the region cannot be allocated; Cancelled after cancel().
  /// Charges (below) count against the budget as leases do, except the `exempt` ones (read under
  /// the pool's lock; may be null).
  Result<StagingLease> lease(size_t bytes, const uint64_t* exempt = nullptr);
  /// Leases `bytes` if they are free now; an empty lease when not.
  Result<StagingLease> try_lease(size_t bytes, const uint64_t* exempt = nullptr);
  /// Counts `bytes` against the budget without memory: for copies of staged bytes kept
  /// elsewhere until written (the engine's packed writes). Never blocks. Adds them to *open
  /// too when not null.
  void charge(uint64_t bytes, uint64_t* open = nullptr);
  /// Carves `bytes` from the top of the region for memory that charges already stand for (the
  /// engine's packs: their chunks' pages are charged, so the pack itself is not counted in
  /// in_use() again). Taken from the top so that it fragments the leases below as little as
  /// possible. Never blocks; an empty lease when no piece of the region is free that large.
  StagingLease take_charged(size_t bytes);
  /// Takes `bytes` out of *open (they stay charged).
  void settle_open(uint64_t bytes, uint64_t* open);
  /// Returns charged bytes, waking whoever waits for room.
  void uncharge(uint64_t bytes);
  /// Bytes charged now.
  uint64_t charged() const;
  /// Allocates the region now (if not yet) and touches every page, so the first save pays no
  /// page faults; Unavailable when it cannot be allocated.
  Status Prepare();
  /// The region's first byte and size (null before the first lease or Prepare()).
  std::pair<uint8_t*, uint64_t> region() const;
  /// Wakes every waiter with Cancelled (used when shutting down).
  void cancel();

  /// The budget in bytes (whole pages).
  uint64_t budget() const { return budget_; }
  /// Bytes leased now (whole pages).
  uint64_t in_use() const;
  /// Most bytes of the region in use at once: leased, or taken by take_charged().
  uint64_t high_water() const;
  /// Times the pinned region was allocated (1 after the first lease; never more).
  uint64_t allocations() const;

  /// Pages needed for `bytes`.
  static size_t RoundUp(size_t bytes) { return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes; }

 private:
  friend class StagingLease;
  Status EnsureRegionLocked();
  bool ChargesLeaveRoomLocked(size_t capacity, const uint64_t* exempt) const;
  // First fit; returns the offset or SIZE_MAX when nothing fits.
  size_t CarveLocked(size_t capacity);
  // Last fit, from the top of the highest free piece that holds it; SIZE_MAX when none does.
  size_t CarveTopLocked(size_t capacity);
  void Release(uint8_t* data, size_t capacity, bool counted);

  std::shared_ptr<Device> device_;
  const uint64_t budget_;
  mutable std::mutex mu_;
  std::condition_variable freed_;
  PinnedBuffer region_;
  std::map<size_t, size_t> free_;  // offset -> bytes, coalesced
  uint64_t in_use_ = 0;
  uint64_t taken_ = 0;  // by take_charged(), not in in_use_
  uint64_t charged_ = 0;
  uint64_t high_water_ = 0;
  uint64_t allocations_ = 0;
  bool cancelled_ = false;
};

}  // namespace asyncckpt
