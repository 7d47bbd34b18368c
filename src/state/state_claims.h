#pragma once

// Which state file a basename belongs to. A checkpoint directory may hold several state files
// (the model's `checkpoint`, an input pipeline's `checkpoint_input`, one per worker), each
// listing the checkpoints of its own basenames. A state file claims every basename it lists, so
// that a saver of another state file never adopts, retains or deletes those checkpoints: the
// start-up pass and a manager's construction refuse a basename another state file claims.

#include <map>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"

namespace asyncckpt {

/// One state file's claim on a basename: the state file and the newest checkpoint of the basename
/// it lists.
struct StateFileClaim {
  /// The state file's name in the directory.
  std::string state_file;
  /// A checkpoint of the basename it lists, e.g. "input.ckpt-200".
  std::string checkpoint;
};

/// The basenames the state files of `dir` list, each with the claims of the state files that
/// list it, in state file name order. Every regular file of `dir` whose text begins as a state file
/// does ("model_checkpoint_path: ..." or "all_model_checkpoint_paths: ...") and parses is read;
/// a "<basename>-<step>" entry claims its basename. Locks, temporaries and every other file are
/// left unread beyond their first bytes; a state file that does not parse claims nothing. A
/// missing `dir` has none. IOError when `dir` cannot be listed.
Result<std::map<std::string, std::vector<StateFileClaim>>> FindStateFileClaims(
    io::FileSystem& fs, const std::string& dir);

/// OK unless a state file of `dir` other than `state_file_name` lists checkpoints of `basename`;
/// then FailedPrecondition naming both state files and a checkpoint the other lists, so that a
/// saver never takes another's checkpoints (its retention would delete them). Read-only.
/// IOError when `dir` cannot be listed.
Status CheckBasenameUnclaimed(io::FileSystem& fs, const std::string& dir,
                              const std::string& basename, const std::string& state_file_name);

}  // namespace asyncckpt
