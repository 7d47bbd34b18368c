#pragma once

// Where a job of any number of ranks resumes a directory that jobs of other sizes wrote: the
// world size each model checkpoint records, the input checkpoints that form one step's set with
// it, which rank's input position a rank of the new job takes, and the removal of the input
// checkpoints of ranks the job no longer has (docs/distributed.md, "When the world size
// changes"). Nothing here is collective: rank 0 decides, the caller broadcasts.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"

namespace asyncckpt::cli {

/// The input pipeline basename of `rank` in a job of `world_size` ranks: "input.ckpt" for one
/// rank, "input_worker_<rank>.ckpt" for several (InputCheckpointBasename's names).
std::string WorkerInputBasename(uint32_t world_size, uint32_t rank);

/// The step a job resumes and the number of ranks that saved it.
struct ResumePoint {
  /// The step restored.
  int64_t step = 0;
  /// Ranks of the job that saved it (the model checkpoint's world size).
  uint32_t saved_world_size = 1;
};

/// The newest step of `dir` whose model checkpoint (`model_basename`) is committed and, with
/// `with_input`, whose input checkpoints of every rank of the job that saved it (its recorded
/// world size) are committed too; nullopt without one. Input checkpoints of other ranks (a
/// larger job's, left behind) play no part. Errors from listing or opening a checkpoint.
Result<std::optional<ResumePoint>> NewestResumePoint(const std::string& dir,
                                                     const std::string& model_basename,
                                                     bool with_input);

/// Why the model checkpoint of `step` in `dir` is not a resume point: "<name>, saved by W
/// rank(s), has no committed <the input checkpoints of its ranks it lacks>".
std::string WhyNotResumable(const std::string& dir, const std::string& model_basename,
                            int64_t step);

/// "the newest, " + WhyNotResumable of the newest committed model checkpoint in `dir`. Empty
/// when there is no model checkpoint.
std::string WhyNoResumePoint(const std::string& dir, const std::string& model_basename);

/// WhyNotResumable of every committed model checkpoint in `dir` newer than `step`, oldest
/// first: what a resume at `step` skips.
std::vector<std::string> SkippedNewerCheckpoints(const std::string& dir,
                                                 const std::string& model_basename, int64_t step);

/// The world size of the newest committed model checkpoint in `dir`; 0 when there is none.
Result<uint32_t> NewestModelWorldSize(const std::string& dir, const std::string& model_basename);

/// OK unless the newest committed model checkpoint in `dir` records a "seed" in its metadata
/// other than `seed`: then FailedPrecondition naming both (resuming would mix two runs). A
/// directory that cannot be listed or read passes (the session creator reports it).
Status CheckSameSeed(const std::string& dir, const std::string& model_basename, uint64_t seed);

/// The basename whose input checkpoint rank `rank` restores from a step saved by
/// `saved_world_size` ranks: rank `rank % saved_world_size`'s (its own when that is itself).
std::string InputSourceBasename(uint32_t saved_world_size, uint32_t rank);

/// One line of DescribeWorldSizeChange.
struct ChangeLine {
  /// True for what is lost (a warning), false for what is done.
  bool warning = false;
  /// The line, without a level.
  std::string text;
};

/// The lines a job of `world_size` ranks prints when it resumes a step saved by another number
/// of ranks: what each rank restores and what becomes of the gone ranks' input state. Empty
/// when the sizes agree.
std::vector<ChangeLine> DescribeWorldSizeChange(const ResumePoint& point, uint32_t world_size,
                                                bool with_input);

/// Removes the input checkpoints in `dir` of workers a job of `world_size` ranks does not have
/// (input_worker_<r>.ckpt with r >= world_size, or all of them for one rank; input.ckpt for
/// several) whose step has no committed model checkpoint saved by a job that had that worker,
/// each renamed out of the committed namespace first (RemoveDirectoryDurably), and rewrites
/// (or removes, when empty) their state files. Also removes what those workers left behind:
/// their temporaries and ".deleting-" directories, their state files' temporaries, and their
/// state files' locks once nobody holds them and no kept checkpoint of theirs remains. Every
/// operation goes through `fs`. Returns the names removed.
Result<std::vector<std::string>> RemoveOrphanedInputCheckpoints(io::FileSystem& fs,
                                                                const std::string& dir,
                                                                const std::string& model_basename,
                                                                uint32_t world_size);

/// What SetAsideCheckpoints moved.
struct SetAside {
  /// The new directory under the checkpoint directory, "set-aside-<16 hex digits>".
  std::string subdir;
  /// The checkpoint directories moved there, in name order.
  std::vector<std::string> names;
};

/// Moves every checkpoint directory of `model_basename` and of the input pipeline (input.ckpt,
/// input_worker_<k>.ckpt) in `dir` into a new subdirectory, whole and untouched, so that a
/// fresh start neither trains over nor deletes them (their state files stay: a start drops the
/// names they list that are gone). Both directories are synced. Nothing is moved, and no
/// subdirectory made, when there is none.
Result<SetAside> SetAsideCheckpoints(io::FileSystem& fs, const std::string& dir,
                                     const std::string& model_basename);

}  // namespace asyncckpt::cli
