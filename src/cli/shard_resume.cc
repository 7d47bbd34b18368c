// Where a job of any number of ranks resumes a directory that jobs of other sizes wrote, and
// the removal of the input checkpoints of ranks the job no longer has.

#include "src/cli/shard_resume.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>
#include <utility>

#include "asyncckpt/file_system.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/state.h"
#include "src/format/format.h"
#include "src/saver/saver_storage.h"
#include "src/state/checkpoint_names.h"
#include "src/state/state_file.h"
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

// The input basenames in `dir` (from checkpoint directories and state files) that a job of
// `world_size` ranks does not have, with the steps of their checkpoint directories.
Result<std::map<std::string, std::vector<int64_t>>> OrphanedInputs(const std::string& dir,
                                                                   uint32_t world_size) {
  std::map<std::string, std::vector<int64_t>> orphans;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("checkpoint_input") && name.find('.') == std::string::npos) {
      const std::string basename = name.substr(std::string_view("checkpoint_").size()) + ".ckpt";
      if (Orphaned(basename, world_size)) orphans[basename];
      continue;
    }
    const size_t dash = name.rfind('-');
    if (dash == std::string::npos) continue;
    const std::string basename = name.substr(0, dash);
    if (!Orphaned(basename, world_size)) continue;
    if (auto step = CheckpointStep(name, basename)) orphans[basename].push_back(*step);
  }
  if (ec) return Status::IOError("cannot list " + dir + ": " + ec.message());
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
      std::error_code ec;
      if (!std::filesystem::is_directory(dir + "/" + name, ec)) continue;
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
    std::error_code ec;
    std::filesystem::remove(dir + "/" + file, ec);
    if (ec) return Status::IOError("cannot remove " + dir + "/" + file + ": " + ec.message());
    return Status::OK();
  }
  kept.model_checkpoint_path = kept.all_model_checkpoint_paths.back();
  return WriteCheckpointState(fs, dir, kept, file);
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

std::string WhyNoResumePoint(const std::string& dir, const std::string& model_basename) {
  auto model = CommittedCheckpointSteps(dir, model_basename);
  if (!model.ok() || model->empty()) return "";
  const int64_t step = model->back();
  auto saved = WorldSizes(dir, model_basename).Of(step);
  if (!saved.ok()) return saved.status().ToString();
  std::map<std::string, std::set<int64_t>> inputs;
  auto missing = MissingInputs(dir, step, *saved, inputs);
  if (!missing.ok()) return missing.status().ToString();
  std::string names;
  for (const std::string& basename : *missing) {
    names += (names.empty() ? "" : ", ") + format::CheckpointDirName(basename, step);
  }
  return "the newest, " + format::CheckpointDirName(model_basename, step) + ", saved by " +
         std::to_string(*saved) + " rank(s), has no committed " + names;
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

std::vector<std::string> DescribeWorldSizeChange(const ResumePoint& point, uint32_t world_size,
                                                 bool with_input) {
  const uint32_t saved = point.saved_world_size;
  if (saved == world_size) return {};
  std::vector<std::string> lines;
  const std::string step = std::to_string(point.step);
  lines.push_back("step " + step + " was saved by " + std::to_string(saved) +
                  " rank(s); this job has " + std::to_string(world_size) +
                  ": each rank restores its slice of the model from the " +
                  "whole checkpoint (resharded)");
  if (!with_input) return lines;
  for (uint32_t r = saved; r < world_size; ++r) {
    lines.push_back("rank " + std::to_string(r) + " has no input state of its own at step " + step +
                    ": it takes rank " + std::to_string(r % saved) + "'s input position (" +
                    InputSourceBasename(saved, r) + "-" + step + ")");
  }
  if (saved > world_size) {
    std::string gone;
    for (uint32_t r = world_size; r < saved; ++r) {
      gone += (gone.empty() ? "" : ", ") + std::to_string(r);
    }
    lines.push_back("WARNING: the input positions of rank(s) " + gone +
                    ", which this job does not have, are dropped: no rank resumes them (their " +
                    "input checkpoints are removed with their model checkpoints)");
  }
  if (world_size == 1 || saved == 1) {
    lines.push_back("rank 0 restores the input position of " + InputSourceBasename(saved, 0) + "-" +
                    step + " and saves its own as " + WorkerInputBasename(world_size, 0));
  }
  return lines;
}

Result<std::vector<std::string>> RemoveOrphanedInputCheckpoints(const std::string& dir,
                                                                const std::string& model_basename,
                                                                uint32_t world_size) {
  ASSIGN_OR_RETURN(const auto orphans, OrphanedInputs(dir, world_size));
  std::vector<std::string> removed;
  if (orphans.empty()) return removed;
  ASSIGN_OR_RETURN(const std::vector<int64_t> model_steps,
                   CommittedCheckpointSteps(dir, model_basename));
  const std::set<int64_t> models(model_steps.begin(), model_steps.end());
  WorldSizes worlds(dir, model_basename);
  auto fs = io::NewPosixFileSystem();
  for (const auto& [basename, steps] : orphans) {
    for (int64_t step : steps) {
      if (models.contains(step)) {
        ASSIGN_OR_RETURN(const uint32_t saved, worlds.Of(step));
        if (BelongsToStep(basename, saved)) continue;  // a whole set a restore may still use
      }
      const std::string name = format::CheckpointDirName(basename, step);
      const std::string doomed = dir + "/" + DeletingDirName(name);
      std::error_code ec;
      std::filesystem::rename(dir + "/" + name, doomed, ec);
      if (!ec) std::filesystem::remove_all(doomed, ec);
      if (ec) return Status::IOError("cannot remove " + dir + "/" + name + ": " + ec.message());
      removed.push_back(name);
    }
    RETURN_IF_ERROR(RewriteStateFile(*fs, dir, basename));
  }
  return removed;
}

}  // namespace asyncckpt::cli
