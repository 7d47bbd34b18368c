#pragma once

// Whether one checkpoint directory is complete: the validator a CheckpointManager consults, its
// default (IndexFileExists), the savers' own, which reads the index and sizes the data files
// (ValidateCheckpointDirectory: with CommittedCheckpointSteps, the state unit's only users of the
// format, src/format/index_file.h), and what a validator's answer means (Classify).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"

namespace asyncckpt {

/// What a complete checkpoint says about itself.
struct ValidCheckpoint {
  /// Its commit time (seconds since the epoch), from its metadata.
  double wall_time = 0;
  /// The step its metadata holds; nullopt when the validator does not read it.
  std::optional<int64_t> step;
  /// Its score for best-N retention (kRetentionScoreKey in its metadata); nullopt when it has
  /// none, holds no finite number, or the validator does not read it.
  std::optional<double> score = std::nullopt;
};

/// Decides whether the directory at `checkpoint_path` is a complete checkpoint. OK with what it
/// holds; NotFound or Corruption when it is incomplete or damaged (start-up quarantines it);
/// FailedPrecondition when it is intact but of a format this build cannot read, a newer
/// release's (start-up refuses to run beside it); any other code when it cannot tell (an I/O
/// error): such a directory is never removed. Called with the manager's lock held, from the
/// thread calling the manager.
using CheckpointValidator =
    std::function<Result<ValidCheckpoint>(const std::string& checkpoint_path)>;

/// The validator a manager uses when given none: complete when the directory holds a regular
/// file named "index" (wall time 0). The savers inject one that decodes the index and checks
/// every chunk against its data files (ValidateCheckpointDirectory).
Result<ValidCheckpoint> IndexFileExists(io::FileSystem& fs, const std::string& checkpoint_path);

/// The savers' CheckpointValidator: OK (with the metadata's wall time and step) when
/// `checkpoint_path` holds a regular "index" file of at most format::kMaxIndexBytes that decodes,
/// and every chunk it names lies inside its data files (their sizes, not their bytes, are checked).
/// NotFound or Corruption when it does not; FailedPrecondition for an intact index of another
/// format version or with unknown header flags (a newer release's); IOError when a file cannot be
/// read; ResourceExhausted when the index cannot be held in memory. Never opens anything but the
/// index, never follows a symlinked index.
Result<ValidCheckpoint> ValidateCheckpointDirectory(io::FileSystem& fs,
                                                    const std::string& checkpoint_path);

// Shared with the start-up pass and committed_steps (src/state); not for other callers.
namespace state_internal {

/// What a validator's answer means for a directory: complete, known to be incomplete or damaged
/// (start-up quarantines it), a newer release's (start-up refuses to run: resuming an older step
/// in its place would lose it), or unknown (an I/O error: never removed).
enum class Verdict { kComplete, kIncomplete, kNewer, kUnknown };

/// The Verdict of a validator's status: OK is complete, NotFound and Corruption incomplete,
/// FailedPrecondition newer, anything else unknown.
Verdict Classify(const Status& status);

/// `validator`'s answer for the checkpoint directory `path` named for `step`, with an intact
/// checkpoint whose metadata holds another step turned into Corruption (a misnamed copy is
/// damage, never a checkpoint of that step).
Result<ValidCheckpoint> ValidateNamed(const CheckpointValidator& validator, const std::string& path,
                                      int64_t step);

}  // namespace state_internal

}  // namespace asyncckpt
