#pragma once

// The yardstick train-sim holds each save's blocked time against: one plain parallel memcpy of
// the whole state, timed just before that save at the same point of the step.

#include <cstdint>
#include <map>
#include <memory>

#include "asyncckpt/hooks.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/tensor.h"
#include "src/saver/save_schedule.h"

namespace asyncckpt::cli {

/// Times a plain parallel memcpy of every registered tensor (host memory) into a buffer of the
/// same size, whenever the saver placed after it in the hook list is about to save: at
/// after_create_session, at each step the saver's schedule (its SaverOptions) is due, and at
/// end() for a final save. On a shared machine memory bandwidth drifts by 2x within
/// seconds, so a yardstick taken next to each save, not once at the end, is the fair one.
class MemcpyYardstickHook final : public SessionRunHook {
 public:
  /// Allocates and touches the destination buffer (the state's size) up front; InvalidArgument
  /// when the schedule is invalid, Unavailable when the buffer cannot be allocated.
  static Result<std::unique_ptr<MemcpyYardstickHook>> Create(const TensorRegistry* registry,
                                                             const SaverOptions& saver);
  ~MemcpyYardstickHook() override;

  /// Measures at the session's first step, where the saver saves too.
  Status after_create_session(int64_t global_step) override;
  /// Measures when the save schedule is due at this step.
  Status after_run(RunContext& context, const RunValues& values) override;
  /// Measures when no measurement was taken at the last step (the saver's final save).
  Status end(int64_t global_step) override;

  /// Seconds of the memcpy taken just before the save of each step, for the newest
  /// kSaverTotalsWindow steps measured (the saves the saver's totals keep): the hook's memory
  /// stays flat however many saves a run takes.
  const std::map<int64_t, double>& seconds_by_step() const { return seconds_by_step_; }

 private:
  MemcpyYardstickHook(const TensorRegistry* registry, SaveSchedule schedule);
  void Measure(int64_t step);

  const TensorRegistry* const registry_;
  SaveSchedule schedule_;
  std::unique_ptr<uint8_t[]> destination_;
  std::map<int64_t, double> seconds_by_step_;
};

/// Seconds for one plain parallel memcpy (oneTBB, 4 MiB pieces) of every tensor in `registry`
/// into `destination`, which holds at least registry.total_bytes().
double TimeStateMemcpy(const TensorRegistry& registry, uint8_t* destination);

}  // namespace asyncckpt::cli
