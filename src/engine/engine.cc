#include "src/engine/engine.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <thread>
#include <vector>

#include "src/engine/copy_crew.h"
#include "src/engine/graph.h"
#include "src/engine/save_job.h"
#include "src/format/format.h"
#include "src/format/placement.h"
#include "src/format/writer.h"
#include "src/staging/staging_pool.h"
#include "src/state/retention_score.h"
#include "src/state/sharded_commit.h"
#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

namespace {

// io_uring refuses fixed buffers larger than 1 GiB each.
constexpr uint64_t kMaxRegisteredBuffer = 1ull << 30;

Status ValidateSharding(const EngineOptions& options) {
  const ShardingOptions& sharding = options.sharding;
  if (sharding.world_size == 0 || sharding.rank >= sharding.world_size) {
    return Status::InvalidArgument("sharding.rank " + std::to_string(sharding.rank) +
                                   " is not below sharding.world_size " +
                                   std::to_string(sharding.world_size));
  }
  if (sharding.world_size == 1) return Status::OK();
  RETURN_IF_ERROR(ValidateJobToken(sharding.job_token));
  // The saver's options are checked alone where they enter the library; the world they are
  // multiplied by is the engine's own.
  const uint32_t per_rank = options.saver.num_data_files;
  const uint64_t files = uint64_t{per_rank} * sharding.world_size;
  if (per_rank == 0 || files > format::kMaxDataFiles) {
    return Status::InvalidArgument("num_data_files " + std::to_string(per_rank) +
                                   " times world_size " + std::to_string(sharding.world_size) +
                                   " must be 1 to " + std::to_string(format::kMaxDataFiles) +
                                   " data files");
  }
  return Status::OK();
}

// A single-process checkpoint holds whole tensors: a shard registered there that is only part
// of its global tensor would be saved as if it were all of it.
Status CheckWholeTensors(const TensorRegistry& registry) {
  for (const TensorRef& ref : registry.tensors()) {
    if (IsShard(ref) && ref.global_shape != ref.shape) {
      return Status::InvalidArgument(
          "tensor '" + ref.name.substr(0, 200) +
          "' is a shard of a larger global tensor, but sharding.world_size is 1: a "
          "single-process checkpoint holds whole tensors");
    }
  }
  return Status::OK();
}

}  // namespace

class Engine::Impl {
 public:
  Impl(const EngineOptions& options, io::FileSystem* fs, const TensorRegistry* registry,
       std::shared_ptr<Device> staging_device, uint64_t budget, unsigned threads)
      : options_(options),
        fs_(fs),
        registry_(registry),
        // The caller joins the copies, beside the helpers.
        copy_crew_(threads > 1 ? threads - 1 : 0),
        pool_(std::move(staging_device), budget) {}

  ~Impl() {
    graph_.reset();  // waits for every save: nothing reads staging any more
    if (registered_) fs_->unregister_buffers();
  }

  Status Start(CheckpointManager* manager, DoneFn on_done, unsigned threads) {
    RETURN_IF_ERROR(pool_.Prepare());
    RegisterStaging();
    if (!sharded()) spares_ = std::make_unique<SpareFiles>(fs_);
    ASSIGN_OR_RETURN(graph_, SaveGraph::Create(options_, threads, &pool_, fs_, manager,
                                               spares_.get(), std::move(on_done)));
    return Status::OK();
  }

  Result<SubmitResult> Submit(SubmitRequest request);
  void WaitSaves() { graph_->WaitSaves(); }
  void WaitAll() { graph_->WaitAll(); }
  int64_t in_flight() const { return graph_->in_flight(); }
  uint64_t heap_buffers() const { return graph_->heap_buffers(); }
  StagingPool& pool() { return pool_; }

