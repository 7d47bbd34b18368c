#pragma once

// oneTBB as Debian ships it is not built with ThreadSanitizer, so the happens-before edges its
// task queues and pipeline tokens create are invisible to TSan. These annotations restate those
// edges where data passes between threads; they compile to nothing in other builds.

#if defined(__SANITIZE_THREAD__)
#define ASYNCCKPT_TSAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ASYNCCKPT_TSAN_BUILD 1
#endif
#endif

namespace asyncckpt {

#if defined(ASYNCCKPT_TSAN_BUILD)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
// One sync object for the process: a task must be able to acquire before it reads anything
// (even its own captures), and the joins are cheap enough for a test build.
inline char tsan_handoff_sync;
/// Marks the start of work handed over by another thread.
inline void HandoffAcquire() { __tsan_acquire(&tsan_handoff_sync); }
/// Marks the end of work another thread will take over.
inline void HandoffRelease() { __tsan_release(&tsan_handoff_sync); }
#else
/// Marks the start of work handed over by another thread (no-op outside TSan builds).
inline void HandoffAcquire() {}
/// Marks the end of work another thread will take over (no-op outside TSan builds).
inline void HandoffRelease() {}
#endif

}  // namespace asyncckpt
