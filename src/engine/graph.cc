#include "src/engine/graph.h"

#include <oneapi/tbb/enumerable_thread_specific.h>
#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "src/engine/engine_threads.h"
#include "src/format/format.h"
#include "src/state/commit_checkpoint.h"
#include "src/state/retention_score.h"
#include "src/state/sharded_commit.h"
#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

namespace {

using WriteNode = tbb::flow::async_node<ChunkPtr, SavePtr>;
using CommitNode = tbb::flow::async_node<SavePtr, tbb::flow::continue_msg>;

// The arena's slots: one reserved for the pump (engine_threads.h), the rest for oneTBB workers.
// oneTBB lends at most max_allowed_parallelism - 1 workers to all arenas together and prints a
// warning on stderr when one asks for more, which a default background_threads (every core)
// always did.
int ArenaSlots(unsigned threads) {
  const size_t limit =
      tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
  return static_cast<int>(std::clamp<size_t>(limit, 1, std::max(1u, threads)));
}

// One write in flight. Owns what the write reads from, so that its completion releases it.
// Travels through the IoQueue's tag as a raw pointer, adopted again by the completion.
struct WriteRequest {
  SavePtr save;
  StagingLease lease;
  PooledBuffer buffer;
  uint64_t pack_bytes = 0;  // a pack's charge on the staging pool (its chunks' pages)
  int64_t job = -1;         // the chunk written alone; -1 for a pack
  uint32_t file = 0;
  uint64_t offset = 0;
};

// The save's score for best-N retention; Engine::Submit refused one that does not parse.
std::optional<double> ScoreOf(const SaveJob& save) {
  const Result<std::optional<double>> score = RetentionScore(save.metadata.user);
  return score.ok() ? *score : std::nullopt;
}

}  // namespace

class SaveGraph::Impl {
 public:
  Impl(const EngineOptions& options, unsigned threads, StagingPool* staging, io::FileSystem* fs,
       CheckpointManager* manager, SpareFiles* spares, DoneFn on_done)
      : options_(options),
        threads_(threads),
        staging_(staging),
        fs_(fs),
        manager_(manager),
        spares_(spares),
        on_done_(std::move(on_done)),
        // One slot is the pump's: the graph always has a thread of its own, however busy the
        // training job keeps oneTBB's workers.
        arena_(ArenaSlots(threads), 1,
               options.high_priority ? tbb::task_arena::priority::high
                                     : tbb::task_arena::priority::normal) {}

  ~Impl() {
    WaitAll();
    pump_.reset();
    queue_.reset();  // drains: nothing is in flight any more
    committer_.reset();
    remover_.reset();
    arena_.execute([&] {
      commit_.reset();
      save_order_.reset();
      write_.reset();
      place_.reset();
      chunk_order_.reset();
      encode_.reset();
      graph_.reset();
    });
  }

  Status Start() {
    io::IoQueueOptions queue_options;
    queue_options.depth = options_.saver.queue_depth;
    queue_options.on_complete = [this](uint64_t tag, io::IoStatus status) {
      Completed(tag, std::move(status));
    };
    RETURN_IF_ERROR(ToStatus(fs_->new_io_queue(queue_options, &queue_))
                        .WithContext("creating the engine's write queue"));
    remover_ = std::make_unique<RetentionRemover>(
        [this] { spares_ ? spares_->RemoveOrKeep(*manager_) : (void)manager_->RemoveRenamed(); });
    committer_ = std::make_unique<CommitThread>([this](const SavePtr& save) {
      Commit(save);
      commit_->gateway().release_wait();
    });
    arena_.execute([&] { Build(); });
    pump_ = std::make_unique<ArenaPump>([this] { WaitAll(); });
    return Status::OK();
  }

  bool TakeFlightPlace(int limit, bool skip_if_busy) {
    limit = std::max(1, limit);
    std::unique_lock lock(flight_mu_);
    if (skip_if_busy && in_flight_.load() >= limit) return false;
    flight_done_.wait(lock, [&] { return in_flight_.load() < limit; });
    ++in_flight_;
    return true;
  }