 private:
  void RegisterStaging();
  SavePtr NewSave(const CheckpointMetadata& metadata, SnapshotPlan plan);
  Status OpenFiles(SaveJob& save);
  Status Preallocate(SaveJob& save, uint64_t alignment);
  static Status NoteSpareSizes(SaveJob& save);
  bool Busy(const SaveJob& save) const;
  void CopyWave(SaveJob& save, std::vector<ChunkPtr>& wave);
  std::vector<ChunkMsg*> EnqueueDeviceCopies(SaveJob& save, std::vector<ChunkPtr>& wave);
  void WaitForStreamOrderedCopies(SaveJob& save);
  bool sharded() const { return options_.sharding.world_size > 1; }
  void SetTempDir(SaveJob& save, std::string name) const {
    save.tmp_name = std::move(name);
    save.tmp_path = JoinCheckpointPath(options_.saver.checkpoint_dir, save.tmp_name);
  }
  std::string SharedTempDir(int64_t step, const std::string& final_name);

  const EngineOptions options_;
  io::FileSystem* const fs_;
  const TensorRegistry* const registry_;
  CopyCrew copy_crew_;
  StagingPool pool_;
  bool registered_ = false;
  std::unique_ptr<SpareFiles> spares_;  // single-process saves only; outlives the graph
  std::unique_ptr<SaveGraph> graph_;    // last: destroyed (and waited for) first
  uint64_t next_save_id_ = 0;
  uint64_t next_chunk_seq_ = 0;
  // Sharded saves: how many saves of each step were submitted, so that a second save of a step
  // (after a failed one, whose temporary directory stays until the next start) gets a fresh
  // shared directory. Every rank submits the same saves, so every rank picks the same name.
  std::map<int64_t, uint32_t> attempts_;
};

void Engine::Impl::RegisterStaging() {
  auto [data, size] = pool_.region();
  std::vector<io::IoBuffer> pieces;
  for (uint64_t offset = 0; offset < size; offset += kMaxRegisteredBuffer) {
    pieces.push_back(io::IoBuffer{data + offset, std::min(kMaxRegisteredBuffer, size - offset)});
  }
  const io::IoStatus status = fs_->register_buffers(pieces);
  registered_ = status.ok();
  if (!status.ok() && status.error_number() != ENOTSUP) {
    LogWarning("staging buffers not registered for I/O: " + status.message());
  }
}

// Counted only for saves that go ahead, so that every rank numbers the same saves alike.
std::string Engine::Impl::SharedTempDir(int64_t step, const std::string& final_name) {
  std::string token = options_.sharding.job_token;
  if (const uint32_t attempt = attempts_[step]++; attempt > 0) {
    char suffix[16];
    std::snprintf(suffix, sizeof(suffix), "%08x", attempt);
    token += suffix;  // still hex: CheckpointManager::Start removes it as a leftover
  }
  return ShardedTempDirName(final_name, token);
}

SavePtr Engine::Impl::NewSave(const CheckpointMetadata& metadata, SnapshotPlan plan) {
  auto save = std::make_shared<SaveJob>();
  save->metadata = metadata;
  save->final_name = format::CheckpointDirName(options_.saver.basename, metadata.step);
  // Sharded: named by Submit once the save is certain (SharedTempDir).
  if (!sharded()) SetTempDir(*save, TempDirName(save->final_name));
  save->SetLevel(options_.saver.compression.level);
  save->tensors = std::move(plan.tensors);
  save->jobs = std::move(plan.jobs);
  save->entries.resize(save->jobs.size());
  if (sharded()) {
    for (const TensorRef& ref : registry_->tensors()) {
      // A tensor registered whole is written by this rank as one slice covering all of it.
      const bool shard = IsShard(ref);
      save->global_shapes.push_back(shard ? ref.global_shape : ref.shape);
      save->box_offsets.push_back(shard ? ref.global_offset
                                        : std::vector<int64_t>(ref.shape.size(), 0));
    }
  }
  return save;
}

