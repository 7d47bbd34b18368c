#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"

namespace asyncckpt {

/// The file in a checkpoint directory that names the latest checkpoint of the model.
inline constexpr char kCheckpointStateFileName[] = "checkpoint";
/// The model's checkpoints are "<basename>-<step>"; SaverOptions::basename's default.
inline constexpr char kDefaultBasename[] = "model.ckpt";

/// Which checkpoints retention keeps as its max_to_keep: the newest, or the best by the score
/// each save stored under kRetentionScoreKey (Orbax's best_fn with best_mode "max" or "min").
enum class BestMode {
  /// The newest max_to_keep (TensorFlow's and Orbax's default).
  kNone,
  /// The max_to_keep with the highest scores; a checkpoint without a score is never deleted.
  kMax,
  /// The max_to_keep with the lowest scores; a checkpoint without a score is never deleted.
  kMin,
};

/// The key of a save's user metadata whose value, a finite number as text ("0.25"), is the
/// checkpoint's score for BestMode retention. Stored in the checkpoint's index, so that a later
/// start ranks the checkpoint as the save did.
inline constexpr char kRetentionScoreKey[] = "asyncckpt.retention_score";

/// The contents of a state file (TensorFlow's CheckpointState): paths are relative to the
/// checkpoint directory, oldest first, the last one the latest.
struct CheckpointState {
  /// The latest committed checkpoint, e.g. "model.ckpt-2000".
  std::string model_checkpoint_path;
  /// Every retained checkpoint, oldest first (ends with model_checkpoint_path).
  std::vector<std::string> all_model_checkpoint_paths;
  /// Commit time (seconds since the epoch) of each entry of all_model_checkpoint_paths.
  std::vector<double> all_model_checkpoint_timestamps;
  /// Commit time of the last checkpoint kept by keep_checkpoint_every_n_hours (0 if none).
  double last_preserved_timestamp = 0;
};

/// Reads `dir`/`state_file_name`. NotFound when there is none; Corruption (naming the file and
/// line) when it cannot be parsed.
/// `fs` (borrowed) is read through; null means the POSIX backend.
Result<CheckpointState> GetCheckpointState(
    const std::string& dir, const std::string& state_file_name = kCheckpointStateFileName,
    io::FileSystem* fs = nullptr);

/// The full path of the latest checkpoint named by the state file in `dir` (TensorFlow's
/// latest_checkpoint: the state file only, no directory scan). NotFound saying what is wrong:
/// no directory, no state file, a state file that names nothing, or one naming a checkpoint
/// that does not exist; Corruption (file and line) when the state file does not parse.
/// `fs` (borrowed) is read through; null means the POSIX backend.
Result<std::string> LatestCheckpoint(const std::string& dir,
                                     const std::string& state_file_name = kCheckpointStateFileName,
                                     io::FileSystem* fs = nullptr);

/// The steps of the complete checkpoints "<basename>-<step>" in `dir`, ascending: what a resume
/// may restore. From the state file `state_file_name` when it is healthy (it parses, and every
/// checkpoint of `basename` it names, at least one, is a directory whose index decodes and
/// whose chunks all lie inside its data files); otherwise, as the savers' start-up does, from
/// a scan of `dir` for such complete directories (symlinks are not followed), logged with
/// what was wrong with the state file. Empty when there are none or `dir` does not exist.
/// IOError when `dir` cannot be listed, the state file exists but cannot be read, or a named
/// checkpoint cannot be read. The model's state file is kCheckpointStateFileName; an input
/// pipeline's is InputStateFileName. `fs` (borrowed) is read through; null means POSIX.
Result<std::vector<int64_t>> CommittedCheckpointSteps(
    const std::string& dir, const std::string& basename,
    const std::string& state_file_name = kCheckpointStateFileName, io::FileSystem* fs = nullptr);

/// The checkpoints of one basename that a resume may use, as a saver starting in the directory
/// would find them (FindResumeCheckpoints).
struct ResumeCheckpoints {
  /// The basename they are of.
  std::string basename;
  /// Their steps in save order (the state file's), the one a resume restores last: after a
  /// forced save of a lower step, that step.
  std::vector<int64_t> steps;
  /// The path of the checkpoint a resume restores ("<dir>/<basename>-<steps.back()>").
  std::string latest_path;
  /// Checkpoints passed over, one line each ("<path>: what is wrong"): damaged ones a start
  /// quarantines, and those quarantined before.
  std::vector<std::string> skipped;
  /// Why the state file's list was not used as it is (missing, unparsable, naming what is not
  /// there), or empty.
  std::string state_file_problem;
};

/// The checkpoint a resume would use in `dir`, and the others it may use, without changing
/// anything: the state file's checkpoints of `basename` in save order, less the missing and
/// damaged ones (each chunk's place in the data files is checked, not its bytes), with the
/// complete unlisted ones a saver's start lists again; from the complete directories alone when
/// the state file is missing or does not parse. An empty `basename` is the state file's latest
/// entry's, or "model.ckpt". NotFound, saying why, when there is nothing to resume and nothing
/// damaged (a resume starts afresh); FailedPrecondition naming them when there is nothing to
/// resume but damaged or quarantined checkpoints, or when a checkpoint was written by a newer
/// release; IOError when `dir` or a checkpoint cannot be read. `fs` (borrowed) is read
/// through; null means POSIX.
Result<ResumeCheckpoints> FindResumeCheckpoints(
    const std::string& dir, const std::string& basename = "",
    const std::string& state_file_name = kCheckpointStateFileName, io::FileSystem* fs = nullptr);

}  // namespace asyncckpt
