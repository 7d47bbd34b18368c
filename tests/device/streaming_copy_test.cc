#include "device/streaming_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace asyncckpt {
namespace {

std::vector<uint8_t> Pattern(size_t n, uint8_t salt) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 131 + salt + (i >> 9));
  return bytes;
}

// Copies `bytes` from src+src_skew to dst+dst_skew inside guard bytes, and checks that exactly
// the range was written, byte for byte.
void ExpectExactCopy(size_t bytes, size_t src_skew, size_t dst_skew) {
  constexpr size_t kGuard = 64;
  const std::vector<uint8_t> src = Pattern(bytes + src_skew, 7);
  std::vector<uint8_t> dst(bytes + dst_skew + 2 * kGuard, 0xEE);
  uint8_t* out = dst.data() + kGuard + dst_skew;
  StreamingCopy(out, src.data() + src_skew, bytes);
  // memcmp with a null pointer is undefined even for zero bytes (an empty vector's data()).
  ASSERT_TRUE(bytes == 0 || std::memcmp(out, src.data() + src_skew, bytes) == 0)
      << bytes << " bytes, src skew " << src_skew << ", dst skew " << dst_skew;
  for (size_t i = 0; i < kGuard + dst_skew; ++i) ASSERT_EQ(dst[i], 0xEE) << "byte before, " << i;
  for (size_t i = kGuard + dst_skew + bytes; i < dst.size(); ++i) {
    ASSERT_EQ(dst[i], 0xEE) << "byte after, " << i;
  }
}

TEST(StreamingCopyTest, CopiesSmallSizesWithMemcpy) {
  for (size_t bytes :
       {size_t{0}, size_t{1}, size_t{31}, size_t{4096}, kStreamingCopyMinBytes - 1}) {
    ExpectExactCopy(bytes, 0, 0);
  }
}

TEST(StreamingCopyTest, CopiesLargeSizesAtEveryAlignmentExactly) {
  // Sizes around the streaming threshold and the 128-byte body, at source and destination
  // offsets that leave a head and a tail on both sides of the aligned body.
  for (size_t bytes : {kStreamingCopyMinBytes, kStreamingCopyMinBytes + 1,
                       kStreamingCopyMinBytes + 127, size_t{4 << 20} + 77}) {
    for (size_t src_skew : {0, 1, 17, 32}) {
      for (size_t dst_skew : {0, 3, 31, 33, 64}) ExpectExactCopy(bytes, src_skew, dst_skew);
    }
  }
}

}  // namespace
}  // namespace asyncckpt
