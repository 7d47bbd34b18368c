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

#include "asyncckpt/file_system.h"
#include "asyncckpt/save_stats.h"
#include "asyncckpt/status.h"
#include "src/engine/engine_options.h"
#include "src/engine/save_job.h"
#include "src/engine/spare_files.h"
#include "src/state/checkpoint_state.h"

namespace asyncckpt {

/// The graph. Saves enter through TakeFlightPlace, PutChunks and ReleaseHold, from one thread
/// (Submit's); on_done is called from the commit thread, one save at a time, in the order their
/// flight places were taken.
class SaveGraph {
 public:
  /// Called once per admitted save with its final stats. Should not throw: an exception from
  /// it is logged and dropped.
  using DoneFn = std::function<void(const SaveStats&)>;

  /// `options` (the engine's), `staging` (the saves' pool: packs are charged to it until
  /// written), `fs`, `manager` and `spares` are borrowed and must outlive the graph. `threads`:
  /// the arena's workers, and the pace of the level heuristic. `spares` (null: none) learns of each
  /// committed in-memory save's data files and does retention's removals, keeping a spare. IOError
  /// when the write queue cannot be created.
  static Result<std::unique_ptr<SaveGraph>> Create(const EngineOptions& options, unsigned threads,
                                                   StagingPool* staging, io::FileSystem* fs,
                                                   CheckpointManager* manager, SpareFiles* spares,
                                                   DoneFn on_done);
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
  /// Blocks until every admitted save is committed or failed and its on_done returned; the
  /// trees retention renamed for removal may still be going (WaitAll waits for them too).
  void WaitSaves();
  /// WaitSaves, then until retention's removals asked for so far are done.
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
