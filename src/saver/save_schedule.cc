// SaveSchedule (see save_schedule.h).

#include "src/saver/save_schedule.h"

#include <utility>

#include "src/saver/coordination.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

Result<SaveSchedule> SaveSchedule::Create(const SaverOptions& options) {
  ASSIGN_OR_RETURN(SecondOrStepTimer timer,
                   SecondOrStepTimer::Create(options.save_steps, options.save_secs, options.clock));
  Coordinator* agree_with = nullptr;
  if (options.save_secs && options.coordinator != nullptr && options.coordinator->size() > 1) {
    agree_with = options.coordinator;
  }
  return SaveSchedule(std::move(timer), agree_with);
}

Result<bool> SaveSchedule::due_everywhere(int64_t step) {
  if (agree_with_ == nullptr) return due(step);
  // Only rank 0 reads its clock; what the others' would say does not matter.
  return AgreeOnSaveDue(*agree_with_, agree_with_->rank() == 0 && due(step), step);
}

Status SaveSchedule::agree_on_end(int64_t step) {
  if (agree_with_ == nullptr) return Status::OK();
  return AgreeOnEnd(*agree_with_, step);
}

}  // namespace asyncckpt
