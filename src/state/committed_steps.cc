// The committed and the damaged checkpoints of a directory (see committed_steps.h).

#include "src/state/committed_steps.h"

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>

#include "asyncckpt/state.h"
#include "src/state/checkpoint_names.h"
#include "src/state/durable_directory.h"
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

// Logs `line` as a warning unless it is what was last said about `subject` (a directory and a
// basename): a reader asked again and again (a manager's all_steps before its first save)
// repeats nothing new. One line is kept per subject.
void WarnUnlessRepeated(const std::string& subject, const std::string& line) {
  static std::mutex mu;
  static std::map<std::string, std::string> last_said;
  {
    std::lock_guard lock(mu);
    std::string& last = last_said[subject];
    if (last == line) return;
    last = line;
  }
  LogWarning(line);
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
    } else if (Classify(valid.status()) == Verdict::kNewer) {
      return valid.status();  // no older step is resumed in its place
    } else if (Classify(valid.status()) == Verdict::kUnknown) {
      LogWarning("cannot tell whether " + path +
                 " is complete; not counted: " + valid.status().ToString());
    }
  }
  std::sort(steps.begin(), steps.end());
  if (!steps.empty()) {
    WarnUnlessRepeated(dir + "\n" + basename,
                       problem + "; using the " + std::to_string(steps.size()) + " complete " +
                           basename + " checkpoints found in " + dir + " instead (newest: step " +
                           std::to_string(steps.back()) + ")");
  }
  return steps;
}

namespace {

// One complete checkpoint while the resume list is built.
struct Candidate {
  std::string name;
  int64_t step = 0;
};

// "model.ckpt" from "model.ckpt-200"; empty for a name of another form.
std::string BasenameOfEntry(const std::string& name) {
  const size_t dash = name.rfind('-');
  if (dash == std::string::npos || dash == 0) return "";
  std::string basename = name.substr(0, dash);
  return CheckpointStep(name, basename) ? basename : "";
}

}  // namespace

Result<ResumeCheckpoints> ResolveResumeCheckpoints(io::FileSystem& fs, const std::string& dir,
                                                   const std::string& basename,
                                                   const std::string& state_file_name,
                                                   const CheckpointValidator& validator,
                                                   int max_to_keep, int keep_period) {
  ResumeCheckpoints resume;
  resume.basename = basename;
  const std::string state_path = JoinCheckpointPath(dir, state_file_name);
  std::vector<std::string> names;
  const io::IoStatus listed = fs.list_dir(dir, &names);
  if (listed.error_number() == ENOENT) {
    return Status::NotFound("checkpoint directory " + QuoteForMessage(dir) + " does not exist");
  }
  RETURN_IF_ERROR(ToStatus(listed).WithContext("listing " + QuoteForMessage(dir)));
  std::sort(names.begin(), names.end());
  std::string newer;
  // Validates `name` once: damaged ones are noted, a newer release's refuse the whole answer.
  auto check = [&](const std::string& name, int64_t step) -> Result<bool> {
    const std::string path = JoinCheckpointPath(dir, name);
    const Result<ValidCheckpoint> valid = state_internal::ValidateNamed(validator, path, step);
    switch (Classify(valid.status())) {
      case Verdict::kComplete:
        return true;
      case Verdict::kIncomplete:
        resume.skipped.push_back(path + ": " + valid.status().message());
        return false;
      case Verdict::kNewer:
        newer += (newer.empty() ? "" : "; ") + path + " (" + valid.status().message() + ")";
        return false;
      case Verdict::kUnknown:
        break;
    }
    return valid.status().WithContext("cannot tell whether " + path + " is complete");
  };

  // The state file's list, in its order: what the last successful save wrote.
  std::vector<Candidate> list;
  std::set<std::string> listed_names;
  Result<CheckpointState> read = ReadCheckpointState(fs, dir, state_file_name);
  bool state_usable = false;
  if (read.status().code() == StatusCode::kNotFound) {
    resume.state_file_problem = "there is no state file " + state_path;
  } else if (read.status().code() == StatusCode::kCorruption) {
    resume.state_file_problem = read.status().message();
  } else {
    RETURN_IF_ERROR(read.status());
    state_usable = true;
    for (const std::string& name : read->all_model_checkpoint_paths) {
      const std::optional<int64_t> step = CheckpointStep(name, basename);
      if (!step) continue;
      listed_names.insert(name);
      io::EntryType type = io::EntryType::kNone;
      RETURN_IF_ERROR(ToStatus(fs.entry_type(JoinCheckpointPath(dir, name), &type)));
      if (type != io::EntryType::kDirectory) {
        resume.state_file_problem =
            "state file " + state_path + " names " + name + ", which " +
            (type == io::EntryType::kNone ? std::string("does not exist")
                                          : "is " + DescribeEntryType(type));
        continue;
      }
      ASSIGN_OR_RETURN(const bool complete, check(name, *step));
      if (complete) list.push_back({name, *step});
    }
  }

  // Complete directories the list lacks, listed again as a start lists them: newer than the
  // oldest listed one, or while there is room under max_to_keep, newest first, or kept by
  // keep_period.
  std::vector<Candidate> unlisted;
  for (const std::string& name : names) {
    if (IsQuarantinedCheckpoint(name, basename)) {
      resume.skipped.push_back(JoinCheckpointPath(dir, name) +
                               ": quarantined as damaged by an earlier start");
      continue;
    }
    const std::optional<int64_t> step = CheckpointStep(name, basename);
    if (!step || listed_names.contains(name)) continue;
    io::EntryType type = io::EntryType::kNone;
    if (!fs.entry_type(JoinCheckpointPath(dir, name), &type).ok() ||
        type != io::EntryType::kDirectory) {
      continue;
    }
    ASSIGN_OR_RETURN(const bool complete, check(name, *step));
    if (complete) unlisted.push_back({name, *step});
  }
  if (!newer.empty()) {
    return Status::FailedPrecondition("a newer release of asyncckpt wrote " + newer +
                                      ": a resume refuses to run beside it");
  }
  std::sort(unlisted.begin(), unlisted.end(),
            [](const Candidate& a, const Candidate& b) { return a.step > b.step; });
  std::optional<int64_t> oldest;
  for (const Candidate& c : list) oldest = oldest ? std::min(*oldest, c.step) : c.step;
  const size_t keep = static_cast<size_t>(std::max(max_to_keep, 0));
  std::vector<Candidate> relist;
  for (const Candidate& c : unlisted) {
    if ((oldest && c.step > *oldest) || keep == 0 || list.size() + relist.size() < keep ||
        (keep_period > 0 && c.step % keep_period == 0)) {
      relist.push_back(c);
    }
  }
  if (!relist.empty() && state_usable && resume.state_file_problem.empty()) {
    resume.state_file_problem = "state file " + state_path + " does not list " +
                                relist.front().name + ", which is complete";
  }
  for (auto it = relist.rbegin(); it != relist.rend(); ++it) {
    const auto at = std::find_if(list.begin(), list.end(),
                                 [&](const Candidate& c) { return c.step > it->step; });
    list.insert(at, *it);
  }
  for (const Candidate& c : list) resume.steps.push_back(c.step);
  if (!list.empty()) {
    resume.latest_path = JoinCheckpointPath(dir, list.back().name);
    return resume;
  }

  std::string why = "no " + basename + " checkpoint to resume in " + QuoteForMessage(dir);
  if (!resume.state_file_problem.empty()) why += " (" + resume.state_file_problem + ")";
  if (resume.skipped.empty()) return Status::NotFound(why);
  std::string damaged;
  for (const std::string& line : resume.skipped) damaged += (damaged.empty() ? "" : "; ") + line;
  return Status::FailedPrecondition(why + ", only damaged ones: " + damaged);
}

