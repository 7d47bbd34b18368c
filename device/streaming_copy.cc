#include "device/streaming_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#define ASYNCCKPT_STREAMING_X86 1
#endif

namespace asyncckpt {

#if ASYNCCKPT_STREAMING_X86

namespace {

constexpr size_t kVector = 32;           // one AVX2 store
constexpr size_t kUnroll = 4 * kVector;  // four stores per iteration

// Streams the whole multiple of kUnroll at the front of [src, src + bytes); dst is 32-byte
// aligned. Returns the bytes copied.
__attribute__((target("avx2"))) size_t StreamAligned(uint8_t* dst, const uint8_t* src,
                                                     size_t bytes) {
  const size_t body = bytes - bytes % kUnroll;
  for (size_t i = 0; i < body; i += kUnroll) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  // Non-temporal stores are weakly ordered: without the fence a thread that takes the buffer
  // through a mutex or an atomic could still read stale bytes.
  _mm_sfence();
  return body;
}

}  // namespace

bool StreamingCopyAvailable() {
  static const bool available = __builtin_cpu_supports("avx2");
  return available;
}

void StreamingCopy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
  if (bytes < kStreamingCopyMinBytes || !StreamingCopyAvailable()) {
    std::memcpy(out, in, bytes);
    return;
  }
  const size_t head = (kVector - reinterpret_cast<uintptr_t>(out) % kVector) % kVector;
  std::memcpy(out, in, head);
  const size_t streamed = StreamAligned(out + head, in + head, bytes - head);
  const size_t done = head + streamed;
  std::memcpy(out + done, in + done, bytes - done);
}

#else

bool StreamingCopyAvailable() { return false; }

void StreamingCopy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

#endif

}  // namespace asyncckpt
