// The complete checkpoints of a directory as the format sees them: the savers' validator
// (ValidateCheckpointDirectory, over format::LoadIndexCheckingDataFiles) and the public
// CommittedCheckpointSteps of asyncckpt/state.h, which lists the steps it finds complete.

#include "src/state/committed_steps.h"

#include <exception>
#include <memory>
#include <new>
#include <vector>

#include "asyncckpt/state.h"
#include "src/format/index_file.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

Result<ValidCheckpoint> ValidateCheckpointDirectory(io::FileSystem& fs,
                                                    const std::string& checkpoint_path) {
  try {
    ASSIGN_OR_RETURN(const format::Index index,
                     format::LoadIndexCheckingDataFiles(fs, checkpoint_path));
    return ValidCheckpoint{.wall_time = index.metadata.wall_time, .step = index.metadata.step};
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("out of memory validating checkpoint " + checkpoint_path);
  } catch (const std::exception& e) {
    return Status::Internal("validating checkpoint " + checkpoint_path + ": " + e.what());
  }
}

Result<std::vector<int64_t>> CommittedCheckpointSteps(const std::string& dir,
                                                      const std::string& basename,
                                                      const std::string& state_file_name,
                                                      io::FileSystem* fs) {
  std::unique_ptr<io::FileSystem> posix;
  if (fs == nullptr) fs = (posix = io::NewPosixFileSystem()).get();
  return ListCommittedSteps(*fs, dir, basename, state_file_name, [fs](const std::string& path) {
    return ValidateCheckpointDirectory(*fs, path);
  });
}

}  // namespace asyncckpt