  void LeaveFlight() {
    {
      std::lock_guard lock(flight_mu_);
      --in_flight_;
    }
    flight_done_.notify_all();
  }

  void PutChunks(std::vector<ChunkPtr> wave) {
    pending_encode_ += static_cast<int64_t>(wave.size());
    // Put last chunk first: each try_put spawns into this thread's own task pool, which it runs
    // newest first. In order, a thread alone in the arena (the pump, while the job's own
    // parallel_for holds oneTBB's workers) encoded the whole wave, a full snapshot, before chunk
    // 0 reached the sequencer and the first write could start (issue 33).
    EnqueueInGraph([this, wave = std::move(wave)] {
      for (auto it = wave.rbegin(); it != wave.rend(); ++it) encode_->try_put(*it);
    });
    pump_->Kick();
  }

  void ReleaseHold(const SavePtr& save) {
    Settle(save, 1);
    pump_->Kick();
  }

  // oneTBB's graph::wait_for_all writes the graph's own flags unguarded, so the pump and an
  // engine caller must not run it at once; the lock is taken outside the arena, so no worker
  // of the arena ever blocks on it.
  void WaitAll() {
    std::lock_guard lock(wait_all_mu_);
    if (graph_) arena_.execute([&] { graph_->wait_for_all(); });
  }

  // Retention's removals, off the commit thread (engine_threads.h).
  void WaitForRemovals() { remover_->Wait(); }

  int64_t in_flight() const { return in_flight_.load(); }

  uint64_t heap_buffers() const { return buffers_.allocations(); }

 private:
  void Build();
  ChunkPtr Encode(ChunkPtr msg);
  ChunkPtr Place(ChunkPtr msg);
  void Write(const ChunkPtr& msg);
  void SubmitWrite(const SavePtr& save, io::File* file, const format::WriteExtent& extent,
                   const uint8_t* data, WriteRequest owner);
  void Completed(uint64_t tag, io::IoStatus status);
  void Settle(const SavePtr& save, size_t done);
  // A packed chunk's staging pages move to its save's open pack.
  void ChargeOpen(SaveJob& save, uint64_t pages) {
    staging_->charge(pages, &save.open_pack_charge);
  }
  // An open pack closed: its charge stays until it is written, now also for its own save.
  void CloseCharge(SaveJob& save, uint64_t pages) {
    staging_->settle_open(pages, &save.open_pack_charge);
  }
  void OpenPack(SaveJob& save, PackBuffer& pack);
  // A pack written, or dropped with its failed save.
  void Uncharge(uint64_t pages) { staging_->uncharge(pages); }
  // A failed save's open packs are never written.
  void DropOpenCharges(SaveJob& save) {
    uint64_t open = 0;
    for (uint64_t& charge : save.pack_charges) open += std::exchange(charge, 0);
    staging_->settle_open(open, &save.open_pack_charge);
    staging_->uncharge(open);
  }
  void Commit(const SavePtr& save);
  bool CommitFiles(SaveJob& save);
  bool CommitShardFiles(SaveJob& save);
  Result<std::vector<uint8_t>> EncodePart(const SaveJob& save) const;
  Result<std::vector<uint8_t>> MergeParts(const std::string& final_name,
                                          const std::vector<std::vector<uint8_t>>& parts) const;
  bool sharded() const { return options_.sharding.world_size > 1; }
  void Report(const SaveJob& save, bool committed);

  // Messages from outside the arena enter through enqueued tasks rather than arena_.execute:
  // a try_put inside execute spawns the node's task into the caller's own slot, which nobody
  // runs when the arena has no worker at that moment while the caller blocks on staging that
  // only that task would free. Enqueued work always gets a worker (oneTBB's mandatory
  // concurrency). reserve_wait keeps wait_for_all from returning before the task ran.
  template <typename Fn>
  void EnqueueInGraph(Fn&& fn) {
    graph_->reserve_wait();
    arena_.enqueue([this, fn = std::forward<Fn>(fn)] {
      fn();
      graph_->release_wait();
    });
  }

