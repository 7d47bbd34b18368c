#pragma once

// What the saver hooks of a multi-process job agree on, on the training thread, through a
// Coordinator: at begin(), the job's token (after rank 0 alone cleaned up the checkpoint
// directory) and which rank writes each tensor or box; at each step under save_secs, whether a
// save is due (rank 0's clock decides). Nothing here runs during a save: a save's commit agrees
// through the file system (the engine's sharded commit), so that the training thread never
// waits there for another rank.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "asyncckpt/coordinator.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"

namespace asyncckpt {

/// Where one rank's tensor lies in the job's global index space, as the other ranks learn it.
struct TensorPlacement {
  /// The tensor's name.
  std::string name;
  /// Its element type.
  DType dtype = DType::kF32;
  /// Registered with a global_shape (a shard); otherwise a whole tensor, a replica of every
  /// other rank's tensor of that name.
  bool shard = false;
  /// The global tensor's shape (a whole tensor's own shape).
  std::vector<int64_t> global_shape;
  /// The box's first index in each dimension (zeros for a whole tensor).
  std::vector<int64_t> offset;
  /// The box's extent in each dimension (the buffer's shape).
  std::vector<int64_t> extent;
};

/// The placements of a registry's tensors, in the registry's (name) order.
std::vector<TensorPlacement> PlacementsOf(const TensorRegistry& registry);

/// For each of `rank`'s placements (in its order), whether `rank` writes it: a box (or whole
/// tensor) held by several ranks is written by the lowest of them. `all` holds every rank's
/// placements, in rank order. InvalidArgument, naming the tensor and the ranks, when ranks
/// disagree on a tensor's dtype, global shape or whether it is a shard, or when the distinct
/// boxes of a tensor overlap or do not cover it.
Result<std::vector<bool>> WrittenByRank(const std::vector<std::vector<TensorPlacement>>& all,
                                        int rank);

/// Collective, at the start of a job: rank 0 runs `rank0_start` (it locks the directory and
/// removes stale temporaries, before any rank writes there) and makes the job's token (16 hex
/// digits: the suffix of every save's shared temporary directory); every rank gets the token,
/// or rank 0's error, prefixed with "rank 0".
Result<std::string> AgreeOnJobToken(Coordinator& coordinator,
                                    const std::function<Status()>& rank0_start);

/// Collective, after AgreeOnJobToken: every rank sends its start-up status and its registry's
/// placements; every rank gets the registry of what it writes (TensorRefs copied from `local`,
/// buffers borrowed), or the error of the first rank that could not start, naming it, or
/// WrittenByRank's error. Every rank gets the same error, so that no rank goes on alone.
Result<TensorRegistry> AgreeOnWriters(Coordinator& coordinator, const TensorRegistry& local,
                                      const Status& local_status);

/// Collective: OK on every rank when `local` is OK on every rank; otherwise, on every rank, the
/// lowest failing rank's error, prefixed with "rank <r>: ".
Status AgreeOnStatus(Coordinator& coordinator, const Status& local);

/// Collective: rank 0's `due` becomes every rank's, so that every rank saves the same steps
/// whatever its own clock says. FailedPrecondition, naming both steps, when what comes from rank 0
/// is its AgreeOnEnd instead: rank 0 ended its training before this rank's `step`.
Result<bool> AgreeOnSaveDue(Coordinator& coordinator, bool due, int64_t step);

/// Collective, matched with the others' AgreeOnSaveDue or AgreeOnEnd: rank 0 tells every rank
/// that it ended its training at its `step`. OK when every rank ended at the same step;
/// FailedPrecondition on a rank that ended at another step than rank 0, or while rank 0 still
/// trains (what came was a save decision), naming both.
Status AgreeOnEnd(Coordinator& coordinator, int64_t step);

/// For an application's own per-step broadcast from rank 0, matched like AgreeOnSaveDue: OK
/// when `message` (what the broadcast brought) is not rank 0's AgreeOnEnd, else the same
/// FailedPrecondition as AgreeOnSaveDue's, naming rank 0's end and this rank's `step`.
Status CheckNotRankZerosEnd(const Coordinator& coordinator, const std::vector<uint8_t>& message,
                            int64_t step);

}  // namespace asyncckpt
