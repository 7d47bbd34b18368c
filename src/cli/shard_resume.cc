// Where a job of any number of ranks resumes a directory that jobs of other sizes wrote, and
// the removal of the input checkpoints of ranks the job no longer has.

#include "src/cli/shard_resume.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <utility>

#include "asyncckpt/file_system.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/state.h"
#include "src/format/format.h"
#include "src/saver/saver_storage.h"
#include "src/state/checkpoint_names.h"
#include "src/state/durable_directory.h"
#include "src/state/state_file.h"
#include "src/util/io_status.h"
#include "src/util/status_macros.h"

namespace asyncckpt::cli {

namespace {

constexpr std::string_view kWorkerPrefix = "input_worker_";
constexpr std::string_view kSingleInput = "input.ckpt";

// The world size model checkpoint `step` records, read once per step.
class WorldSizes {
 public:
  WorldSizes(std::string dir, std::string basename)
      : dir_(std::move(dir)), basename_(std::move(basename)) {}

  Result<uint32_t> Of(int64_t step) {
    if (auto it = sizes_.find(step); it != sizes_.end()) return it->second;
    const std::string path = dir_ + "/" + format::CheckpointDirName(basename_, step);
    ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(path));
    const uint32_t size = std::max<uint32_t>(1, reader->world_size());
    sizes_.emplace(step, size);
    return size;
  }