  const EngineOptions& options_;  // the engine's, which outlives the graph
  const unsigned threads_;
  StagingPool* const staging_;
  io::FileSystem* const fs_;
  CheckpointManager* const manager_;
  SpareFiles* const spares_;  // null: sharded, or the graph of a test
  const DoneFn on_done_;
  tbb::task_arena arena_;
  BufferPool buffers_;
  std::unique_ptr<io::IoQueue> queue_;
  std::unique_ptr<CommitThread> committer_;
  std::unique_ptr<ArenaPump> pump_;
  std::unique_ptr<RetentionRemover> remover_;
  tbb::enumerable_thread_specific<codec::Scratch> scratch_;
  std::atomic<int64_t> in_flight_{0};  // changed under flight_mu_, read anywhere
  std::mutex flight_mu_;
  std::mutex wait_all_mu_;               // one graph::wait_for_all at a time (WaitAll)
  std::condition_variable flight_done_;  // a save left the flight
  // Chunks handed to the encoders and not yet encoded, and chunks placed or writes submitted
  // and not yet done: together they tell when encoding is the bottleneck.
  std::atomic<int64_t> pending_encode_{0};
  std::atomic<int64_t> pending_write_{0};
  std::unique_ptr<tbb::flow::graph> graph_;
  std::unique_ptr<tbb::flow::function_node<ChunkPtr, ChunkPtr>> encode_;
  std::unique_ptr<tbb::flow::sequencer_node<ChunkPtr>> chunk_order_;
  std::unique_ptr<tbb::flow::function_node<ChunkPtr, ChunkPtr>> place_;
  std::unique_ptr<WriteNode> write_;
  std::unique_ptr<tbb::flow::sequencer_node<SavePtr>> save_order_;
  std::unique_ptr<CommitNode> commit_;
};

void SaveGraph::Impl::Build() {
  using namespace tbb::flow;
  graph_ = std::make_unique<graph>();
  encode_ = std::make_unique<function_node<ChunkPtr, ChunkPtr>>(
      *graph_, unlimited, [this](ChunkPtr msg) { return Encode(std::move(msg)); });
  chunk_order_ = std::make_unique<sequencer_node<ChunkPtr>>(
      *graph_, [](const ChunkPtr& msg) -> size_t { return msg->seq; });
  place_ = std::make_unique<function_node<ChunkPtr, ChunkPtr>>(
      *graph_, serial, [this](ChunkPtr msg) { return Place(std::move(msg)); });
  write_ = std::make_unique<WriteNode>(
      *graph_, unlimited, [this](const ChunkPtr& msg, WriteNode::gateway_type&) { Write(msg); });
  save_order_ = std::make_unique<sequencer_node<SavePtr>>(
      *graph_, [](const SavePtr& save) -> size_t { return save->id; });
  commit_ = std::make_unique<CommitNode>(
      *graph_, serial, [this](const SavePtr& save, CommitNode::gateway_type& gateway) {
        gateway.reserve_wait();  // released by the commit thread once on_done returned
        committer_->Push(save);
      });
  make_edge(*encode_, *chunk_order_);
  make_edge(*chunk_order_, *place_);
  make_edge(*place_, *write_);
  make_edge(*write_, *save_order_);
  make_edge(*save_order_, *commit_);
}

