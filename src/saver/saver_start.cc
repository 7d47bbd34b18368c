// StartSaver and AgreeStarted (see saver_start.h).

#include "src/saver/saver_start.h"

#include <utility>

#include "src/saver/coordination.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

namespace {
bool MultiProcess(const SaverOptions& options) {
  return options.coordinator != nullptr && options.coordinator->size() > 1;
}
}  // namespace

Result<SaverStart> StartSaver(const SaverOptions& options, const TensorRegistry& registry,
                              SaverStorage* storage) {
  SaverStart start;
  if (!MultiProcess(options)) {
    ASSIGN_OR_RETURN(start.removed, storage->Start(options));
    return start;
  }
  Coordinator& coordinator = *options.coordinator;
  ASSIGN_OR_RETURN(start.job_token, AgreeOnJobToken(coordinator, [&]() -> Status {
                     ASSIGN_OR_RETURN(start.removed, storage->Start(options));
                     return Status::OK();
                   }));
  const Status attached = coordinator.rank() == 0 ? Status::OK() : storage->Attach(options);
  ASSIGN_OR_RETURN(TensorRegistry written, AgreeOnWriters(coordinator, registry, attached));
  start.written = std::make_unique<TensorRegistry>(std::move(written));
  return start;
}

Status AgreeStarted(const SaverOptions& options, const Status& local) {
  if (!MultiProcess(options)) return local;
  Coordinator& coordinator = *options.coordinator;
  return AgreeOnStatus(coordinator, local);
}

}  // namespace asyncckpt
