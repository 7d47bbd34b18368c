#pragma once

// The asynchronous engine: turns a snapshot of a tensor registry into a committed checkpoint
// while training goes on. Every saver (the asynchronous hook, the synchronous hook as the
// engine followed by a wait, Checkpointer, the input pipeline hook) writes through it, so a
// checkpoint's bytes do not depend on which of them wrote it.
//
//   Submit (caller's thread): plan chunks -> open the data files (O_DIRECT ones preallocated
//   to their planned extent: io::File::allocate, format::PlannedFileEnds) -> lease staging ->
//   device copies (the caller and the copy crew, copy_crew.h) -> one message per chunk into
//   the graph
//
//   graph (graph.h): encode (unlimited) -> sequencer by chunk id -> place (serial:
//     format::DataFilePlacer; small chunks share packed writes)
//     -> write (async_node: up to queue_depth writes in flight through an io::IoQueue; staging
//        released at each completion)
//     -> sequencer by save id -> commit thread (CommitCheckpoint: fsync data files, index,
//        rename, state file, retention) -> on_done
//
// Several saves may be in flight at once within the staging budget; they commit in the order
// they were submitted (step order). A failure at any node is caught there, recorded as that
// save's status and cancels that save only: its remaining chunks pass through without work,
// its temporary directory is removed, and on_done reports it.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "asyncckpt/compression.h"
#include "asyncckpt/file_system.h"
#include "asyncckpt/save_stats.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"
#include "src/format/writer.h"
#include "src/state/checkpoint_state.h"
#include "src/util/elapsed.h"