ChunkPtr SaveGraph::Impl::Encode(ChunkPtr msg) {
  SaveJob& save = *msg->save;
  Guarded(save, "encode", [&] {
    if (msg->fence) {
      // Also when the save failed: the lease returns to the pool with this message, and no copy
      // may still be landing in it then.
      Status copied = msg->fence->wait();
      msg->fence.reset();
      if (!copied.ok()) return save.Fail(copied.WithContext(ChunkContext(save, msg->job)));
    }
    if (save.failed) return;
    if (options_.saver.compression.kind != CompressionKind::kNone && options_.adapt_level) {
      // Encoders are the bottleneck when the writers have nothing to do while chunks queue up
      // for encoding: then a cheaper level (and at last raw) finishes the save sooner.
      const int64_t backlog = 2 * static_cast<int64_t>(threads_);
      save.MaybeLowerLevel(2 * threads_,
                           pending_write_.load() == 0 && pending_encode_.load() > backlog);
    }
    const CompressionOptions compression = save.Compression(options_.saver.compression);
    const auto& job = save.jobs[msg->job];
    const size_t elem = DTypeSize(save.tensors[job.tensor].dtype);
    std::span<const uint8_t> raw(msg->lease.data(), job.length);
    codec::Scratch& scratch = scratch_.local();
    Result<codec::EncodedChunk> encoded = [&]() -> Result<codec::EncodedChunk> {
      if (compression.kind == CompressionKind::kNone) {
        return codec::Encode(raw, elem, compression, scratch);
      }
      msg->out = buffers_.get(job.length);
      return codec::Encode(raw, elem, compression, scratch,
                           std::span<uint8_t>(msg->out.data(), msg->out.capacity()));
    }();
    if (!encoded.ok()) return save.Fail(encoded.status().WithContext(ChunkContext(save, msg->job)));
    msg->encoded = *encoded;
    if (msg->encoded.codec == codec::Codec::kRaw) {
      msg->out.reset();
      msg->encoded.stored = raw;  // written straight from staging
    }
    save.bytes_stored += msg->encoded.stored.size();
    ++save.codec_counts[static_cast<size_t>(msg->encoded.codec)];
  });
  --pending_encode_;
  return msg;
}

ChunkPtr SaveGraph::Impl::Place(ChunkPtr msg) {
  // Counted from here, not from the end of encode: chunks that wait in the sequencer for an
  // earlier one are waiting for the encoders, not for the writers.
  ++pending_write_;
  SaveJob& save = *msg->save;
  Guarded(save, "place", [&] {
    if (save.failed) return;
    const auto& job = save.jobs[msg->job];
    const std::span<const uint8_t> stored = msg->encoded.stored;
    format::ChunkPlacement& placement = msg->placement;
    placement = save.placer->Place(job.file_index, stored.size());
    PackBuffer& pack = save.packs[job.file_index];
    uint64_t& charge = save.pack_charges[job.file_index];
    if (placement.closed_pack) {
      CloseCharge(save, charge);
      msg->packs.push_back({*placement.closed_pack, std::move(pack), std::exchange(charge, 0)});
    }
    if (placement.packed) {
      const uint64_t pages = StagingPool::RoundUp(job.length);
      ChargeOpen(save, pages);  // before the lease goes: never neither nor both
      charge += pages;
      if (pack.data() == nullptr) OpenPack(save, pack);
      std::memcpy(pack.data() + (placement.offset - placement.pack_offset), stored.data(),
                  stored.size());
      // Copied: the staging is free for the next chunks (holding it until the pack is written
      // would tie a page of staging to every small chunk).
      msg->lease.reset();
      msg->out.reset();
    }
    save.entries[msg->job] =
        format::ChunkEntry{job.offset, job.file_index,     placement.offset, stored.size(),
                           job.length, msg->encoded.codec, msg->encoded.xxh3};
  });
  Guarded(save, "place", [&] {
    if (++save.chunks_placed != save.jobs.size()) return;
    if (!save.failed) {
      for (const format::WriteExtent& extent : save.placer->Finish()) {
        CloseCharge(save, save.pack_charges[extent.file]);
        msg->packs.push_back({extent, std::move(save.packs[extent.file]),
                              std::exchange(save.pack_charges[extent.file], 0)});
      }
    }
  });
  if (save.chunks_placed == save.jobs.size()) DropOpenCharges(save);  // a failed save's packs
  return msg;
}

