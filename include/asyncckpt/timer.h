#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "asyncckpt/status.h"

namespace asyncckpt {

/// A source of time in seconds, injectable so tests can use a fake clock.
using Clock = std::function<double()>;

/// Seconds since the epoch from the system clock.
double SystemClockSeconds();

/// Fires every N steps or every N seconds (exactly one), as TensorFlow's SecondOrStepTimer:
/// on the first step it sees, never twice for one step, then when step >= last + N or
/// now >= last + secs.
class SecondOrStepTimer {
 public:
  /// InvalidArgument when both or neither of every_steps / every_secs are set, or one is <= 0.
  static Result<SecondOrStepTimer> Create(std::optional<int64_t> every_steps,
                                          std::optional<double> every_secs,
                                          Clock clock = SystemClockSeconds);
  /// True when a trigger is due at `step`.
  bool should_trigger_for_step(int64_t step) const;
  /// Records that it fired at `step` now; returns the seconds and steps since the last firing
  /// (nullopt the first time).
  std::optional<std::pair<double, int64_t>> update_last_triggered_step(int64_t step);
  /// The last step it fired at, or nullopt.
  std::optional<int64_t> last_triggered_step() const { return last_step_; }
  /// Forgets the last firing (the next step fires).
  void reset() {
    last_step_.reset();
    last_time_.reset();
  }

 private:
  SecondOrStepTimer(std::optional<int64_t> every_steps, std::optional<double> every_secs,
                    Clock clock)
      : every_steps_(every_steps), every_secs_(every_secs), clock_(std::move(clock)) {}

  std::optional<int64_t> every_steps_;
  std::optional<double> every_secs_;
  Clock clock_;
  std::optional<int64_t> last_step_;
  std::optional<double> last_time_;
};

}  // namespace asyncckpt
