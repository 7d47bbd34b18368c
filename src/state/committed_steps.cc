// The committed and the damaged checkpoints of a directory (see committed_steps.h).

#include "src/state/committed_steps.h"

#include <algorithm>
#include <cerrno>
#include <memory>
#include <optional>

#include "asyncckpt/state.h"
#include "src/state/checkpoint_names.h"
#include "src/state/state_file.h"
#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

using state_internal::Classify;
using state_internal::Verdict;

namespace {

// Why the state file's list of `basename` cannot be used, or empty when it can; *steps gets
// its steps. An error when a named checkpoint cannot be inspected.
Result<std::string> StateFileProblem(io::FileSystem& fs, const std::string& dir,
                                     const std::string& basename,
                                     const std::string& state_file_name,
                                     const CheckpointValidator& validator,
                                     std::vector<int64_t>* steps) {
  const std::string state_path = JoinCheckpointPath(dir, state_file_name);
  Result<CheckpointState> read = ReadCheckpointState(fs, dir, state_file_name);
  if (read.status().code() == StatusCode::kNotFound) return "there is no state file " + state_path;
  if (read.status().code() == StatusCode::kCorruption) return read.status().message();
  RETURN_IF_ERROR(read.status());
  for (const std::string& name : read->all_model_checkpoint_paths) {
    const std::optional<int64_t> step = CheckpointStep(name, basename);
    if (!step) continue;  // not a checkpoint of this basename: nothing to say about it
    const std::string path = JoinCheckpointPath(dir, name);
    io::EntryType type = io::EntryType::kNone;
    RETURN_IF_ERROR(ToStatus(fs.entry_type(path, &type)));
    if (type != io::EntryType::kDirectory) {
      return "state file " + state_path + " names " + name + ", which is " +
             DescribeEntryType(type);
    }
    const Result<ValidCheckpoint> valid = validator(path);
    if (Classify(valid.status()) == Verdict::kIncomplete) {
      return "state file " + state_path + " names " + name + ", which is incomplete (" +
             valid.status().message() + ")";
    }
    RETURN_IF_ERROR(valid.status());
    steps->push_back(*step);
  }
  if (steps->empty()) return "state file " + state_path + " names no checkpoint of " + basename;
  return std::string();
}

}  // namespace

Result<std::vector<std::string>> FindDamagedCheckpoints(io::FileSystem& fs, const std::string& dir,
                                                        const std::string& basename,
                                                        const CheckpointValidator& validator) {
  std::vector<std::string> names;
  std::vector<std::string> damaged;
  const io::IoStatus listed = fs.list_dir(dir, &names);
  if (listed.error_number() == ENOENT) return damaged;
  RETURN_IF_ERROR(ToStatus(listed));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const std::string path = JoinCheckpointPath(dir, name);
    if (IsQuarantinedCheckpoint(name, basename)) {
      damaged.push_back(path + ": quarantined as damaged by an earlier start");
      continue;
    }
    const std::optional<int64_t> step = CheckpointStep(name, basename);
    io::EntryType type = io::EntryType::kNone;
    if (!step || !fs.entry_type(path, &type).ok() || type != io::EntryType::kDirectory) continue;
    const Result<ValidCheckpoint> valid = state_internal::ValidateNamed(validator, path, *step);
    if (Classify(valid.status()) == Verdict::kIncomplete) {
      damaged.push_back(path + ": " + valid.status().message());
    }
  }
  return damaged;
}

Result<std::vector<int64_t>> ListCommittedSteps(io::FileSystem& fs, const std::string& dir,
                                                const std::string& basename,
                                                const std::string& state_file_name,
                                                const CheckpointValidator& validator) {
  const CheckpointValidator check =
      validator ? validator : [&fs](const std::string& path) { return IndexFileExists(fs, path); };
  std::vector<int64_t> steps;
  ASSIGN_OR_RETURN(const std::string problem,
                   StateFileProblem(fs, dir, basename, state_file_name, check, &steps));
  if (problem.empty()) {
    std::sort(steps.begin(), steps.end());
    return steps;
  }
  steps.clear();
  std::vector<std::string> names;
  const io::IoStatus listed = fs.list_dir(dir, &names);
  if (listed.error_number() == ENOENT) return steps;
  RETURN_IF_ERROR(ToStatus(listed));
  for (const std::string& name : names) {
    const std::optional<int64_t> step = CheckpointStep(name, basename);
    if (!step) continue;
    const std::string path = JoinCheckpointPath(dir, name);
    io::EntryType type = io::EntryType::kNone;
    if (!fs.entry_type(path, &type).ok() || type != io::EntryType::kDirectory) continue;
    const Result<ValidCheckpoint> valid = check(path);
    if (valid.ok()) {
      steps.push_back(*step);
    } else if (Classify(valid.status()) == Verdict::kUnknown) {
      LogWarning("cannot tell whether " + path +
                 " is complete; not counted: " + valid.status().ToString());
    }
  }
  std::sort(steps.begin(), steps.end());
  if (!steps.empty()) {
    LogWarning("" + problem + "; using the " + std::to_string(steps.size()) + " complete " +
               basename + " checkpoints found in " + dir + " instead (newest: step " +
               std::to_string(steps.back()) + ")");
  }
  return steps;
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