// A pack's memory comes from the staging region when a piece is free: its chunks' pages are
// charged to staging until it is written, so a pack from elsewhere would be memory beyond the
// budget, and closed packs queue behind the writers by the hundred. The heap is the fallback,
// bounded by those charges. This save's open packs stay until its later chunks close them, so
// they may take staging only while the gaps they leave still hold its longest chunk; else
// Submit could wait for them forever.
void SaveGraph::Impl::OpenPack(SaveJob& save, PackBuffer& pack) {
  uint64_t open = 1;
  for (const PackBuffer& other : save.packs) open += other.staged.data() != nullptr ? 1 : 0;
  const uint64_t budget = staging_->budget();
  const uint64_t taken = open * format::kPackBytes;
  if (taken < budget && (budget - taken) / (open + 1) >= save.max_job_pages) {
    pack.staged = staging_->take_charged(format::kPackBytes);
  }
  if (pack.data() == nullptr) pack.heap = buffers_.get(format::kPackBytes);
}

void SaveGraph::Impl::Write(const ChunkPtr& msg) {
  SaveJob& save = *msg->save;
  Guarded(save, "write", [&] {
    for (PackWrite& pack : msg->packs) {
      if (save.failed) break;
      uint8_t* data = pack.buffer.data();
      std::memset(data + pack.extent.bytes, 0, pack.extent.padded_bytes - pack.extent.bytes);
      WriteRequest owner;
      owner.lease = std::move(pack.buffer.staged);
      owner.buffer = std::move(pack.buffer.heap);
      owner.pack_bytes = std::exchange(pack.charge, 0);
      SubmitWrite(msg->save, save.files[pack.extent.file].get(), pack.extent, data,
                  std::move(owner));
    }
    if (save.failed) return;
    if (const auto& own = msg->placement.own_write) {
      // Whole pages from a page-aligned buffer under O_DIRECT; the padding is zeroed, never
      // stale state.
      uint8_t* data = msg->out.data() != nullptr ? msg->out.data() : msg->lease.data();
      std::memset(data + own->bytes, 0, own->padded_bytes - own->bytes);
      WriteRequest owner;
      owner.lease = std::move(msg->lease);
      owner.buffer = std::move(msg->out);
      owner.job = static_cast<int64_t>(msg->job);
      SubmitWrite(msg->save, save.files[own->file].get(), *own, data, std::move(owner));
    }
  });
  for (PackWrite& pack : msg->packs) Uncharge(pack.charge);  // not written (0 when written)
  msg->packs.clear();
  msg->lease.reset();
  msg->out.reset();
  --pending_write_;
  Settle(msg->save, 1);
}

void SaveGraph::Impl::SubmitWrite(const SavePtr& save, io::File* file,
                                  const format::WriteExtent& extent, const uint8_t* data,
                                  WriteRequest owner) {
  owner.save = save;
  owner.file = extent.file;
  owner.offset = extent.offset;
  ++save->pending;
  ++pending_write_;
  write_->gateway().reserve_wait();  // released by the completion
  auto request = std::make_unique<WriteRequest>(std::move(owner));
  const io::WriteOp op{file, extent.offset, data, static_cast<size_t>(extent.padded_bytes)};
  try {
    queue_->submit_write(op, reinterpret_cast<uint64_t>(request.get()));
  } catch (...) {
    // Not queued: undo the counts (the chunk's own hold keeps the save from settling here).
    Uncharge(request->pack_bytes);
    --save->pending;
    --pending_write_;
    write_->gateway().release_wait();
    throw;
  }
  (void)request.release();  // owned by the queue's tag until Completed adopts it
}

// On one of the queue's threads.
void SaveGraph::Impl::Completed(uint64_t tag, io::IoStatus status) {
  std::unique_ptr<WriteRequest> request(reinterpret_cast<WriteRequest*>(tag));
  SavePtr save = std::move(request->save);
  if (!status.ok()) {
    Guarded(*save, "write", [&] {
      const std::string what = request->job >= 0
                                   ? ChunkContext(*save, static_cast<uint32_t>(request->job))
                                   : save->final_name + ": packed chunks at offset " +
                                         std::to_string(request->offset) + " of data file " +
                                         std::to_string(request->file);
      save->Fail(ToStatus(status).WithContext(what));
    });
  }
  Uncharge(request->pack_bytes);
  request.reset();  // the staging and buffers it wrote from are free now
  --pending_write_;
  Settle(save, 1);
  write_->gateway().release_wait();
}

