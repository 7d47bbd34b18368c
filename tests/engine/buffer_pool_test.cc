#include "src/engine/buffer_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

namespace asyncckpt {
namespace {

TEST(BufferPoolTest, BuffersArePageAlignedWholePagesAndReusedOnceReturned) {
  BufferPool pool;
  uint8_t* first = nullptr;
  {
    PooledBuffer buffer = pool.get(100);
    ASSERT_NE(buffer.data(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % 4096, 0u);
    EXPECT_EQ(buffer.capacity(), 4096u);
    first = buffer.data();
  }  // returned here
  PooledBuffer again = pool.get(4096);
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(pool.allocations(), 1u);
}

TEST(BufferPoolTest, AMovedBufferIsReturnedOnceByItsLastOwner) {
  BufferPool pool;
  PooledBuffer a = pool.get(5000);
  EXPECT_EQ(a.capacity(), 8192u);
  PooledBuffer b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from is empty
  b.reset();
  EXPECT_EQ(b.data(), nullptr);
  PooledBuffer c = pool.get(8192);
  PooledBuffer d = pool.get(8192);  // the one returned serves one request only
  EXPECT_NE(c.data(), d.data());
  EXPECT_EQ(pool.allocations(), 2u);
}

}  // namespace
}  // namespace asyncckpt
