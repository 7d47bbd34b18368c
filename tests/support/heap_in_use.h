#pragma once

// The heap in use after trimming, as the memory tests read it: glibc's count of allocated
// chunks once free pages went back, so that a figure grows only with what is still held.

#include <malloc.h>

#include <cstdint>

namespace asyncckpt::testing_support {

/// Heap bytes in use after malloc_trim(0).
inline int64_t TrimmedHeapInUse() {
  ::malloc_trim(0);
  return static_cast<int64_t>(::mallinfo2().uordblks);
}

}  // namespace asyncckpt::testing_support
