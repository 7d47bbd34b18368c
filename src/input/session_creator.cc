// CheckpointSessionCreator: restores the model of the newest step a job can resume whole, and
// refuses to start afresh beside checkpoints it would train over.

#include "asyncckpt/session_creator.h"

#include <errno.h>

#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/state.h"
#include "src/format/format.h"
#include "src/saver/saver_storage.h"
#include "src/state/checkpoint_names.h"
#include "src/state/checkpoint_state.h"
#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {
namespace {

// "model.ckpt-4, model.ckpt-5 and model.ckpt-7", shortened past a few names.
std::string Describe(const std::string& basename, const std::set<int64_t>& steps) {
  constexpr size_t kShown = 6;
  std::vector<std::string> names;
  for (int64_t step : steps) {
    if (names.size() == kShown) break;
    names.push_back(format::CheckpointDirName(basename, step));
  }
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) text += i + 1 == names.size() && steps.size() == names.size() ? " and " : ", ";
    text += names[i];
  }
  if (steps.size() > names.size()) {
    text += " ... " + format::CheckpointDirName(basename, *steps.rbegin()) + " (" +
            std::to_string(steps.size()) + " in all)";
  }
  return text;
}

// The checkpoints of a job found in its directory, listed or not.
struct Found {
  std::set<int64_t> model;
  std::set<int64_t> input;
  // Quarantined (damaged) checkpoints of either basename: "<name>.corrupt-<hex>".
  std::vector<std::string> quarantined;

  bool empty() const { return model.empty() && input.empty(); }
  // Anything a fresh start would train over: a checkpoint of a step past the initial one. At a
  // job's start, input checkpoints without any model checkpoint past step 0 are not counted:
  // they resume nothing on their own, and a job killed in its first saves leaves exactly that,
  // as the input's small saves commit ahead of the model's (the crash harness: input.ckpt-0
  // and -1 committed, model.ckpt-0 and -1 still being written). Refusing them wedged every
  // later start of the job. A session re-created after a restore counts them: that job had
  // trained past step 0, and its model checkpoints are gone.
  bool past_step_zero(bool count_input) const {
    return (!model.empty() && *model.rbegin() > 0) ||
           (count_input && !input.empty() && *input.rbegin() > 0);
  }
};

}  // namespace

class CheckpointSessionCreator::Impl {
 public:
  Impl(CheckpointSessionCreatorOptions options, const TensorRegistry* registry)
      : options_(std::move(options)), registry_(registry) {
    fs_ = options_.file_system;
    if (fs_ == nullptr) fs_ = (owned_fs_ = io::NewPosixFileSystem()).get();
  }

  Result<int64_t> CreateSession() {
    const bool first = sessions_ == 0;
    ++sessions_;
    restored_from_.clear();
    std::set<int64_t> damaged;  // steps whose restore found a bad byte, in this call
    for (;;) {
      ASSIGN_OR_RETURN(std::optional<int64_t> step, StepToResume(damaged));
      if (!step) break;
      Result<int64_t> restored = Restore(*step);
      if (restored.status().code() != StatusCode::kCorruption) {
        if (restored.ok()) ++restores_;
        return restored;
      }
      // Start-up checks sizes only: a flipped byte shows here. Resuming the newest good step
      // beats failing every restart on this one.
      damaged.insert(*step);
      QuarantineModel(*step, restored.status());
    }
    if (restores_ == 0 && !first) {
      // Every session so far started afresh, so what is there past step 0 is this job's own,
      // and its model saves are still in flight: start again, nothing to train over.
      LogInfo("no step of " + options_.checkpoint_dir +
              " has both checkpoints committed yet; the session starts again from step 0");
    } else {
      RETURN_IF_ERROR(StartFresh(/*job_start=*/first));
    }
    if (options_.init_fn) {
      RETURN_IF_ERROR(options_.init_fn().WithContext("initialising the state (init_fn)"));
    } else if (!first) {
      return Status::FailedPrecondition(
          options_.checkpoint_dir +
          " has no checkpoint to restore the re-created session from, and without an init_fn "
          "the state cannot go back to step 0");
    }
    return int64_t{0};
  }

  const std::string& restored_from() const { return restored_from_; }

 private:
  bool paired() const { return !options_.input_basename.empty(); }

