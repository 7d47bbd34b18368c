#include "asyncckpt/timer.h"

#include <chrono>
#include <cmath>
#include <sstream>
#include <string>
#include <utility>

namespace asyncckpt {

double SystemClockSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Result<SecondOrStepTimer> SecondOrStepTimer::Create(std::optional<int64_t> every_steps,
                                                    std::optional<double> every_secs, Clock clock) {
  if (every_steps.has_value() == every_secs.has_value()) {
    std::ostringstream message;
    message << "SecondOrStepTimer: exactly one of every_steps and every_secs should be provided";
    if (every_steps.has_value()) {
      message << ", got both (every_steps=" << *every_steps << ", every_secs=" << *every_secs
              << ")";
    } else {
      message << ", got neither";
    }
    return Status::InvalidArgument(message.str());
  }
  if (every_steps.has_value() && *every_steps <= 0) {
    return Status::InvalidArgument("SecondOrStepTimer: every_steps must be positive, got " +
                                   std::to_string(*every_steps));
  }
  // The negated comparison also rejects NaN; an infinite period would never fire again.
  if (every_secs.has_value() && (!(*every_secs > 0) || std::isinf(*every_secs))) {
    std::ostringstream message;
    message << "SecondOrStepTimer: every_secs must be positive and finite, got " << *every_secs;
    return Status::InvalidArgument(message.str());
  }
  if (!clock) return Status::InvalidArgument("SecondOrStepTimer: the clock is empty");
  return SecondOrStepTimer(every_steps, every_secs, std::move(clock));
}

bool SecondOrStepTimer::should_trigger_for_step(int64_t step) const {
  if (last_step_ == step) return false;
  if (!last_step_.has_value()) return true;
  if (every_secs_.has_value()) {
    // last_time_ is always set together with last_step_; the check only guards the deref.
    return !last_time_.has_value() || clock_() >= *last_time_ + *every_secs_;
  }
  // Subtracting keeps a huge every_steps from overflowing `last + every_steps`.
  return step - *last_step_ >= *every_steps_;
}

std::optional<std::pair<double, int64_t>> SecondOrStepTimer::update_last_triggered_step(
    int64_t step) {
  const double now = clock_();
  std::optional<std::pair<double, int64_t>> elapsed;
  if (last_time_.has_value() && last_step_.has_value()) {
    elapsed = std::make_pair(now - *last_time_, step - *last_step_);
  }
  last_time_ = now;
  last_step_ = step;
  return elapsed;
}

}  // namespace asyncckpt