// On the caller's thread, so that no graph worker waits for mkdir or open.
Status Engine::Impl::OpenFiles(SaveJob& save) {
  const io::IoStatus made = fs_->create_dir(save.tmp_path);
  if (!made.ok()) {
    // Sharded: every rank makes the shared directory; the first one wins.
    io::EntryType type = io::EntryType::kNone;
    const bool shared = sharded() && made.error_number() == EEXIST &&
                        fs_->entry_type(save.tmp_path, &type, io::Symlinks::kFollow).ok() &&
                        type == io::EntryType::kDirectory;
    if (!shared) return ToStatus(made);
  }
  const uint32_t count = options_.saver.num_data_files;
  // Rank r writes data files r * F .. r * F + F - 1 of world_size * F.
  const uint32_t first = options_.sharding.rank * count;
  const uint32_t total = options_.sharding.world_size * count;
  bool direct = false;
  // Spare files are written over, not truncated: their pages are what makes them worth having.
  const bool spare = spares_ && spares_->TakeInto(save.tmp_path, count);
  for (uint32_t i = 0; i < count; ++i) {
    io::OpenOptions open_options{
        .write = true, .create = true, .truncate = !spare, .direct = options_.saver.use_o_direct};
    std::unique_ptr<io::File> file;
    RETURN_IF_ERROR(ToStatus(fs_->open(save.tmp_path + "/" + format::DataFileName(first + i, total),
                                       open_options, &file)));
    direct = direct || file->is_direct();
    save.files.push_back(std::move(file));
  }
  // The commit trims a spare to what was written (SaveJob::FileBytes).
  if (spare) RETURN_IF_ERROR(NoteSpareSizes(save));
  save.placer.emplace(count, direct ? format::kDirectAlignment : 1, options_.pack_threshold_bytes);
  save.packs.resize(count);
  for (const format::ChunkJob& job : save.jobs) {
    save.max_job_pages = std::max<uint64_t>(save.max_job_pages, StagingPool::RoundUp(job.length));
  }
  save.pack_charges.assign(count, 0);
  return direct ? Preallocate(save, format::kDirectAlignment) : Status::OK();
}

Status Engine::Impl::NoteSpareSizes(SaveJob& save) {
  save.allocated.assign(save.files.size(), 0);
  for (size_t i = 0; i < save.files.size(); ++i) {
    RETURN_IF_ERROR(ToStatus(save.files[i]->size(&save.allocated[i])));
  }
  return Status::OK();
}

// O_DIRECT writes past a file's end serialise on ext4's inode lock, and io_uring hands each of
// them to a worker thread; writes inside a preallocated file run concurrently, inline. A raw save
// knows each file's extent exactly, an encoded one only a bound (its chunks never grow); the commit
// trims the file to what was written.
Status Engine::Impl::Preallocate(SaveJob& save, uint64_t alignment) {
  save.allocated.assign(save.files.size(), 0);
  const bool exact = options_.saver.compression.kind == CompressionKind::kNone;
  std::vector<format::PlannedChunk> chunks;
  chunks.reserve(save.jobs.size());
  for (const format::ChunkJob& job : save.jobs) chunks.push_back({job.file_index, job.length});
  const std::vector<uint64_t> ends =
      format::PlannedFileEnds(static_cast<uint32_t>(save.files.size()), alignment,
                              options_.pack_threshold_bytes, chunks, exact);
  for (size_t i = 0; i < save.files.size(); ++i) {
    if (ends[i] == 0) continue;
    const io::IoStatus status = save.files[i]->allocate(0, ends[i]);
    if (status.ok()) {
      save.allocated[i] = ends[i];
      continue;
    }
    // A raw save that cannot have its space would run out of it while writing.
    const int error = status.error_number();
    if (exact && (error == ENOSPC || error == EDQUOT)) return ToStatus(status);
    // Anything else only costs speed: the file goes back to empty (a failed fallocate may have
    // reserved part of the range) and is written unallocated, as are the rest.
    if (error != ENOTSUP) RETURN_IF_ERROR(ToStatus(save.files[i]->truncate(0)));
    break;
  }
  return Status::OK();
}

bool Engine::Impl::Busy(const SaveJob& save) const {
  uint64_t needed = 0;
  for (const auto& job : save.jobs) needed += StagingPool::RoundUp(job.length);
  // A snapshot larger than the budget streams through it: it is busy only while earlier saves
  // hold staging, else it would be skipped at every trigger, forever.
  needed = std::min<uint64_t>(needed, pool_.budget());
  return pool_.in_use() + pool_.charged() + needed > pool_.budget();
}