  // The newest complete step (paired) or the model's latest listed one, passing over the steps
  // in `damaged`; nullopt when there is none.
  Result<std::optional<int64_t>> StepToResume(const std::set<int64_t>& damaged) {
    const std::string& dir = options_.checkpoint_dir;
    if (paired()) {
      if (damaged.empty()) {
        auto complete =
            NewestCompleteStep(dir, options_.model_basename, options_.input_basename, fs_);
        if (!complete.ok()) return complete.status().WithContext("finding the step to resume");
        return *complete;
      }
      // A quarantine that could not be done leaves the damaged step listed: pass over it.
      ASSIGN_OR_RETURN(
          const std::vector<int64_t> model,
          CommittedCheckpointSteps(dir, options_.model_basename, kCheckpointStateFileName, fs_));
      ASSIGN_OR_RETURN(
          const std::vector<int64_t> input,
          CommittedCheckpointSteps(dir, options_.input_basename,
                                   InputStateFileForBasename(options_.input_basename), fs_));
      const std::set<int64_t> input_steps(input.begin(), input.end());
      for (auto it = model.rbegin(); it != model.rend(); ++it) {
        if (input_steps.contains(*it) && !damaged.contains(*it)) return std::optional(*it);
      }
      return std::optional<int64_t>();
    }
    auto state = GetCheckpointState(dir, kCheckpointStateFileName, fs_);
    if (state.status().code() == StatusCode::kNotFound) return std::optional<int64_t>();
    RETURN_IF_ERROR(state.status().WithContext("finding the step to resume"));
    const std::string& latest = state->model_checkpoint_path;
    if (latest.empty()) return std::optional<int64_t>();
    std::optional<int64_t> step = CheckpointStep(latest, options_.model_basename);
    if (!step) {
      return Status::FailedPrecondition(
          JoinCheckpointPath(dir, kCheckpointStateFileName) + " names '" + latest +
          "' as the latest checkpoint, which is not a checkpoint of basename '" +
          options_.model_basename + "'");
    }
    // The latest in save order that is not damaged: the one before it in the list, and so on.
    const auto& listed = state->all_model_checkpoint_paths;
    for (auto it = listed.rbegin(); it != listed.rend(); ++it) {
      step = CheckpointStep(*it, options_.model_basename);
      if (step && !damaged.contains(*step)) return step;
    }
    return std::optional<int64_t>();
  }

  // A checkpoint whose restore found a bad byte: quarantined as start-up does (through this
  // process's saver when it holds the directory), so that the next start does not try it again.
  // When that cannot be done, the failure is logged and the restore falls back all the same.
  void QuarantineModel(int64_t step, const Status& found) {
    const std::string name = format::CheckpointDirName(options_.model_basename, step);
    LogError("restoring " + JoinCheckpointPath(options_.checkpoint_dir, name) +
             " found a bad byte: " + found.message() +
             "; falling back to the newest good checkpoint before it");
    (void)QuarantineFoundDamage(*fs_, options_.checkpoint_dir, kCheckpointStateFileName, name,
                                found.message());
  }

