#pragma once

// Copies into staging memory that bypass the CPU caches on the way out.

#include <cstddef>

namespace asyncckpt {

/// Below this many bytes StreamingCopy is a plain memcpy: a small copy's cache lines are
/// cheap, and the encoder may still find them in cache.
inline constexpr size_t kStreamingCopyMinBytes = 256 << 10;

/// Copies `bytes` from `src` to `dst` (which must not overlap), with non-temporal stores where
/// the CPU has them (x86-64 with AVX2) and the copy is at least kStreamingCopyMinBytes.
/// A snapshot copy writes far more than the caches hold and nobody reads it back soon; streaming
/// stores skip reading each destination line before writing it, one of the three memory
/// transfers per byte of a plain memcpy. The stores are fenced before it returns, so the bytes
/// are visible to any thread the caller hands them to afterwards.
void StreamingCopy(void* dst, const void* src, size_t bytes);

/// True when StreamingCopy uses non-temporal stores on this CPU.
bool StreamingCopyAvailable();

}  // namespace asyncckpt