Result<std::vector<QuarantinedCheckpoint>> ListQuarantinedCheckpoints(io::FileSystem& fs,
                                                                      const std::string& dir) {
  std::vector<QuarantinedCheckpoint> found;
  std::vector<std::string> names;
  const io::IoStatus listed = fs.list_dir(dir, &names);
  if (listed.error_number() == ENOENT) return found;
  RETURN_IF_ERROR(ToStatus(listed).WithContext("listing " + QuoteForMessage(dir)));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const size_t at = name.rfind(state_internal::kCorruptInfix);
    if (at == std::string::npos) continue;
    const std::string basename = BasenameOfEntry(name.substr(0, at));
    if (basename.empty() || !IsQuarantinedCheckpoint(name, basename)) continue;
    const std::string path = JoinCheckpointPath(dir, name);
    io::EntryType type = io::EntryType::kNone;
    RETURN_IF_ERROR(ToStatus(fs.entry_type(path, &type)));
    if (type != io::EntryType::kDirectory) continue;
    found.push_back({name, DirectoryBytes(fs, path)});
  }
  return found;
}

Result<ResumeCheckpoints> FindResumeCheckpoints(const std::string& dir, const std::string& basename,
                                                const std::string& state_file_name,
                                                io::FileSystem* fs) {
  std::unique_ptr<io::FileSystem> posix;
  if (fs == nullptr) fs = (posix = io::NewPosixFileSystem()).get();
  std::string chosen = basename;
  if (chosen.empty()) {
    Result<CheckpointState> read = ReadCheckpointState(*fs, dir, state_file_name);
    if (read.ok()) chosen = BasenameOfEntry(read->model_checkpoint_path);
    if (chosen.empty()) chosen = kDefaultBasename;
  }
  return ResolveResumeCheckpoints(
      *fs, dir, chosen, state_file_name,
      [fs](const std::string& path) { return ValidateCheckpointDirectory(*fs, path); },
      /*max_to_keep=*/0);
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
