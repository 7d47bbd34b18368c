// Pairing: the partner's steps, the newest common ones, and the lock that serializes paired
// retention passes in one process (see pairing.h).

#include "src/state/pairing.h"

#include <optional>
#include <vector>

#include "src/state/checkpoint_names.h"
#include "src/state/checkpoint_validator.h"

namespace asyncckpt::state_internal {
namespace {

std::mutex& PairingMutex() {
  static std::mutex mutex;
  return mutex;
}

}  // namespace

std::set<int64_t> StepsNamedBy(const CheckpointState& state, const std::string& basename) {
  std::set<int64_t> steps;
  for (const std::string& name : state.all_model_checkpoint_paths) {
    if (auto step = CheckpointStep(name, basename)) steps.insert(*step);
  }
  return steps;
}

std::set<int64_t> StepsOnDisk(io::FileSystem& fs, const std::string& dir,
                              const std::string& basename) {
  std::set<int64_t> steps;
  std::vector<std::string> names;
  if (!fs.list_dir(dir, &names).ok()) return steps;
  for (const std::string& name : names) {
    const std::optional<int64_t> step = CheckpointStep(name, basename);
    if (step && IndexFileExists(fs, JoinCheckpointPath(dir, name)).ok()) steps.insert(*step);
  }
  return steps;
}

std::set<int64_t> NewestCommonSteps(const std::set<int64_t>& ours, const std::set<int64_t>& theirs,
                                    int count) {
  std::set<int64_t> common;
  for (auto it = ours.rbegin(); it != ours.rend(); ++it) {
    if (count > 0 && common.size() >= static_cast<size_t>(count)) break;
    if (theirs.contains(*it)) common.insert(*it);
  }
  return common;
}

std::unique_lock<std::mutex> LockPairing(bool paired) {
  if (!paired) return {};
  return std::unique_lock<std::mutex>(PairingMutex());
}

}  // namespace asyncckpt::state_internal
