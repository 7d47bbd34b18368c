#include "src/staging/staging_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

namespace asyncckpt {
namespace {

constexpr size_t kPage = StagingPool::kPageBytes;

bool PageAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kPage == 0; }

// True when `bytes` could be leased right now: a lease is taken and given back at once.
bool HasRoom(StagingPool& pool, size_t bytes) {
  auto lease = pool.try_lease(bytes);
  return lease.ok() && lease->data() != nullptr;
}

// Counts the regions a device hands out, so a test can see the pool never allocates twice.
class CountingDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kHost; }
  std::string name() const override { return "counting"; }
  Result<PinnedBuffer> allocate_pinned(size_t bytes) override {
    ++allocations;
    return HostDevice()->allocate_pinned(bytes);
  }
  Result<std::unique_ptr<CopyFence>> copy_to_host_async(const void* src, void* dst,
                                                        size_t bytes) override {
    return HostDevice()->copy_to_host_async(src, dst, bytes);
  }
  Status copy_from_host(const void* src, void* dst, size_t bytes) override {
    return HostDevice()->copy_from_host(src, dst, bytes);
  }
  std::atomic<int> allocations{0};
};

// A device that cannot allocate pinned memory.
class BrokenDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kHost; }
  std::string name() const override { return "broken"; }
  Result<PinnedBuffer> allocate_pinned(size_t) override {
    return Status::Unavailable("no pinned memory today");
  }
  Result<std::unique_ptr<CopyFence>> copy_to_host_async(const void*, void*, size_t) override {
    return Status::Unavailable("no copies");
  }
  Status copy_from_host(const void*, void*, size_t) override {
    return Status::Unavailable("no copies");
  }
};

class StagingPoolTest : public ::testing::Test {
 protected:
  std::shared_ptr<CountingDevice> device_ = std::make_shared<CountingDevice>();
};

TEST_F(StagingPoolTest, BudgetIsRoundedUpToWholePages) {
  EXPECT_EQ(StagingPool(device_, 1).budget(), kPage);
  EXPECT_EQ(StagingPool(device_, kPage).budget(), kPage);
  EXPECT_EQ(StagingPool(device_, kPage + 1).budget(), 2 * kPage);
  EXPECT_EQ(StagingPool(device_, 0).budget(), kPage);
}

TEST_F(StagingPoolTest, LeasesArePageAlignedAndReturnedOnDestruction) {
  StagingPool pool(device_, 16 * kPage);
  EXPECT_EQ(pool.region().first, nullptr);
  {
    auto a = pool.lease(1);
    auto b = pool.lease(kPage + 1);
    auto c = pool.lease(3 * kPage);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    for (const StagingLease* lease : {&*a, &*b, &*c}) {
      ASSERT_NE(lease->data(), nullptr);
      EXPECT_TRUE(PageAligned(lease->data()));
      EXPECT_EQ(lease->capacity(), StagingPool::RoundUp(lease->size()));
      auto [base, size] = pool.region();
      EXPECT_GE(lease->data(), base);
      EXPECT_LE(lease->data() + lease->capacity(), base + size);
      std::memset(lease->data(), 0xab, lease->capacity());  // whole capacity is writable
    }
    EXPECT_EQ(a->size(), 1u);
    EXPECT_EQ(a->capacity(), kPage);
    EXPECT_EQ(b->capacity(), 2 * kPage);
    EXPECT_EQ(c->capacity(), 3 * kPage);
    EXPECT_EQ(pool.in_use(), 6 * kPage);
    // Leases never overlap.
    std::vector<std::pair<uint8_t*, size_t>> spans = {
        {a->data(), a->capacity()}, {b->data(), b->capacity()}, {c->data(), c->capacity()}};
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      EXPECT_LE(spans[i - 1].first + spans[i - 1].second, spans[i].first);
    }
  }
  EXPECT_EQ(pool.in_use(), 0u);
  EXPECT_TRUE(HasRoom(pool, 16 * kPage));
}