void SaveGraph::Impl::Settle(const SavePtr& save, size_t done) {
  if (save->pending.fetch_sub(done) == done) write_->gateway().try_put(save);
}

// On the commit thread.
void SaveGraph::Impl::Commit(const SavePtr& save) {
  bool committed = false;
  Guarded(*save, "commit",
          [&] { committed = sharded() ? CommitShardFiles(*save) : CommitFiles(*save); });
  if (!committed) {
    save->files.clear();
    // The shared temporary directory holds the other ranks' files and this save's abort or
    // failed-<rank>, which they read: it stays until the next start.
    if (!sharded()) RemoveFailedSave(*fs_, options_.saver.checkpoint_dir, save->tmp_name);
  }
  Report(*save, committed);
  // Reported durable first: retention only renamed what it dropped (the crash-safe step).
  if (committed && !sharded() && manager_->HasRenamed()) remover_->Ask();
  LeaveFlight();
}

bool SaveGraph::Impl::CommitFiles(SaveJob& save) {
  if (save.failed) return false;
  Result<format::Index> index = format::AssembleIndex(
      save.tensors, save.metadata, save.placer->num_files(), save.jobs, save.entries);
  if (!index.ok()) {
    save.Fail(index.status().WithContext(save.final_name));
    return false;
  }
  const std::vector<uint8_t> index_bytes = format::EncodeIndex(*index);
  CommitRequest request{.checkpoint_dir = options_.saver.checkpoint_dir,
                        .tmp_name = save.tmp_name,
                        .final_name = save.final_name,
                        .data_files = {},
                        .index_name = format::kIndexFileName,
                        .index_bytes = index_bytes,
                        .wall_time = save.metadata.wall_time,
                        .score = ScoreOf(save)};
  if (spares_ && !save.files.empty() && save.files[0]->in_memory()) {
    spares_->NoteSave(static_cast<uint32_t>(save.files.size()));
  }
  for (uint32_t i = 0; i < save.files.size(); ++i) {
    request.data_files.push_back(
        {std::move(save.files[i]), save.placer->logical_end(i), save.FileBytes(i)});
  }
  save.files.clear();
  CommitResult result = CommitCheckpoint(*fs_, *manager_, std::move(request));
  if (!result.status.ok()) save.Fail(result.status);
  return result.committed;
}

// This rank's part of a sharded index: its slices, with the data files numbered globally
// (rank r's file i is r * F + i of world_size * F).
Result<std::vector<uint8_t>> SaveGraph::Impl::EncodePart(const SaveJob& save) const {
  const uint32_t files = save.placer->num_files();
  ASSIGN_OR_RETURN(format::Index part, format::AssembleIndex(save.tensors, save.metadata, files,
                                                             save.jobs, save.entries));
  part.sharded = true;
  part.world_size = options_.sharding.world_size;
  part.num_data_files = files * options_.sharding.world_size;
  for (size_t t = 0; t < part.tensors.size(); ++t) {
    format::TensorEntry& entry = part.tensors[t];
    entry.global_shape = save.global_shapes[t];
    entry.box_offset = save.box_offsets[t];
    entry.writer_rank = options_.sharding.rank;
    for (format::ChunkEntry& chunk : entry.chunks)
      chunk.file_index += options_.sharding.rank * files;
  }
  return format::EncodeIndex(part);
}

