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
#include <span>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/save_stats.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"
#include "src/engine/engine_options.h"
#include "src/format/writer.h"
#include "src/state/checkpoint_state.h"
#include "src/util/elapsed.h"

namespace asyncckpt {

/// Whether Submit took the snapshot.
enum class SubmitOutcome {
  /// Copied and handed to the graph: on_done will report it.
  kSubmitted,
  /// Not copied (staging busy, or max_saves_in_flight in flight, and skip_if_busy): no on_done
  /// comes for it.
  kSkipped,
};

/// The pinned staging one snapshot of a state takes, each chunk on whole staging pages.
struct StagingNeed {
  /// The whole snapshot.
  uint64_t snapshot_bytes = 0;
  /// Its largest chunk: no budget below it can stage the state.
  uint64_t largest_chunk_bytes = 0;
};

/// A snapshot's tensors described, validated and cut into chunks, once per save: PlanSnapshot
/// makes it (a saver that must check the tensors before it commits to a save makes it first),
/// Engine::Create sizes staging from it and Submit consumes it.
struct SnapshotPlan {
  /// The registry's tensors (data pointers may be device memory: never read through them).
  std::vector<format::HostTensor> tensors;
  /// PlanChunks' jobs; a job's position is its chunk id.
  std::vector<format::ChunkJob> jobs;
  /// The staging the snapshot takes.
  StagingNeed staging;
};

/// Describes, validates (InvalidArgument naming the tensor, prefixed with `context`) and plans
/// the tensors of `registry` for an engine with `options`. Reads no tensor data.
Result<SnapshotPlan> PlanSnapshot(const TensorRegistry& registry, const EngineOptions& options,
                                  const std::string& context);

/// The staging that the chunks `jobs` take in an engine's pool (PlanSnapshot's rule; a plan made
/// from sizes alone, such as a checkpoint's index, uses it too).
StagingNeed StagingNeedOf(std::span<const format::ChunkJob> jobs);

/// The pinned staging an engine for a state of `need` gets: the one sizing rule of every saver
/// (the hooks, Checkpointer, the input pipeline hook) and of train-sim's memory plan.
/// options.staging_bytes when set; else one snapshot for an asynchronous save, and for a
/// synchronous one a window of kSynchronousStagingBytes the state streams through (at least one
/// chunk, at most one snapshot: its caller waits for the whole save anyway, so a second copy of
/// the state would buy nothing). InvalidArgument naming staging_bytes when it is set below the
/// largest chunk.
Result<uint64_t> StagingBudget(const StagingNeed& need, const SaverOptions& options, SaveMode mode);

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
  /// empty: Submit makes it, once.
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

  /// `fs`, `manager` and `registry` are borrowed and must outlive the engine. `plan` is the
  /// caller's plan of `registry` (PlanSnapshot with `options`), which sizes staging when
  /// options.staging_budget is 0; the registry itself is read only here (to pick the device that
  /// pins staging) and in Submit, so its tensors may be replaced between submits (Checkpointer
  /// does). A snapshot larger than the staging budget streams through it. InvalidArgument for a
  /// sharding the format cannot hold, or staging_bytes below one chunk of `plan`.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options,
                                                const SnapshotPlan& plan, io::FileSystem* fs,
                                                CheckpointManager* manager,
                                                const TensorRegistry* registry, DoneFn on_done);
  /// Waits for every save in flight.
  ~Engine();

  /// Snapshots the registry for `request.metadata.step` and hands it to the graph. Returns once
  /// the state may be modified again (copies done; in stream-ordered mode, copies enqueued).
  /// InvalidArgument (nothing written, no on_done) for tensors or metadata the format cannot
  /// hold; a failure after that is the save's, reported by on_done.
  Result<SubmitResult> Submit(SubmitRequest request);
  /// Blocks until every submitted save is committed or failed and its on_done returned
  /// (durable); retention's removal of what those saves dropped may still be going.
  void WaitSaves();
  /// WaitSaves, then until retention's removals are done too.
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