TEST_F(StagingPoolTest, ResetAndMoveReturnMemoryExactlyOnce) {
  StagingPool pool(device_, 4 * kPage);
  auto first = pool.lease(kPage);
  ASSERT_TRUE(first.ok());
  StagingLease moved = std::move(first).value();
  EXPECT_EQ(pool.in_use(), kPage);
  StagingLease other = std::move(moved);
  EXPECT_EQ(moved.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(moved.capacity(), 0u);
  EXPECT_EQ(pool.in_use(), kPage);

  auto second = pool.lease(2 * kPage);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(pool.in_use(), 3 * kPage);
  other = std::move(second).value();  // the first lease goes back, the second is kept
  EXPECT_EQ(pool.in_use(), 2 * kPage);
  EXPECT_EQ(other.capacity(), 2 * kPage);
  other.reset();
  other.reset();  // a second reset is harmless
  EXPECT_EQ(pool.in_use(), 0u);
  EXPECT_EQ(other.data(), nullptr);
}

TEST_F(StagingPoolTest, LeaseBlocksUntilAnotherThreadReturnsMemory) {
  StagingPool pool(device_, 4 * kPage);
  auto held = pool.lease(3 * kPage);
  ASSERT_TRUE(held.ok());
  std::atomic<bool> got{false};
  auto waiter = std::async(std::launch::async, [&] {
    auto lease = pool.lease(2 * kPage);
    got = true;
    return lease;
  });
  // Only one page is free: the waiter must still be waiting after a while.
  EXPECT_EQ(waiter.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  EXPECT_FALSE(got.load());
  held->reset();
  auto lease = waiter.get();
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_TRUE(got.load());
  EXPECT_EQ(lease->capacity(), 2 * kPage);
  EXPECT_EQ(pool.in_use(), 2 * kPage);
}

TEST_F(StagingPoolTest, TryLeaseReturnsAnEmptyLeaseWhenFull) {
  StagingPool pool(device_, 2 * kPage);
  auto a = pool.try_lease(kPage);
  auto b = pool.try_lease(kPage);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->data(), nullptr);
  EXPECT_NE(b->data(), nullptr);
  EXPECT_FALSE(HasRoom(pool, 1));
  auto c = pool.try_lease(1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->data(), nullptr);
  EXPECT_EQ(pool.in_use(), 2 * kPage);
  a->reset();
  EXPECT_TRUE(HasRoom(pool, kPage));
  EXPECT_FALSE(HasRoom(pool, kPage + 1));
  auto d = pool.try_lease(kPage);
  ASSERT_TRUE(d.ok());
  EXPECT_NE(d->data(), nullptr);
}

TEST_F(StagingPoolTest, OverBudgetLeaseIsInvalidArgument) {
  StagingPool pool(device_, 2 * kPage);
  auto lease = pool.lease(2 * kPage + 1);
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(lease.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(lease.status().message().find("exceeds the staging budget"), std::string::npos)
      << lease.status().ToString();
  // try_lease cannot block, so it reports the same request as "no room".
  auto tried = pool.try_lease(3 * kPage);
  ASSERT_TRUE(tried.ok());
  EXPECT_EQ(tried->data(), nullptr);
  EXPECT_FALSE(HasRoom(pool, 3 * kPage));
  EXPECT_EQ(pool.in_use(), 0u);
}

// The engine's packs: memory their chunks' charges already stand for, taken from the top of
// the region so that leases below stay whole, and not counted as leased a second time.
TEST_F(StagingPoolTest, TakeChargedComesFromTheTopAndIsNotCountedAsLeased) {
  StagingPool pool(device_, 8 * kPage);
  auto low = pool.lease(2 * kPage);
  ASSERT_TRUE(low.ok());
  StagingLease pack = pool.take_charged(3 * kPage);
  ASSERT_NE(pack.data(), nullptr);
  EXPECT_EQ(pack.data(), low->data() + 5 * kPage);  // the top three pages
  EXPECT_EQ(pool.in_use(), 2 * kPage);
  EXPECT_EQ(pool.high_water(), 5 * kPage);                  // memory all the same
  EXPECT_EQ(pool.take_charged(4 * kPage).data(), nullptr);  // three pages left
  auto rest = pool.try_lease(3 * kPage);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(rest->data(), low->data() + 2 * kPage);
  pack.reset();
  EXPECT_EQ(pool.in_use(), 5 * kPage);
  rest->reset();
  low->reset();
  auto all = pool.try_lease(8 * kPage);  // everything coalesced again
  ASSERT_TRUE(all.ok());
  EXPECT_NE(all->data(), nullptr);
}

TEST_F(StagingPoolTest, FreedPiecesCoalesceIntoOneFullBudgetLease) {
  constexpr size_t kPieces = 64;
  StagingPool pool(device_, kPieces * kPage);
  std::vector<StagingLease> leases;
  for (size_t i = 0; i < kPieces; ++i) {
    auto lease = pool.try_lease(kPage - (i % 7));  // sizes below a page still take one page
    ASSERT_TRUE(lease.ok());
    ASSERT_NE(lease->data(), nullptr) << "piece " << i;
    leases.push_back(std::move(lease).value());
  }
  EXPECT_FALSE(HasRoom(pool, 1));
  std::mt19937 random(20240611);
  for (int round = 0; round < 3; ++round) {
    std::shuffle(leases.begin(), leases.end(), random);
    for (auto& lease : leases) {
      lease.reset();
      // While some pieces are out, the full budget cannot fit.
      if (pool.in_use() != 0) {
        EXPECT_FALSE(HasRoom(pool, kPieces * kPage));
      }
    }
    EXPECT_EQ(pool.in_use(), 0u);
    auto whole = pool.try_lease(kPieces * kPage);
    ASSERT_TRUE(whole.ok());
    ASSERT_NE(whole->data(), nullptr) << "round " << round << ": free space did not coalesce";
    EXPECT_EQ(whole->data(), pool.region().first);
    whole->reset();
    // Lease the pieces again for the next round (in a different layout of sizes).
    for (size_t i = 0; i < kPieces; ++i) {
      auto lease = pool.try_lease(1);
      ASSERT_TRUE(lease.ok() && lease->data() != nullptr);
      leases[i] = std::move(lease).value();
    }
  }
}

TEST_F(StagingPoolTest, HoleMergesWithBothNeighbours) {
  StagingPool pool(device_, 5 * kPage);
  auto a = pool.try_lease(kPage);
  auto b = pool.try_lease(2 * kPage);
  auto c = pool.try_lease(kPage);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_TRUE(a->data() && b->data() && c->data());
  b->reset();  // free: [1,3) and [4,5): neither holds 3 pages
  EXPECT_FALSE(HasRoom(pool, 3 * kPage));
  c->reset();  // [1,3) + [3,4) + [4,5) merge into 4 pages
  auto big = pool.try_lease(4 * kPage);
  ASSERT_TRUE(big.ok());
  ASSERT_NE(big->data(), nullptr);
  EXPECT_EQ(big->data(), a->data() + kPage);
  big->reset();
  a->reset();  // merges with the free run after it
  EXPECT_TRUE(HasRoom(pool, 5 * kPage));
}

TEST_F(StagingPoolTest, CancelWakesWaitersWithCancelled) {
  StagingPool pool(device_, 2 * kPage);
  auto held = pool.lease(2 * kPage);
  ASSERT_TRUE(held.ok());
  auto first = std::async(std::launch::async, [&] { return pool.lease(kPage).status(); });
  auto second = std::async(std::launch::async, [&] { return pool.lease(2 * kPage).status(); });
  EXPECT_EQ(first.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  pool.cancel();
  EXPECT_EQ(first.get().code(), StatusCode::kCancelled);
  EXPECT_EQ(second.get().code(), StatusCode::kCancelled);
  // After cancel() nothing new is handed out, even when memory is free.
  held->reset();
  EXPECT_EQ(pool.lease(kPage).status().code(), StatusCode::kCancelled);
  auto tried = pool.try_lease(kPage);
  ASSERT_TRUE(tried.ok());
  EXPECT_EQ(tried->data(), nullptr);
}

TEST_F(StagingPoolTest, RegionIsAllocatedOnceForManyLeases) {
  StagingPool pool(device_, 8 * kPage);
  EXPECT_EQ(pool.allocations(), 0u);
  for (int i = 0; i < 1000; ++i) {
    auto lease = pool.lease(static_cast<size_t>(1 + (i * 977) % (8 * kPage)));
    ASSERT_TRUE(lease.ok());
  }
  EXPECT_EQ(pool.allocations(), 1u);
  EXPECT_EQ(device_->allocations.load(), 1);
  EXPECT_TRUE(pool.Prepare().ok());  // already allocated: nothing new
  EXPECT_EQ(pool.allocations(), 1u);
}

TEST_F(StagingPoolTest, PrepareAllocatesUpFront) {
  StagingPool pool(device_, 3 * kPage);
  ASSERT_TRUE(pool.Prepare().ok());
  EXPECT_EQ(pool.allocations(), 1u);
  auto [base, size] = pool.region();
  EXPECT_NE(base, nullptr);
  EXPECT_TRUE(PageAligned(base));
  EXPECT_EQ(size, 3 * kPage);
  auto lease = pool.lease(3 * kPage);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->data(), base);
  EXPECT_EQ(pool.allocations(), 1u);
}

TEST_F(StagingPoolTest, AllocationFailureIsUnavailableAndNamesTheDevice) {
  StagingPool pool(std::make_shared<BrokenDevice>(), 2 * kPage);
  auto lease = pool.lease(kPage);
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(lease.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(lease.status().message().find("broken"), std::string::npos)
      << lease.status().ToString();
  EXPECT_FALSE(pool.try_lease(kPage).ok());
  EXPECT_FALSE(pool.Prepare().ok());
  EXPECT_EQ(pool.allocations(), 0u);
}

TEST_F(StagingPoolTest, HighWaterIsTheMostLeasedAtOnce) {
  StagingPool pool(device_, 10 * kPage);
  EXPECT_EQ(pool.high_water(), 0u);
  {
    auto a = pool.lease(3 * kPage);
    auto b = pool.lease(4 * kPage);
    ASSERT_TRUE(a.ok() && b.ok());
  }
  EXPECT_EQ(pool.high_water(), 7 * kPage);
  {
    auto c = pool.lease(2 * kPage);
    ASSERT_TRUE(c.ok());
  }
  EXPECT_EQ(pool.high_water(), 7 * kPage);  // a lower peak does not lower it
  {
    auto d = pool.lease(10 * kPage);
    ASSERT_TRUE(d.ok());
  }
  EXPECT_EQ(pool.high_water(), 10 * kPage);
  EXPECT_EQ(pool.in_use(), 0u);
}

TEST_F(StagingPoolTest, ConcurrentLeasesNeverOverlapAndAllComeBack) {
  constexpr size_t kPages = 32;
  StagingPool pool(device_, kPages * kPage);
  constexpr int kThreads = 4;
  constexpr int kRounds = 300;
  std::atomic<int> overlaps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(t + 1));
      std::uniform_int_distribution<size_t> pages(1, kPages / kThreads);
      const auto tag = static_cast<uint8_t>(t + 1);
      for (int round = 0; round < kRounds; ++round) {
        const size_t bytes = pages(random) * kPage - (round % 3);
        auto lease = round % 2 ? pool.lease(bytes) : pool.try_lease(bytes);
        if (!lease.ok()) {
          overlaps += 1000;  // no failure is expected at all
          return;
        }
        if (lease->data() == nullptr) continue;
        // Mark our bytes, let others run, then check nobody wrote into them.
        std::memset(lease->data(), tag, lease->capacity());
        std::this_thread::yield();
        for (size_t i = 0; i < lease->capacity(); i += 509) {
          if (lease->data()[i] != tag) {
            ++overlaps;
            break;
          }
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(pool.in_use(), 0u);
  EXPECT_LE(pool.high_water(), pool.budget());
  EXPECT_EQ(pool.allocations(), 1u);
  EXPECT_TRUE(HasRoom(pool, kPages * kPage));
}

}  // namespace
}  // namespace asyncckpt