 private:
  std::string dir_, basename_;
  std::map<int64_t, uint32_t> sizes_;
};

// The worker index of an input basename: 0 for input.ckpt (a job of one), k for
// input_worker_<k>.ckpt; nullopt for anything else.
std::optional<uint32_t> WorkerOf(std::string_view basename) {
  if (basename == kSingleInput) return 0;
  if (!basename.starts_with(kWorkerPrefix) || !basename.ends_with(".ckpt")) return std::nullopt;
  const std::string_view digits =
      basename.substr(kWorkerPrefix.size(), basename.size() - kWorkerPrefix.size() - 5);
  if (digits.empty() || digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return static_cast<uint32_t>(std::stoul(std::string(digits)));
}

// Whether `basename` is the input of a worker a job of `world_size` ranks does not have.
bool Orphaned(std::string_view basename, uint32_t world_size) {
  if (basename == kSingleInput) return world_size > 1;
  const std::optional<uint32_t> worker = WorkerOf(basename);
  return worker && (world_size == 1 || *worker >= world_size);
}

// Whether the input checkpoint `basename` of `step` belongs to the set of model step `step`,
// which a job of `saved` ranks wrote.
bool BelongsToStep(std::string_view basename, uint32_t saved) {
  const std::optional<uint32_t> worker = WorkerOf(basename);
  if (!worker) return false;
  return basename == kSingleInput ? saved == 1 : saved > 1 && *worker < saved;
}

// What of the input checkpoints in `dir` belongs to workers a job of `world_size` ranks does
// not have: their committed checkpoint directories by basename (with their steps; a basename
// named by a state file or a lock alone has none), and their leftovers: temporaries and
// directories on their way out, of checkpoints and of state files.
struct Orphans {
  std::map<std::string, std::vector<int64_t>> committed;
  std::vector<std::string> leftovers;
  std::vector<std::string> locks;
};

// The input basename a state-file entry ("checkpoint_input_worker_3", its ".lock", its
// temporary) is of; "" for anything else.
std::string StateFileBasename(std::string_view name) {
  constexpr std::string_view kStatePrefix = "checkpoint_";
  if (!name.starts_with("checkpoint_input")) return "";
  const std::string_view stem = name.substr(0, name.find('.'));
  return std::string(stem.substr(kStatePrefix.size())) + ".ckpt";
}

Result<Orphans> FindOrphans(io::FileSystem& fs, const std::string& dir, uint32_t world_size) {
  std::vector<std::string> names;
  const io::IoStatus listed = fs.list_dir(dir, &names);
  if (!listed.ok()) return ToStatus(listed).WithContext("listing " + dir);
  Orphans orphans;
  for (const std::string& name : names) {
    if (const std::string basename = StateFileBasename(name); !basename.empty()) {
      if (!Orphaned(basename, world_size)) continue;
      const std::string stem = name.substr(0, name.find('.'));
      if (name == stem) {
        orphans.committed[basename];
      } else if (name == stem + ".lock") {
        orphans.locks.push_back(name);
      } else if (state_internal::IsMarkedOf(name, stem, state_internal::kTmpInfix)) {
        orphans.leftovers.push_back(name);
      }
      continue;
    }
    // "<basename>-<step>", or one with ".tmp-<hex>" or ".deleting-<hex>" after it.
    std::string final_name = name;
    for (std::string_view infix : {state_internal::kTmpInfix, state_internal::kDeletingInfix}) {
      const size_t at = name.rfind(infix);
      if (at != std::string::npos &&
          state_internal::IsMarkedOf(name, std::string_view(name).substr(0, at), infix)) {
        final_name = name.substr(0, at);
      }
    }
    const size_t dash = final_name.rfind('-');
    if (dash == std::string::npos) continue;
    const std::string basename = final_name.substr(0, dash);
    const std::optional<int64_t> step = CheckpointStep(final_name, basename);
    if (!step || !Orphaned(basename, world_size)) continue;
    if (final_name == name) {
      orphans.committed[basename].push_back(*step);
    } else {
      orphans.leftovers.push_back(name);
    }
  }
  return orphans;
}

// Keeps in `basename`'s state file only the names still on disk; removes it when none are.
Status RewriteStateFile(io::FileSystem& fs, const std::string& dir, const std::string& basename) {
  const std::string file = InputStateFileForBasename(basename);
  auto state = ReadCheckpointState(fs, dir, file);
  if (state.status().code() == StatusCode::kNotFound) return Status::OK();
  CheckpointState kept;
  if (state.ok()) {
    for (size_t i = 0; i < state->all_model_checkpoint_paths.size(); ++i) {
      const std::string& name = state->all_model_checkpoint_paths[i];
      io::EntryType type = io::EntryType::kNone;
      RETURN_IF_ERROR(ToStatus(fs.entry_type(JoinCheckpointPath(dir, name), &type)));
      if (type != io::EntryType::kDirectory) continue;
      kept.all_model_checkpoint_paths.push_back(name);
      if (i < state->all_model_checkpoint_timestamps.size()) {
        kept.all_model_checkpoint_timestamps.push_back(state->all_model_checkpoint_timestamps[i]);
      }
    }
    if (kept.all_model_checkpoint_timestamps.size() != kept.all_model_checkpoint_paths.size()) {
      kept.all_model_checkpoint_timestamps.clear();
    }
  }
  if (kept.all_model_checkpoint_paths.empty()) {
    return ToStatus(fs.remove_file(JoinCheckpointPath(dir, file)));
  }
  kept.model_checkpoint_path = kept.all_model_checkpoint_paths.back();
  return WriteCheckpointState(fs, dir, kept, file);
}

// Removes the lock file `name` of a state file no worker of this job writes, unless someone
// holds it (a process of another job still running); true when removed.
Result<bool> RemoveFreeLock(io::FileSystem& fs, const std::string& dir, const std::string& name) {
  const std::string path = JoinCheckpointPath(dir, name);
  std::unique_ptr<io::FileLock> lock;
  if (!fs.lock_file(path, &lock).ok()) return false;
  RETURN_IF_ERROR(ToStatus(fs.remove_file(path)));
  return true;
}

}  // namespace

std::string WorkerInputBasename(uint32_t world_size, uint32_t rank) {
  if (world_size <= 1) return std::string(kSingleInput);
  return std::string(kWorkerPrefix) + std::to_string(rank) + ".ckpt";
}

std::string InputSourceBasename(uint32_t saved_world_size, uint32_t rank) {
  const uint32_t saved = std::max<uint32_t>(1, saved_world_size);
  return WorkerInputBasename(saved, rank % saved);
}

namespace {

// The input basenames of the ranks of a job of `saved` ranks that have no committed checkpoint
// of `step`; `inputs` caches each basename's committed steps.
Result<std::vector<std::string>> MissingInputs(const std::string& dir, int64_t step, uint32_t saved,
                                               std::map<std::string, std::set<int64_t>>& inputs) {
  std::vector<std::string> missing;
  for (uint32_t r = 0; r < saved; ++r) {
    const std::string basename = WorkerInputBasename(saved, r);
    auto found = inputs.find(basename);
    if (found == inputs.end()) {
      ASSIGN_OR_RETURN(
          const std::vector<int64_t> steps,
          CommittedCheckpointSteps(dir, basename, InputStateFileForBasename(basename)));
      found = inputs.emplace(basename, std::set<int64_t>(steps.begin(), steps.end())).first;
    }
    if (!found->second.contains(step)) missing.push_back(basename);
  }
  return missing;
}

}  // namespace

Result<std::optional<ResumePoint>> NewestResumePoint(const std::string& dir,
                                                     const std::string& model_basename,
                                                     bool with_input) {
  ASSIGN_OR_RETURN(const std::vector<int64_t> model, CommittedCheckpointSteps(dir, model_basename));
  WorldSizes worlds(dir, model_basename);
  std::map<std::string, std::set<int64_t>> inputs;
  for (auto it = model.rbegin(); it != model.rend(); ++it) {
    ASSIGN_OR_RETURN(const uint32_t saved, worlds.Of(*it));
    if (with_input) {
      ASSIGN_OR_RETURN(const std::vector<std::string> missing,
                       MissingInputs(dir, *it, saved, inputs));
      if (!missing.empty()) continue;
    }
    return std::optional<ResumePoint>(ResumePoint{*it, saved});
  }
  return std::optional<ResumePoint>();
}

std::string WhyNotResumable(const std::string& dir, const std::string& model_basename,
                            int64_t step) {
  auto saved = WorldSizes(dir, model_basename).Of(step);
  if (!saved.ok()) return saved.status().ToString();
  std::map<std::string, std::set<int64_t>> inputs;
  auto missing = MissingInputs(dir, step, *saved, inputs);
  if (!missing.ok()) return missing.status().ToString();
  std::string names;
  for (const std::string& basename : *missing) {
    names += (names.empty() ? "" : ", ") + format::CheckpointDirName(basename, step);
  }
  return format::CheckpointDirName(model_basename, step) + ", saved by " + std::to_string(*saved) +
         " rank(s), has no committed " + names;
}

std::string WhyNoResumePoint(const std::string& dir, const std::string& model_basename) {
  auto model = CommittedCheckpointSteps(dir, model_basename);
  if (!model.ok() || model->empty()) return "";
  return "the newest, " + WhyNotResumable(dir, model_basename, model->back());
}

std::vector<std::string> SkippedNewerCheckpoints(const std::string& dir,
                                                 const std::string& model_basename, int64_t step) {
  std::vector<std::string> skipped;
  auto model = CommittedCheckpointSteps(dir, model_basename);
  if (!model.ok()) return skipped;
  for (int64_t newer : *model) {
    if (newer > step) skipped.push_back(WhyNotResumable(dir, model_basename, newer));
  }
  return skipped;
}

Result<uint32_t> NewestModelWorldSize(const std::string& dir, const std::string& model_basename) {
  ASSIGN_OR_RETURN(const std::vector<int64_t> model, CommittedCheckpointSteps(dir, model_basename));
  if (model.empty()) return uint32_t{0};
  return WorldSizes(dir, model_basename).Of(model.back());
}

Status CheckSameSeed(const std::string& dir, const std::string& model_basename, uint64_t seed) {
  // What cannot be read here is left to the session creator, which says what is wrong.
  auto model = CommittedCheckpointSteps(dir, model_basename);
  if (!model.ok() || model->empty()) return Status::OK();
  const std::string path = dir + "/" + format::CheckpointDirName(model_basename, model->back());
  auto reader = CheckpointReader::Open(path);
  if (!reader.ok()) return Status::OK();
  const auto& user = (*reader)->metadata().user;
  const auto it = user.find("seed");
  if (it == user.end() || it->second == std::to_string(seed)) return Status::OK();
  return Status::FailedPrecondition(
      path + " was saved with --seed " + it->second + " but this job has --seed " +
      std::to_string(seed) + ": resuming would continue another run's training with other " +
      "noise. Give --seed " + it->second + ", or another --checkpoint_dir");
}

std::vector<ChangeLine> DescribeWorldSizeChange(const ResumePoint& point, uint32_t world_size,
                                                bool with_input) {
  const uint32_t saved = point.saved_world_size;
  if (saved == world_size) return {};
  std::vector<ChangeLine> lines;
  const std::string step = std::to_string(point.step);
  lines.push_back({false, "step " + step + " was saved by " + std::to_string(saved) +
                              " rank(s); this job has " + std::to_string(world_size) +
                              ": each rank restores its slice of the model from the whole " +
                              "checkpoint (resharded), which stays as it is"});
  if (!with_input) return lines;
  for (uint32_t r = saved; r < world_size; ++r) {
    lines.push_back(
        {false, "rank " + std::to_string(r) + " has no input state of its own at step " + step +
                    ": it takes rank " + std::to_string(r % saved) + "'s input position (" +
                    InputSourceBasename(saved, r) + "-" + step + ")"});
  }
  if (saved > world_size) {
    std::string gone;
    for (uint32_t r = world_size; r < saved; ++r) {
      gone += (gone.empty() ? "" : ", ") + std::to_string(r);
    }
    lines.push_back({true, "the input positions of rank(s) " + gone +
                               ", which this job does not have, are dropped: no rank resumes " +
                               "them (their input checkpoints are removed with their model " +
                               "checkpoints)"});
  }
  if (world_size == 1 || saved == 1) {
    lines.push_back({false, "rank 0 restores the input position of " +
                                InputSourceBasename(saved, 0) + "-" + step +
                                " and saves its own as " + WorkerInputBasename(world_size, 0)});
  }
  return lines;
}

Result<std::vector<std::string>> RemoveOrphanedInputCheckpoints(io::FileSystem& fs,
                                                                const std::string& dir,
                                                                const std::string& model_basename,
                                                                uint32_t world_size) {
  ASSIGN_OR_RETURN(const Orphans orphans, FindOrphans(fs, dir, world_size));
  std::vector<std::string> removed;
  if (orphans.committed.empty() && orphans.leftovers.empty() && orphans.locks.empty()) {
    return removed;
  }
  ASSIGN_OR_RETURN(const std::vector<int64_t> model_steps,
                   CommittedCheckpointSteps(dir, model_basename));
  const std::set<int64_t> models(model_steps.begin(), model_steps.end());
  WorldSizes worlds(dir, model_basename);
  std::set<std::string> still_used;  // basenames with a checkpoint a restore may still use
  for (const auto& [basename, steps] : orphans.committed) {
    for (int64_t step : steps) {
      if (models.contains(step)) {
        ASSIGN_OR_RETURN(const uint32_t saved, worlds.Of(step));
        if (BelongsToStep(basename, saved)) {  // a whole set a restore may still use
          still_used.insert(basename);
          continue;
        }
      }
      const std::string name = format::CheckpointDirName(basename, step);
      RETURN_IF_ERROR(RemoveDirectoryDurably(fs, dir, name).WithContext("removing " + name));
      removed.push_back(name);
    }
    RETURN_IF_ERROR(RewriteStateFile(fs, dir, basename));
  }
  // What a crash or a removal left of workers this job does not have: nobody else removes it.
  for (const std::string& name : orphans.leftovers) {
    const std::string path = JoinCheckpointPath(dir, name);
    io::EntryType type = io::EntryType::kNone;
    RETURN_IF_ERROR(ToStatus(fs.entry_type(path, &type)));
    if (type == io::EntryType::kDirectory) {
      RETURN_IF_ERROR(ToStatus(fs.remove_tree(path)));
    } else if (type != io::EntryType::kNone) {
      RETURN_IF_ERROR(ToStatus(fs.remove_file(path)));
    }
    removed.push_back(name);
  }
  for (const std::string& name : orphans.locks) {
    if (still_used.contains(StateFileBasename(name))) continue;
    ASSIGN_OR_RETURN(const bool freed, RemoveFreeLock(fs, dir, name));
    if (freed) removed.push_back(name);
  }
  return removed;
}

Result<SetAside> SetAsideCheckpoints(io::FileSystem& fs, const std::string& dir,
                                     const std::string& model_basename) {
  std::vector<std::string> names;
  const io::IoStatus listed = fs.list_dir(dir, &names);
  if (!listed.ok()) return ToStatus(listed).WithContext("listing " + dir);
  std::sort(names.begin(), names.end());
  SetAside moved;
  for (const std::string& name : names) {
    const size_t dash = name.rfind('-');
    if (dash == std::string::npos) continue;
    const std::string basename = name.substr(0, dash);
    if (basename != model_basename && !WorkerOf(basename)) continue;
    if (!CheckpointStep(name, basename)) continue;
    io::EntryType type = io::EntryType::kNone;
    RETURN_IF_ERROR(ToStatus(fs.entry_type(JoinCheckpointPath(dir, name), &type)));
    if (type == io::EntryType::kDirectory) moved.names.push_back(name);
  }
  if (moved.names.empty()) return moved;
  std::random_device random;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%08x%08x", random(), random());
  moved.subdir = std::string("set-aside-") + hex;
  const std::string target = JoinCheckpointPath(dir, moved.subdir);
  RETURN_IF_ERROR(ToStatus(fs.create_dir(target)));
  for (const std::string& name : moved.names) {
    RETURN_IF_ERROR(
        ToStatus(fs.rename(JoinCheckpointPath(dir, name), JoinCheckpointPath(target, name))));
  }
  RETURN_IF_ERROR(ToStatus(fs.sync_dir(target)));
  RETURN_IF_ERROR(ToStatus(fs.sync_dir(dir)));
  return moved;
}

}  // namespace asyncckpt::cli