// On rank 0's commit thread: every rank's part, checked, as one global index.
Result<std::vector<uint8_t>> SaveGraph::Impl::MergeParts(
    const std::string& final_name, const std::vector<std::vector<uint8_t>>& parts) const {
  std::vector<format::Index> indexes;
  indexes.reserve(parts.size());
  for (uint32_t r = 0; r < parts.size(); ++r) {
    ASSIGN_OR_RETURN(format::Index part,
                     format::ParseIndexPart(parts[r], final_name + "/" + ShardPartFileName(r)));
    indexes.push_back(std::move(part));
  }
  ASSIGN_OR_RETURN(format::Index merged,
                   format::MergeShardedParts(std::move(indexes), options_.sharding.world_size));
  return format::EncodeIndex(merged);
}

bool SaveGraph::Impl::CommitShardFiles(SaveJob& save) {
  ShardCommitRequest request{.checkpoint_dir = options_.saver.checkpoint_dir,
                             .tmp_name = save.tmp_name,
                             .final_name = save.final_name,
                             .rank = options_.sharding.rank,
                             .world_size = options_.sharding.world_size,
                             .timeout_seconds = options_.saver.coordination_timeout_secs,
                             .data_files = {},
                             .part = {},
                             .wall_time = save.metadata.wall_time,
                             .score = ScoreOf(save)};
  ShardCommitResult result;
  Result<std::vector<uint8_t>> part =
      save.failed ? Result<std::vector<uint8_t>>(save.FirstFailure()) : EncodePart(save);
  if (!part.ok()) {
    save.files.clear();
    const Status why = save.failed ? part.status() : part.status().WithContext(save.final_name);
    result = FailShard(*fs_, std::move(request), why);
  } else {
    request.part = std::move(part).value();
    for (uint32_t i = 0; i < save.files.size(); ++i) {
      request.data_files.push_back(
          {std::move(save.files[i]), save.placer->logical_end(i), save.FileBytes(i)});
    }
    save.files.clear();
    result = CommitShard(*fs_, *manager_, std::move(request),
                         [&](const std::vector<std::vector<uint8_t>>& parts) {
                           return MergeParts(save.final_name, parts);
                         });
  }
  save.failed_rank = result.failed_rank;
  if (!result.status.ok()) save.Fail(result.status);
  return result.committed;
}

void SaveGraph::Impl::Report(const SaveJob& save, bool committed) {
  SaveStats stats = save.Stats();
  if (committed) stats.path = JoinCheckpointPath(options_.saver.checkpoint_dir, save.final_name);
  if (!on_done_) return;
  // A listener that throws must not take later saves down with it.
  try {
    on_done_(stats);
  } catch (const std::exception& e) {
    LogError("a listener threw after the save of " + save.final_name + ": " + e.what());
  } catch (...) {
    LogError("a listener threw after the save of " + save.final_name);
  }
}

Result<std::unique_ptr<SaveGraph>> SaveGraph::Create(const EngineOptions& options, unsigned threads,
                                                     StagingPool* staging, io::FileSystem* fs,
                                                     CheckpointManager* manager, SpareFiles* spares,
                                                     DoneFn on_done) {
  auto impl =
      std::make_unique<Impl>(options, threads, staging, fs, manager, spares, std::move(on_done));
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<SaveGraph>(new SaveGraph(std::move(impl)));
}

SaveGraph::SaveGraph(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SaveGraph::~SaveGraph() = default;
bool SaveGraph::TakeFlightPlace(int limit, bool skip_if_busy) {
  return impl_->TakeFlightPlace(limit, skip_if_busy);
}
void SaveGraph::PutChunks(std::vector<ChunkPtr> wave) { impl_->PutChunks(std::move(wave)); }
void SaveGraph::ReleaseHold(const SavePtr& save) { impl_->ReleaseHold(save); }
void SaveGraph::WaitSaves() { impl_->WaitAll(); }
void SaveGraph::WaitAll() {
  impl_->WaitAll();
  impl_->WaitForRemovals();
}
int64_t SaveGraph::in_flight() const { return impl_->in_flight(); }

uint64_t SaveGraph::heap_buffers() const { return impl_->heap_buffers(); }

}  // namespace asyncckpt