Result<SubmitResult> Engine::Impl::Submit(SubmitRequest request) {
  const auto start = request.started.value_or(SteadyClock::now());
  const std::string name =
      format::CheckpointDirName(options_.saver.basename, request.metadata.step);
  // Checked before anything is copied or written: a step, name or rank the index cannot hold
  // would otherwise fail only at the commit, after every byte was written.
  RETURN_IF_ERROR(ValidateCheckpointStep(request.metadata.step));
  RETURN_IF_ERROR(format::ValidateMetadata(request.metadata).WithContext(name));
  RETURN_IF_ERROR(RetentionScore(request.metadata.user).status().WithContext(name));
  SnapshotPlan plan;
  if (request.plan) {
    plan = std::move(*request.plan);
  } else {
    ASSIGN_OR_RETURN(plan, PlanSnapshot(*registry_, options_, name));
  }
  SavePtr save = NewSave(request.metadata, std::move(plan));
  save->start = start;
  // A rank that skipped a save the others take would fail that save on every rank (rank 0
  // waits for its part until the timeout): sharded saves are never skipped.
  const bool skip_if_busy = request.skip_if_busy && !sharded();
  if (skip_if_busy && Busy(*save)) {
    return SubmitResult{SubmitOutcome::kSkipped, SecondsSince(start)};
  }
  if (!graph_->TakeFlightPlace(options_.max_saves_in_flight, skip_if_busy)) {
    return SubmitResult{SubmitOutcome::kSkipped, SecondsSince(start)};
  }
  if (sharded()) SetTempDir(*save, SharedTempDir(request.metadata.step, save->final_name));
  if (request.before_copy) request.before_copy();
  save->id = next_save_id_++;
  save->pending = save->jobs.size() + 1;  // + Submit's hold
  Status opened = OpenFiles(*save);
  if (!opened.ok()) save->Fail(opened.WithContext(save->final_name));
  // Waves: one chunk whose lease may wait for earlier writes, then as many as fit right now.
  // With a budget of a full snapshot the first wave is the whole state.
  size_t next = 0;
  while (next < save->jobs.size()) {
    std::vector<ChunkPtr> wave;
    auto add = [&](StagingLease lease) {
      auto msg = std::make_shared<ChunkMsg>();
      msg->save = save;
      msg->job = static_cast<uint32_t>(next++);
      msg->seq = next_chunk_seq_++;
      msg->lease = std::move(lease);
      wave.push_back(std::move(msg));
    };
    if (!save->failed) {
      // Packs are charged to staging until written, so staging and packs together stay
      // within the budget; this save's own open packs are exempt: only its later chunks,
      // leased here, can close them.
      auto lease = pool_.lease(save->jobs[next].length, &save->open_pack_charge);
      if (!lease.ok()) save->Fail(lease.status().WithContext(save->final_name));
      add(lease.ok() ? std::move(lease).value() : StagingLease());
    }
    while (next < save->jobs.size()) {
      if (save->failed) {
        add(StagingLease());  // passes through the graph so the save completes
        continue;
      }
      auto lease = pool_.try_lease(save->jobs[next].length, &save->open_pack_charge);
      if (!lease.ok() || lease->data() == nullptr) break;
      add(std::move(lease).value());
    }
    CopyWave(*save, wave);
    graph_->PutChunks(std::move(wave));
  }
  if (options_.saver.cuda_stream_ordered && !options_.saver.cuda_defer_compute_wait) {
    WaitForStreamOrderedCopies(*save);
  }
  save->blocked_seconds = SecondsSince(start);
  const SubmitResult result{SubmitOutcome::kSubmitted, save->blocked_seconds};
  graph_->ReleaseHold(save);
  return result;
}

void Engine::Impl::WaitForStreamOrderedCopies(SaveJob& save) {
  for (const TensorRef& ref : registry_->tensors()) {
    if (ref.device && ref.device->kind() != DeviceKind::kHost) {
      Status status = ref.device->wait_for_copies_on_compute_stream();
      if (!status.ok()) save.Fail(status);
      return;  // one device per registry: one wait covers every copy
    }
  }
}

