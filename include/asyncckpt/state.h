#pragma once

#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"

namespace asyncckpt {

/// The file in a checkpoint directory that names the latest checkpoint of the model.
inline constexpr char kCheckpointStateFileName[] = "checkpoint";

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

/// The full path of the latest checkpoint named by the state file in `dir`, or NotFound.
/// `fs` (borrowed) is read through; null means the POSIX backend.
Result<std::string> LatestCheckpoint(const std::string& dir,
                                     const std::string& state_file_name = kCheckpointStateFileName,
                                     io::FileSystem* fs = nullptr);

}  // namespace asyncckpt
