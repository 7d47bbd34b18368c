#pragma once

// What one save did: the report every saver hands to its listeners and totals, and the
// engine to its caller.

#include <cstdint>
#include <map>
#include <string>

#include "asyncckpt/status.h"

namespace asyncckpt {

/// What one save did. Times in seconds.
struct SaveStats {
  /// The global step saved.
  int64_t step = 0;
  /// The committed checkpoint directory's path; empty when the save failed before its directory
  /// was committed. Set with a failed status when only the state file update failed afterwards.
  std::string path;
  /// OK, or why the save failed; with `path` set, the directory was committed but the state
  /// file was not updated.
  Status status;
  /// Bytes of tensor data.
  uint64_t bytes_raw = 0;
  /// Bytes written to data files.
  uint64_t bytes_stored = 0;
  /// Chunks written, per codec name ("raw", "zstd", "shuffle+zstd").
  std::map<std::string, uint64_t> chunks_by_codec;
  /// zstd level used at the end of the save (the async engine may lower it under load).
  int final_level = 0;
  /// True when the engine stored the rest of the save raw because encoding was the bottleneck.
  bool switched_to_raw = false;
  /// Time the training thread was blocked by this save: everything inside the save call,
  /// planning and a new engine's creation (Checkpointer, when the state outgrew its staging)
  /// included.
  double blocked_seconds = 0;
  /// From the start of the save until it was durable and committed.
  double seconds_to_durable = 0;
  /// Multi-process saves: the rank whose failure failed the save (its error is in `status`);
  /// -1 when the save committed, was not sharded, or no rank is to blame.
  int failed_rank = -1;
};

}  // namespace asyncckpt