namespace {

// Extends the last region by `bytes` when [src, dst) continue it on both sides.
bool Extend(std::vector<CopyRegion>& regions, const uint8_t* src, uint8_t* dst, size_t bytes) {
  if (regions.empty()) return false;
  CopyRegion& last = regions.back();
  if (static_cast<const uint8_t*>(last.device_src) + last.bytes != src ||
      static_cast<uint8_t*>(last.host_dst) + last.bytes != dst) {
    return false;
  }
  last.bytes += bytes;
  return true;
}

}  // namespace

// Stream-ordered mode: the wave's chunks of device tensors are enqueued in one batch, merged into
// one region per contiguous run (a tensor's chunks lie side by side in its memory and, leased in
// order, in staging), so that the training thread's cost follows the tensors, not their bytes;
// every chunk shares the batch's fence, which the encoder waits for. Returns the other chunks.
std::vector<ChunkMsg*> Engine::Impl::EnqueueDeviceCopies(SaveJob& save,
                                                         std::vector<ChunkPtr>& wave) {
  std::vector<ChunkMsg*> rest;
  std::shared_ptr<Device> device;
  std::vector<CopyRegion> regions;
  std::vector<ChunkMsg*> batch;
  for (ChunkPtr& ptr : wave) {
    ChunkMsg& msg = *ptr;
    const auto& job = save.jobs[msg.job];
    const TensorRef& ref = registry_->tensors()[job.tensor];
    const bool batched = msg.lease.data() != nullptr && ref.device &&
                         ref.device->kind() != DeviceKind::kHost &&
                         (!device || ref.device == device);
    if (!batched) {
      rest.push_back(&msg);
      continue;
    }
    device = ref.device;
    const auto* src = static_cast<const uint8_t*>(ref.data) + job.offset;
    if (!Extend(regions, src, msg.lease.data(), job.length)) {
      regions.push_back(CopyRegion{src, msg.lease.data(), job.length});
    }
    batch.push_back(&msg);
  }
  if (batch.empty()) return rest;
  Guarded(save, "snapshot copy", [&] {
    auto fence = device->copy_regions_to_host_async(regions);
    if (!fence.ok()) {
      save.Fail(fence.status().WithContext(save.final_name + ": snapshot copy"));
      return;
    }
    // One fence for the batch, shared by its chunks: the encoder waits on it per chunk.
    std::shared_ptr<CopyFence> shared = std::move(fence).value();
    for (ChunkMsg* msg : batch) msg->fence = shared;
  });
  return rest;
}

void Engine::Impl::CopyWave(SaveJob& save, std::vector<ChunkPtr>& wave) {
  if (save.failed) return;  // its chunks pass through the graph empty
  const bool stream_ordered = options_.saver.cuda_stream_ordered;
  std::vector<ChunkMsg*> chunks;
  if (stream_ordered) {
    chunks = EnqueueDeviceCopies(save, wave);
  } else {
    for (ChunkPtr& msg : wave) chunks.push_back(msg.get());
  }
  copy_crew_.Run(chunks.size(), [&](size_t i) {
    ChunkMsg& msg = *chunks[i];
    if (msg.lease.data() == nullptr || save.failed) return;
    Guarded(save, "snapshot copy", [&] {
      const auto& job = save.jobs[msg.job];
      const TensorRef& ref = registry_->tensors()[job.tensor];
      const std::shared_ptr<Device>& device = ref.device ? ref.device : HostDevice();
      const auto* src = static_cast<const uint8_t*>(ref.data) + job.offset;
      auto fence = device->copy_to_host_async(src, msg.lease.data(), job.length);
      if (!fence.ok()) {
        save.Fail(fence.status().WithContext(ChunkContext(save, msg.job)));
      } else if (!stream_ordered) {
        Status done = (*fence)->wait();
        if (!done.ok()) save.Fail(done.WithContext(ChunkContext(save, msg.job)));
      } else {
        msg.fence = std::move(fence).value();
      }
    });
  });
}