namespace asyncckpt {

/// Who this process is among the writers of a multi-process (sharded) checkpoint. The default,
/// world_size 1, is the single-process path, unchanged.
struct ShardingOptions {
  /// This process's rank, 0 <= rank < world_size; rank 0 commits.
  uint32_t rank = 0;
  /// Processes writing each checkpoint; 1 = single process.
  uint32_t world_size = 1;
  /// The same on every rank (agreed at the job's start): names each save's shared temporary
  /// directory, so that every rank writes into the same one.
  std::string job_token;
  /// How long rank 0 waits for every rank's part before failing the save; the other ranks wait
  /// twice this for rank 0's outcome (so that rank 0 finds a missing rank first).
  double timeout_seconds = 300;
};

/// One options struct for the engine; every field has a default.
struct EngineOptions {
  /// Where checkpoints are committed.
  std::string checkpoint_dir;
  /// Checkpoint names are "<basename>-<step>".
  std::string basename = "model.ckpt";
  /// Raw bytes per chunk (rounded down to whole elements).
  uint64_t chunk_bytes = 4ull << 20;
  /// Data files per checkpoint, written concurrently.
  uint32_t num_data_files = 2;
  /// Most writes in flight at once, over every data file and save.
  unsigned queue_depth = 64;
  /// Chunks of fewer stored bytes share packed writes (format::DataFilePlacer); 0 writes every
  /// chunk on its own.
  uint64_t pack_threshold_bytes = 128 << 10;
  /// Codec and starting level; the engine lowers the level when encoding is the bottleneck.
  CompressionOptions compression;
  /// Let the engine lower the level (and at last store raw) when encoding is the bottleneck.
  /// Off only where the level itself is measured (benchmarks/engine_ceiling).
  bool adapt_level = true;
  /// Pinned staging budget; 0 means one full snapshot of the registry.
  uint64_t staging_bytes = 0;
  /// Ask for O_DIRECT data files.
  bool use_o_direct = false;
  /// Snapshot copy threads (the caller and N - 1 helpers), and the background arena's limit
  /// (at most cores - 1 workers); 0 means the machine's cores.
  unsigned background_threads = 0;
  /// Copies from device tensors return once enqueued (stream-ordered mode): one batch per wave,
  /// one region per contiguous run of chunks; the graph waits for the copies before encoding.
  bool stream_ordered = false;
  /// Stream-ordered mode: Submit leaves the compute stream's wait for the copies to the caller
  /// (WaitForCopiesOnComputeStream before the state changes) instead of ordering it at its end.
  bool defer_compute_wait = false;
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
  /// today's path unchanged). The registry then holds only the tensors (and shards) this rank
  /// writes; a tensor registered without global_shape is written as one slice covering all of
  /// it. Every rank's engine writes into "<final>.tmp-<job_token>" (job_token: hex digits) and
  /// commits through src/state/sharded_commit.h; every rank must submit the same saves in the
  /// same order.
  ShardingOptions sharding;
};

/// Whether Submit took the snapshot.
enum class SubmitOutcome {
  /// Copied and handed to the graph: on_done will report it.
  kSubmitted,
  /// Not copied (staging busy, or max_saves_in_flight in flight, and skip_if_busy): no on_done
  /// comes for it.
  kSkipped,
};

/// A snapshot's tensors described, validated and cut into chunks, once per save: PlanSnapshot
/// makes it (a saver that must check the tensors before it commits to a save makes it first),
/// Submit consumes it.
struct SnapshotPlan {
  /// The registry's tensors (data pointers may be device memory: never read through them).
  std::vector<format::HostTensor> tensors;
  /// PlanChunks' jobs; a job's position is its chunk id.
  std::vector<format::ChunkJob> jobs;
  /// Staging one whole snapshot takes (each chunk rounded to staging pages).
  uint64_t staging_bytes = 0;
  /// Staging the largest chunk takes.
  uint64_t largest_chunk_bytes = 0;
};

/// Describes, validates (InvalidArgument naming the tensor, prefixed with `context`) and plans
/// the tensors of `registry` for an engine with `options`. Reads no tensor data.
Result<SnapshotPlan> PlanSnapshot(const TensorRegistry& registry, const EngineOptions& options,
                                  const std::string& context);

/// One save to submit.
struct SubmitRequest {
  /// Its step, wall time and user metadata.
  CheckpointMetadata metadata;
  /// Return kSkipped without copying when staging cannot take the whole snapshot now or
  /// max_saves_in_flight saves are in flight (without it, Submit waits for them). Ignored in a
  /// sharded engine: one rank's skip would fail the save on every rank.
  bool skip_if_busy = false;
  /// Runs once the save is certain, before the first copy (may be empty).
  std::function<void()> before_copy;
  /// The registry's plan, when the caller made it (PlanSnapshot with this engine's options);
  /// empty: Submit makes it.
  std::optional<SnapshotPlan> plan;
  /// When the caller's save began, if before Submit: blocked time and time to durable count
  /// from there (a saver that planned the state or created this engine first).
  std::optional<SteadyClock::time_point> started;
};

/// What Submit did.
struct SubmitResult {
  /// Submitted or skipped.
  SubmitOutcome outcome = SubmitOutcome::kSubmitted;
  /// Time the caller spent in Submit.
  double blocked_seconds = 0;
};

/// The engine. Submit is called from one thread at a time; on_done is called from the commit
/// thread, one save at a time, in submission order.
class Engine {
 public:
  /// Called once per submitted save with its final stats (status OK when committed). Should not
  /// throw: an exception from it is logged and dropped, so that later saves still run.
  using DoneFn = std::function<void(const SaveStats&)>;

  /// `fs`, `manager` and `registry` are borrowed and must outlive the engine. The registry is
  /// read only in Create (to size staging and pick its device) and in Submit, so its tensors may
  /// be replaced between submits (Checkpointer does); a snapshot larger than the staging budget
  /// streams through it.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options, io::FileSystem* fs,
                                                CheckpointManager* manager,
                                                const TensorRegistry* registry, DoneFn on_done);
  /// Waits for every save in flight.
  ~Engine();

  /// Snapshots the registry for `request.metadata.step` and hands it to the graph. Returns once
  /// the state may be modified again (copies done; in stream-ordered mode, copies enqueued).
  /// InvalidArgument (nothing written, no on_done) for tensors or metadata the format cannot
  /// hold; a failure after that is the save's, reported by on_done.
  Result<SubmitResult> Submit(SubmitRequest request);
  /// Blocks until every submitted save is committed or failed and its on_done returned.
  void WaitAll();
  /// Saves submitted and not yet done.
  int64_t in_flight() const;
  /// Most staging bytes in use at once so far.
  uint64_t staging_high_water() const;
  /// The staging budget in bytes.
  uint64_t staging_budget() const;
  /// Buffers allocated outside staging so far (encoded chunks, packs that found no staging).
  uint64_t heap_buffers() const;

  class Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace asyncckpt
