#pragma once

// What an engine is told: the user's SaverOptions, handed down as they were validated where they
// entered the library, and the little that only the engine's owner adds (its staging, its
// priority, this process's part of a multi-process save). The engine (engine.h) and its graph
// (graph.h) both read this one value; neither copies a field of it into options of its own.

#include <cstdint>
#include <string>

#include "asyncckpt/saver_options.h"

namespace asyncckpt {

/// Who this process is among the writers of a multi-process (sharded) checkpoint. The default,
/// world_size 1, is the single-process path, unchanged. How long a rank waits for the others is
/// SaverOptions::coordination_timeout_secs.
struct ShardingOptions {
  /// This process's rank, 0 <= rank < world_size; rank 0 commits.
  uint32_t rank = 0;
  /// Processes writing each checkpoint; 1 = single process.
  uint32_t world_size = 1;
  /// The same on every rank (agreed at the job's start): names each save's shared temporary
  /// directory, so that every rank writes into the same one.
  std::string job_token;
};

/// One options value for the engine and its graph.
struct EngineOptions {
  /// The user's options, as ValidateSaverOptions accepted them: the engine trusts every value and
  /// checks none again. It reads the checkpoint's name and layout (checkpoint_dir, basename,
  /// chunk_bytes, num_data_files, compression, use_o_direct), queue_depth, background_threads
  /// (the copy crew, the graph's arena and the pace of the level heuristic), the CUDA stream
  /// modes (cuda_stream_ordered, cuda_defer_compute_wait) and, in a sharded save,
  /// coordination_timeout_secs (rank 0's wait for every part; the others wait twice that).
  SaverOptions saver;
  /// Pinned staging in bytes, as the owner's StagingBudget gave it; 0: StagingBudget of the plan
  /// Engine::Create is given, for an asynchronous save.
  uint64_t staging_budget = 0;
  /// Chunks of fewer stored bytes share packed writes (format::DataFilePlacer); 0 writes every
  /// chunk on its own.
  uint64_t pack_threshold_bytes = 128 << 10;
  /// Let the engine lower the level (and at last store raw) when encoding is the bottleneck.
  /// Off only where the level itself is measured (benchmarks/engine_ceiling).
  bool adapt_level = true;
  /// Run the graph at high priority: for small saves that must not queue behind a large one
  /// (the input pipeline's state beside the model's), when workers are scarce.
  bool high_priority = false;
  /// Saves submitted and not yet committed (or failed) at most; Submit waits for the oldest to
  /// finish (or skips, with skip_if_busy) beyond that. Staging is released as chunks are
  /// written, so without this bound a commit stage slower than the saves (fsync on a busy
  /// disk) let written-but-uncommitted temporaries pile up without limit: 79 of them, 170 MB,
  /// for a 2 MiB state with max_to_keep 2, found by the crash harness. Two: one committing,
  /// one being written behind it.
  int max_saves_in_flight = 2;
  /// Multi-process saves: this rank's part of a sharded checkpoint (world_size 1: not sharded,
  /// the single-process path unchanged). The registry then holds only the tensors (and shards)
  /// this rank writes; a tensor registered without global_shape is written as one slice covering
  /// all of it. Every rank's engine writes into "<final>.tmp-<job_token>" (job_token: hex digits)
  /// and commits through src/state/sharded_commit.h; every rank must submit the same saves in the
  /// same order.
  ShardingOptions sharding;
};

}  // namespace asyncckpt
