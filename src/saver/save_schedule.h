#pragma once

// When a saver saves: TensorFlow CheckpointSaverHook's rules (SecondOrStepTimer), agreed across
// the processes of a job under save_secs.

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

#include "asyncckpt/coordinator.h"
#include "asyncckpt/saver_options.h"
#include "asyncckpt/status.h"
#include "asyncckpt/timer.h"

namespace asyncckpt {

/// When to save: at the session's start, whenever the step/second timer fires after a step, and
/// at the end when the last step was not saved.
class SaveSchedule {
 public:
  /// Built from validated options.
  static Result<SaveSchedule> Create(const SaverOptions& options);
  /// True when a save is due after the step that made global step `step`, by this process's
  /// clock.
  bool due(int64_t step) const { return timer_.should_trigger_for_step(step); }
  /// Whether a save is due after `step` in every process of the job: due(step) in a single
  /// process, or with save_steps (every rank counts the same steps); under save_secs in a
  /// multi-process job, rank 0's due(step), broadcast (a collective: every rank calls it after
  /// every step, in step order), so that a rank with a skewed clock saves the same steps.
  Result<bool> due_everywhere(int64_t step);
  /// Where due_everywhere is a collective, the end's counterpart of it (AgreeOnEnd): every rank
  /// calls it at its end, so that a rank still training learns at its next step that rank 0
  /// ended, and a rank that ended learns that rank 0 did not. OK where there is nothing to agree.
  Status agree_on_end(int64_t step);
  /// Records a save's attempt at `step`, saved or skipped: the next one is due N steps or
  /// seconds later.
  void mark(int64_t step) { (void)timer_.update_last_triggered_step(step); }
  /// Records that the state of `step` was saved (a skipped save's was not).
  void mark_saved(int64_t step) { last_saved_step_ = step; }
  /// True when the end of the session must still save `step`: its state was not saved.
  bool final_save_needed(int64_t step) const { return last_saved_step_ != step; }
  /// The hooks' set_keep_start_checkpoint: `keep(step)` true leaves out the save at a session's
  /// start at `step`. Null (the default): every start saves.
  void set_keep_start(std::function<bool(int64_t)> keep) { keep_start_ = std::move(keep); }
  /// Whether a session starting at `step` saves it; when not (kept as it is), the step is
  /// marked saved, so that the next save is due N steps or seconds later and end() does not
  /// save it again.
  bool start_save_needed(int64_t step) {
    if (!keep_start_ || !keep_start_(step)) return true;
    mark(step);
    mark_saved(step);
    return false;
  }

 private:
  SaveSchedule(SecondOrStepTimer timer, Coordinator* agree_with)
      : timer_(std::move(timer)), agree_with_(agree_with) {}
  SecondOrStepTimer timer_;
  Coordinator* agree_with_;  // the job's coordinator when the decision must be agreed, or null
  std::optional<int64_t> last_saved_step_;
  std::function<bool(int64_t)> keep_start_;
};

}  // namespace asyncckpt
