#pragma once

// Which checkpoint directories are complete: the validator a CheckpointManager consults, its
// default (IndexFileExists), what its answer means (Classify), and the committed steps a reader
// may trust (ListCommittedSteps), which applies a validator to the state file's list or, when
// that list is broken, to the directory.

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
};

/// Decides whether the directory at `checkpoint_path` is a complete checkpoint. OK with what it
/// holds; NotFound or Corruption when it is incomplete or damaged (start-up quarantines it); any
/// other code when it cannot tell (an I/O error, another format version): such a directory is
/// never removed. Called with the manager's lock held, from the thread calling the manager.
using CheckpointValidator =
    std::function<Result<ValidCheckpoint>(const std::string& checkpoint_path)>;

/// The validator a manager uses when given none: complete when the directory holds a regular
/// file named "index" (wall time 0). The savers inject one that decodes the index and checks
/// every chunk against its data files (ValidateCheckpointDirectory, src/state/committed_steps.h).
Result<ValidCheckpoint> IndexFileExists(io::FileSystem& fs, const std::string& checkpoint_path);

// Shared with the start-up pass (src/state); not for other callers.
namespace state_internal {

/// What a validator's answer means for a directory: complete, known to be incomplete or damaged
/// (start-up quarantines it), or unknown (an I/O error, another format version: never removed).
enum class Verdict { kComplete, kIncomplete, kUnknown };

/// The Verdict of a validator's status: OK is complete, NotFound and Corruption incomplete,
/// anything else unknown.
Verdict Classify(const Status& status);

/// `validator`'s answer for the checkpoint directory `path` named for `step`, with an intact
/// checkpoint whose metadata holds another step turned into Corruption (a misnamed copy is
/// damage, never a checkpoint of that step).
Result<ValidCheckpoint> ValidateNamed(const CheckpointValidator& validator, const std::string& path,
                                      int64_t step);

}  // namespace state_internal

/// What start-up would quarantine, or has quarantined, among the checkpoints of `basename` in
/// `dir`, without changing anything: one line per directory, its path and what is wrong. Every
/// "<basename>-<step>.corrupt-<hex>" directory, and every "<basename>-<step>" real directory
/// that `validator` finds damaged (NotFound, Corruption, or metadata of another step). A
/// directory it cannot tell about is not named. IOError when `dir` cannot be listed; a missing
/// `dir` has none.
Result<std::vector<std::string>> FindDamagedCheckpoints(io::FileSystem& fs, const std::string& dir,
                                                        const std::string& basename,
                                                        const CheckpointValidator& validator);

/// The steps of the committed checkpoints "<basename>-<step>" in `dir`, ascending (the engine
/// of CommittedCheckpointSteps, with an injected validator). From the state file when it is
/// healthy: it parses and names at least one checkpoint of `basename`, and each one it names is
/// a real directory that `validator` finds complete (names of other forms are ignored).
/// Otherwise from the directory: every "<basename>-<step>" real directory that `validator`
/// finds complete; a scan that finds any is logged with what was wrong with the state file.
/// A missing `dir` has none. IOError when `dir` cannot be listed, the state file exists but
/// cannot be read, or a named checkpoint cannot be validated.
Result<std::vector<int64_t>> ListCommittedSteps(io::FileSystem& fs, const std::string& dir,
                                                const std::string& basename,
                                                const std::string& state_file_name,
                                                const CheckpointValidator& validator);

}  // namespace asyncckpt
