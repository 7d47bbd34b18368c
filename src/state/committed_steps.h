#pragma once

// The checkpoints of one basename in a directory, judged by a validator (checkpoint_validator.h):
// the committed steps a reader may trust (ListCommittedSteps, and the public
// CommittedCheckpointSteps of asyncckpt/state.h over the savers' validator), which trusts the
// state file's list only when every checkpoint it names is complete, and the damaged ones that
// start-up quarantines (FindDamagedCheckpoints), and the checkpoint a resume would use
// (ResolveResumeCheckpoints, and the public FindResumeCheckpoints).

#include <cstdint>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"
#include "asyncckpt/status.h"
#include "src/state/checkpoint_validator.h"

namespace asyncckpt {

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

/// One quarantined checkpoint directory: "<basename>-<step>.corrupt-<hex>".
struct QuarantinedCheckpoint {
  /// Its name in the directory.
  std::string name;
  /// Bytes of its files.
  uint64_t bytes = 0;
};

/// Every quarantined checkpoint directory of `dir`, of any basename, in name order; nothing
/// else (a plain file so named, a symlink, a checkpoint, a temporary) is named. A missing `dir`
/// has none; IOError when it cannot be listed. Read-only: `asyncckpt gc` lists and removes them.
Result<std::vector<QuarantinedCheckpoint>> ListQuarantinedCheckpoints(io::FileSystem& fs,
                                                                      const std::string& dir);

/// FindResumeCheckpoints (asyncckpt/state.h) of `basename` with an injected validator and the
/// saver's max_to_keep, which decides, as at start-up, how many complete unlisted checkpoints
/// are listed again (<= 0: all; a saver with a best_mode passes 0, as start-up relists all),
/// and keep_period (> 0: those of a multiple of it step are listed again too). `basename` must
/// be given.
Result<ResumeCheckpoints> ResolveResumeCheckpoints(io::FileSystem& fs, const std::string& dir,
                                                   const std::string& basename,
                                                   const std::string& state_file_name,
                                                   const CheckpointValidator& validator,
                                                   int max_to_keep, int keep_period = 0);

}  // namespace asyncckpt
