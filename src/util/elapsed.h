#pragma once

// The one clock every duration in a save report is measured with.

#include <chrono>

namespace asyncckpt {

/// The clock of save times.
using SteadyClock = std::chrono::steady_clock;

/// Seconds from `start` until now.
inline double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

}  // namespace asyncckpt
