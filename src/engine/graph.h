#pragma once

// The engine's flow graph, from encoded chunk to committed checkpoint:
//
//   encode (unlimited) -> sequencer by chunk -> place (serial: format::DataFilePlacer, packs)
//     -> write (async_node: each write goes to an io::IoQueue of queue_depth; its completion
//        releases the staging and comes back through the gateway)
//     -> sequencer by save -> commit (async_node: hands the save to the commit thread, which
//        runs CommitCheckpoint, or in a multi-process save CommitShard, and then on_done)
//
// No oneTBB worker waits for the disk: writes complete on the queue's threads, and fsync,
// rename, the state file and retention run on the one commit thread, one save at a time, in
// submission order.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/compression.h"
#include "asyncckpt/file_system.h"
#include "asyncckpt/save_stats.h"
#include "asyncckpt/status.h"
#include "src/engine/save_job.h"
#include "src/state/checkpoint_state.h"

namespace asyncckpt {

/// What the graph needs to know of the engine's options.
struct GraphOptions {
  /// Where checkpoints are committed.
  std::string checkpoint_dir;
  /// Codec and starting level.
  CompressionOptions compression;
  /// EngineOptions::adapt_level.
  bool adapt_level = true;
  /// Most writes in flight at once, over every file and save.
  unsigned queue_depth = 64;
  /// Background threads: the arena's workers, and the pace of the level heuristic.
  unsigned threads = 1;
  /// Run the graph's arena at high priority.
  bool high_priority = false;
  /// The staging of the saves (borrowed): packs are charged to it until written.
  StagingPool* staging = nullptr;
  /// Multi-process saves (world_size > 1): this process's rank; the commit runs the sharded
  /// protocol (src/state/sharded_commit.h) instead of CommitCheckpoint.
  uint32_t rank = 0;
  /// Ranks writing each checkpoint; 1: not sharded.
  uint32_t world_size = 1;
  /// How long a sharded commit waits for the other ranks.
  double shard_timeout_seconds = 300;
};

/// The graph. Saves enter through TakeFlightPlace, PutChunks and ReleaseHold, from one thread
/// (Submit's); on_done is called from the commit thread, one save at a time, in the order their
/// flight places were taken.
class SaveGraph {
 public:
  /// Called once per admitted save with its final stats. Should not throw: an exception from
  /// it is logged and dropped.
  using DoneFn = std::function<void(const SaveStats&)>;

  /// `fs` and `manager` are borrowed and must outlive the graph. IOError when the write queue
  /// cannot be created.
  static Result<std::unique_ptr<SaveGraph>> Create(const GraphOptions& options, io::FileSystem* fs,
                                                   CheckpointManager* manager, DoneFn on_done);
  /// Waits for every save, then stops the commit thread and the queue.
  ~SaveGraph();
  SaveGraph(const SaveGraph&) = delete;
  SaveGraph& operator=(const SaveGraph&) = delete;

  /// Counts a new save in flight, waiting while `limit` are (or, with skip_if_busy, returning
  /// false at once); true once counted. The save's pending count must then include every chunk
  /// and the hold that ReleaseHold drops.
  bool TakeFlightPlace(int limit, bool skip_if_busy);
  /// Hands copied chunks to the encoders.
  void PutChunks(std::vector<ChunkPtr> wave);
  /// Drops Submit's hold on `save`: it commits once its last write completed.
  void ReleaseHold(const SavePtr& save);
  /// Blocks until every admitted save is committed or failed and its on_done returned.
  void WaitAll();
  /// Saves admitted and not yet done.
  int64_t in_flight() const;
  /// Buffers allocated outside staging so far (encoded chunks, packs that found no staging).
  uint64_t heap_buffers() const;

  class Impl;

 private:
  explicit SaveGraph(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace asyncckpt