  Result<int64_t> Restore(int64_t step) {
    const std::string path = JoinCheckpointPath(
        options_.checkpoint_dir, format::CheckpointDirName(options_.model_basename, step));
    ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(
                                      path, ReaderOptions{.file_system = options_.file_system}));
    if (reader->metadata().step != step) {
      return Status::Corruption(path + " holds the state of step " +
                                std::to_string(reader->metadata().step) + ", not of step " +
                                std::to_string(step) + " as its name says");
    }
    RETURN_IF_ERROR(reader->restore(*registry_).WithContext("restoring " + path));
    restored_from_ = path;
    std::string said = "restored " + path + " (step " + std::to_string(step) + ")";
    if (paired()) {
      said += "; the input pipeline resumes from " +
              format::CheckpointDirName(options_.input_basename, step);
    }
    LogInfo(said);
    return step;
  }

  // No step to resume: OK to start from step 0, unless that would train over checkpoints past
  // it (`job_start`: the first session of this creator).
  Status StartFresh(bool job_start) {
    ASSIGN_OR_RETURN(Found found, Survey());
    if (!found.quarantined.empty()) {
      std::string names;
      for (const std::string& name : found.quarantined) {
        names += (names.empty() ? "" : ", ") + JoinCheckpointPath(options_.checkpoint_dir, name);
      }
      const std::string what = options_.checkpoint_dir + " has no checkpoint to resume but " +
                               "holds damaged ones, quarantined: " + names;
      if (!options_.allow_fresh_start) {
        return Status::FailedPrecondition(
            what +
            ". Inspect them (asyncckpt verify), restore a good copy, or delete them or "
            "allow a fresh start (allow_fresh_start); see docs/durability.md");
      }
      LogWarning("starting from step 0 as allowed (allow_fresh_start): " + what);
      return Status::OK();
    }
    if (found.past_step_zero(/*count_input=*/!job_start)) {
      const std::string what = options_.checkpoint_dir + " holds " + DescribeFound(found) +
                               " but " + WhatIsMissing(found);
      if (!options_.allow_fresh_start) {
        return Status::FailedPrecondition(
            what +
            "; starting from step 0 would train over them. Repair the state files, or allow "
            "a fresh start (allow_fresh_start)");
      }
      LogWarning("starting from step 0 as allowed (allow_fresh_start): " + what);
    } else if (!found.empty()) {
      LogWarning("starting from step 0: " + options_.checkpoint_dir + " holds only " +
                 DescribeFound(found) + ", no model checkpoint past the initial state");
    }
    return Status::OK();
  }

  // Names the partner the newest model checkpoint lacks: that is the one a user restores.
  std::string WhatIsMissing(const Found& found) const {
    if (!paired())
      return "its state file '" + std::string(kCheckpointStateFileName) + "' names none";
    std::string what =
        "no step with both a model and an input checkpoint listed in their state files";
    if (!found.model.empty()) {
      const int64_t newest = *found.model.rbegin();
      what += " (the newest, " + format::CheckpointDirName(options_.model_basename, newest) +
              ", has no " + format::CheckpointDirName(options_.input_basename, newest) + ")";
    }
    return what;
  }

  std::string DescribeFound(const Found& found) const {
    std::string text;
    if (!found.model.empty()) text = Describe(options_.model_basename, found.model);
    if (!found.input.empty()) {
      if (!text.empty()) text += "; ";
      text += Describe(options_.input_basename, found.input);
    }
    return text;
  }

  // Committed-looking checkpoints of both basenames in the directory, and the model's listed
  // ones (a state file may name a checkpoint that is gone).
  Result<Found> Survey() {
    Found found;
    std::vector<std::string> names;
    const io::IoStatus listed = fs_->list_dir(options_.checkpoint_dir, &names);
    if (!listed.ok() && listed.error_number() != ENOENT) {
      return ToStatus(listed).WithContext("listing " + options_.checkpoint_dir);
    }
    auto state = GetCheckpointState(options_.checkpoint_dir, kCheckpointStateFileName, fs_);
    if (state.ok()) {
      names.insert(names.end(), state->all_model_checkpoint_paths.begin(),
                   state->all_model_checkpoint_paths.end());
    }
    for (const std::string& name : names) {
      if (IsQuarantinedCheckpoint(name, options_.model_basename) ||
          (paired() && IsQuarantinedCheckpoint(name, options_.input_basename))) {
        found.quarantined.push_back(name);
      }
      if (auto step = CheckpointStep(name, options_.model_basename)) found.model.insert(*step);
      if (paired()) {
        if (auto step = CheckpointStep(name, options_.input_basename)) found.input.insert(*step);
      }
    }
    return found;
  }

  const CheckpointSessionCreatorOptions options_;
  const TensorRegistry* const registry_;
  io::FileSystem* fs_ = nullptr;
  std::unique_ptr<io::FileSystem> owned_fs_;
  std::string restored_from_;
  int64_t sessions_ = 0;  // create_session() calls so far
  int64_t restores_ = 0;  // of which restored a checkpoint
};

Result<std::unique_ptr<CheckpointSessionCreator>> CheckpointSessionCreator::Create(
    CheckpointSessionCreatorOptions options, const TensorRegistry* registry) {
  if (registry == nullptr) {
    return Status::InvalidArgument(
        "CheckpointSessionCreator: the tensor registry must not be null");
  }
  if (options.checkpoint_dir.empty()) {
    return Status::InvalidArgument("CheckpointSessionCreator: checkpoint_dir must not be empty");
  }
  RETURN_IF_ERROR(ValidateCheckpointName(options.model_basename)
                      .WithContext("CheckpointSessionCreator: model_basename"));
  if (!options.input_basename.empty()) {
    RETURN_IF_ERROR(ValidateCheckpointName(options.input_basename)
                        .WithContext("CheckpointSessionCreator: input_basename"));
    if (options.input_basename == options.model_basename) {
      return Status::InvalidArgument(
          "CheckpointSessionCreator: input_basename and model_basename are both '" +
          options.model_basename + "'");
    }
  }
  return std::unique_ptr<CheckpointSessionCreator>(
      new CheckpointSessionCreator(std::make_unique<Impl>(std::move(options), registry)));
}

CheckpointSessionCreator::CheckpointSessionCreator(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
CheckpointSessionCreator::~CheckpointSessionCreator() = default;

Result<int64_t> CheckpointSessionCreator::create_session() { return impl_->CreateSession(); }

const std::string& CheckpointSessionCreator::restored_from() const {
  return impl_->restored_from();
}

}  // namespace asyncckpt