Result<SnapshotPlan> PlanSnapshot(const TensorRegistry& registry, const EngineOptions& options,
                                  const std::string& context) {
  SnapshotPlan plan;
  plan.tensors.reserve(registry.size());
  for (const TensorRef& ref : registry.tensors()) {
    // The data pointer may be device memory: it is only checked for null, never read here.
    plan.tensors.push_back(format::HostTensor{ref.name, ref.dtype, ref.shape, ref.data, ref.bytes});
  }
  RETURN_IF_ERROR(format::ValidateTensors(plan.tensors).WithContext(context));
  if (options.sharding.world_size <= 1) {
    RETURN_IF_ERROR(CheckWholeTensors(registry).WithContext(context));
  }
  plan.jobs =
      format::PlanChunks(plan.tensors, options.saver.chunk_bytes, options.saver.num_data_files);
  plan.staging = StagingNeedOf(plan.jobs);
  return plan;
}

StagingNeed StagingNeedOf(std::span<const format::ChunkJob> jobs) {
  StagingNeed need;
  for (const format::ChunkJob& job : jobs) {
    const uint64_t staged = StagingPool::RoundUp(job.length);
    need.snapshot_bytes += staged;
    need.largest_chunk_bytes = std::max(need.largest_chunk_bytes, staged);
  }
  return need;
}

Result<uint64_t> StagingBudget(const StagingNeed& need, const SaverOptions& options,
                               SaveMode mode) {
  if (options.staging_bytes != 0) {
    if (options.staging_bytes < need.largest_chunk_bytes) {
      return Status::InvalidArgument("staging_bytes " + std::to_string(options.staging_bytes) +
                                     " is smaller than one chunk (" +
                                     std::to_string(need.largest_chunk_bytes) +
                                     " bytes); raise it or lower chunk_bytes");
    }
    return options.staging_bytes;
  }
  if (mode == SaveMode::kAsynchronous) return need.snapshot_bytes;
  return std::min(need.snapshot_bytes,
                  std::max<uint64_t>(kSynchronousStagingBytes, need.largest_chunk_bytes));
}

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options,
                                               const SnapshotPlan& plan, io::FileSystem* fs,
                                               CheckpointManager* manager,
                                               const TensorRegistry* registry, DoneFn on_done) {
  if (fs == nullptr || manager == nullptr || registry == nullptr) {
    return Status::InvalidArgument("the engine needs a file system, a manager and a registry");
  }
  RETURN_IF_ERROR(ValidateSharding(options));
  // Staging is pinned by the accelerator the state lives on (one per registry), else the host.
  std::shared_ptr<Device> staging_device = HostDevice();
  for (const TensorRef& ref : registry->tensors()) {
    if (ref.device && ref.device->kind() != DeviceKind::kHost) {
      staging_device = ref.device;
      break;
    }
  }
  uint64_t budget = options.staging_budget;
  if (budget == 0) {
    ASSIGN_OR_RETURN(budget, StagingBudget(plan.staging, options.saver, SaveMode::kAsynchronous));
  }
  const unsigned threads = options.saver.background_threads != 0
                               ? options.saver.background_threads
                               : std::max(1u, std::thread::hardware_concurrency());
  auto impl =
      std::make_unique<Impl>(options, fs, registry, std::move(staging_device), budget, threads);
  RETURN_IF_ERROR(impl->Start(manager, std::move(on_done), threads));
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

Result<SubmitResult> Engine::Submit(SubmitRequest request) {
  return impl_->Submit(std::move(request));
}
void Engine::WaitSaves() { impl_->WaitSaves(); }
void Engine::WaitAll() { impl_->WaitAll(); }
int64_t Engine::in_flight() const { return impl_->in_flight(); }
uint64_t Engine::heap_buffers() const { return impl_->heap_buffers(); }

uint64_t Engine::staging_high_water() const { return impl_->pool().high_water(); }
uint64_t Engine::staging_budget() const { return impl_->pool().budget(); }

}  // namespace asyncckpt
