#pragma once

// The all-or-nothing commit of a checkpoint that several processes ("ranks") write together,
// with the file system as the only rendezvous: no rank ever waits on another inside a
// collective, so a rank that dies cannot hang the others beyond `timeout_seconds`.
//
//   <final>.tmp-<job_token>/       the shared temporary directory (ShardedTempDirName)
//     data-...                     each rank's data files (the engine numbers them)
//     index.part-<r>               rank r's part index, durable: "rank r is done"
//     index.claimed-<r>            rank r's part once rank 0 took it for the merge
//     failed-<r>                   rank r failed (or gave up waiting); holds its error
//     abort                        rank 0 decided the save fails; holds "<rank>\n<why>"
//
// The protocol (every step through io::FileSystem, so tests can put faults in its way):
//  - Every rank seals (trims, fsyncs) its data files. A failure there, or any failure of the
//    save before it, is published instead of a part (FailShard): rank r != 0 writes failed-<r>,
//    rank 0 writes abort.
//  - Rank r != 0 writes index.part-<r> (tmp + rename, file and directory synced), then polls:
//    abort present -> failed with its text; the temporary directory gone and <final>/index
//    present -> committed. It waits twice timeout_seconds, so that when a rank is missing rank 0
//    (which waits timeout_seconds, from a start that may be a little later) finds and blames it
//    first. At that deadline it withdraws its part by removing it: when that works, rank 0 can
//    no longer commit, and the rank writes failed-<r> and fails ("no commit from rank 0 within
//    N s"); when the part is already gone, rank 0 has claimed it and decides soon, so the rank
//    waits one more timeout for the outcome and then fails.
//  - Rank 0 polls until every part is there (a failed-<r> or the deadline aborts the save),
//    claims each part by renaming it (a rename that finds the part withdrawn aborts), merges
//    them with its own, removes the claimed parts, writes and syncs `index`, and commits with
//    CommitDirectory and manager.RecordCommitted (rank 0 alone writes the state file and
//    applies retention, which never deletes the checkpoint just committed before the next
//    commit: OwnDrop::kAtNextCommit, since the others poll for <final>/index). Any failure
//    writes abort, naming the rank at fault.
// The claim-by-rename makes the commit and a rank's give-up mutually exclusive, so no rank
// reports failure for a checkpoint that rank 0 commits (unless rank 0 stalls between claiming
// and deciding for a whole timeout; that rank then reports a failure it cannot be sure of).
// A failed save's temporary directory stays until the next start (CheckpointManager::Start
// removes "<basename>-<step>.tmp-<hex>"): ranks still polling need its abort file.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"
#include "src/state/checkpoint_state.h"
#include "src/state/commit_checkpoint.h"

namespace asyncckpt {

/// The file rank 0 writes in the shared temporary directory when the save cannot commit.
inline constexpr char kShardAbortFileName[] = "abort";

/// "index.part-00003": rank 3's part index.
std::string ShardPartFileName(uint32_t rank);
/// "failed-00003": rank 3's failure.
std::string ShardFailedFileName(uint32_t rank);
/// "<final_name>.tmp-<job_token>": the temporary directory every rank of a sharded save writes
/// into (a name CheckpointManager::Start removes as a leftover, the token being hex).
std::string ShardedTempDirName(const std::string& final_name, const std::string& job_token);
/// OK when `token` can name a shared temporary directory: 1 to 32 hex digits. InvalidArgument
/// saying so otherwise.
Status ValidateJobToken(std::string_view token);

/// "<basename>.ended-00003.tmp-<job_token>": a file in the checkpoint directory that says rank 3
/// of the job ended its training at the step it holds. A save of a later step stops waiting for
/// that rank at once: it will never send a part. Start-up removes these as leftovers.
std::string ShardEndedFileName(const std::string& basename, uint32_t rank,
                               const std::string& job_token);
/// Whether `name` is a ShardEndedFileName of any rank and job over `basename`.
bool IsShardEndedFileName(std::string_view name, std::string_view basename);
/// Publishes that `rank` ended its training at `step` (before its final save, so that no other
/// rank waits a timeout for it at a later step). Not synced: a crash ends the job anyway.
Status PublishShardEnded(io::FileSystem& fs, const std::string& checkpoint_dir,
                         const std::string& basename, const std::string& job_token, uint32_t rank,
                         int64_t step);
/// Removes every rank's ShardEndedFileName of this job that is there (rank 0, once its own end
/// is over); a failure is logged, and the next start removes what is left.
void RemoveShardEnded(io::FileSystem& fs, const std::string& checkpoint_dir,
                      const std::string& basename, const std::string& job_token,
                      uint32_t world_size);

/// Builds the global index from every rank's part (parts[r] is rank r's encoded part index):
/// the bytes of `index`, or why the parts do not make a checkpoint.
using MergeShardPartsFn =
    std::function<Result<std::vector<uint8_t>>(const std::vector<std::vector<uint8_t>>& parts)>;

/// One rank's share of a sharded save.
struct ShardCommitRequest {
  /// The checkpoint directory (parent of both names).
  std::string checkpoint_dir;
  /// ShardedTempDirName(final_name, job_token).
  std::string tmp_name;
  /// "<basename>-<step>": with the job token of tmp_name, also where to look for a rank that
  /// ended its training before this step (ShardEndedFileName).
  std::string final_name;
  /// This rank; rank 0 commits.
  uint32_t rank = 0;
  /// Ranks writing the checkpoint (>= 1).
  uint32_t world_size = 1;
  /// How long rank 0 waits for the parts (the others wait twice that for the outcome).
  double timeout_seconds = 300;
  /// This rank's data files, trimmed and synced before its part is published.
  std::vector<DataFileToSeal> data_files;
  /// This rank's encoded part index.
  std::vector<uint8_t> part;
  /// The checkpoint's timestamp for the state file (rank 0).
  double wall_time = 0;
  /// Its score for best-N retention (rank 0; every rank's metadata holds the same one).
  std::optional<double> score = std::nullopt;
};

/// How one rank's share ended.
struct ShardCommitResult {
  /// OK when committed (and, on rank 0, recorded); else why, naming the failing rank.
  Status status;
  /// True once the checkpoint is visible under its final name (on rank 0 also with a failed
  /// status when only the state file update, or the sync after the rename, failed).
  bool committed = false;
  /// The rank whose failure failed the save; -1 when committed, or when no rank is to blame
  /// for a failure after the commit (the state file update).
  int failed_rank = -1;
};

/// Seals this rank's data files and publishes its part; then rank 0 merges (with `merge`) and
/// commits, the others wait for the outcome. `manager` is used on rank 0 only. Blocks for up
/// to about timeout_seconds on rank 0, twice that on the others (three times when rank 0
/// claimed the parts and then stalled). Never throws.
ShardCommitResult CommitShard(io::FileSystem& fs, CheckpointManager& manager,
                              ShardCommitRequest request, const MergeShardPartsFn& merge);

/// Publishes that this rank's share failed with `why` (failed-<rank>, or abort on rank 0), so
/// that the others stop waiting; closes the request's files. Returns `why` blaming this rank.
/// Never throws; a failure to publish is logged (the others then time out).
ShardCommitResult FailShard(io::FileSystem& fs, ShardCommitRequest request, const Status& why);

}  // namespace asyncckpt
