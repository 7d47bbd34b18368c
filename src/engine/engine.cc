#include "src/engine/engine.h"

#include <oneapi/tbb/enumerable_thread_specific.h>
#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "io/uring_file_system.h"
#include "src/codec/codec.h"
#include "src/format/format.h"
#include "src/format/writer.h"
#include "src/saver/saver_common.h"
#include "src/staging/staging_pool.h"
#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr size_t kPage = StagingPool::kPageBytes;
// io_uring refuses fixed buffers larger than 1 GiB each.
constexpr uint64_t kMaxRegisteredBuffer = 1ull << 30;

// Buffers for encoded chunks, recycled so that steady-state saves allocate nothing. Each
// buffer is page-aligned and a whole number of pages, so O_DIRECT writes can come from it.
class BufferRecycler {
 public:
  struct Buffer {
    uint8_t* data = nullptr;
    size_t capacity = 0;
  };
  ~BufferRecycler() {
    for (auto& [capacity, data] : free_) std::free(data);
  }
  Buffer get(size_t bytes) {
    const size_t capacity = StagingPool::RoundUp(std::max<size_t>(bytes, 1));
    {
      std::lock_guard lock(mu_);
      auto it = free_.lower_bound(capacity);
      if (it != free_.end()) {
        Buffer buffer{it->second, it->first};
        free_.erase(it);
        return buffer;
      }
    }
    return Buffer{static_cast<uint8_t*>(std::aligned_alloc(kPage, capacity)), capacity};
  }
  void put(Buffer buffer) {
    if (buffer.data == nullptr) return;
    std::lock_guard lock(mu_);
    free_.emplace(buffer.capacity, buffer.data);
  }

 private:
  std::mutex mu_;
  std::multimap<size_t, uint8_t*> free_;
};

// One save in flight. Fields written by the serial place node and read by the commit node are
// ordered by the graph (commit runs after the last write of the save).
struct SaveJob {
  uint64_t id = 0;
  CheckpointMetadata metadata;
  std::string final_name;
  std::string tmp_name;
  std::string tmp_path;
  std::vector<format::HostTensor> tensors;
  std::vector<format::ChunkJob> jobs;
  std::vector<format::ChunkEntry> entries;
  std::vector<std::unique_ptr<io::File>> files;
  std::vector<uint64_t> file_end;     // next free offset (padded for O_DIRECT)
  std::vector<uint64_t> logical_end;  // end of the last chunk's stored bytes
  bool files_open = false;
  // Chunks not yet past the write node, plus one hold that Submit drops when it is done with
  // the save: whoever brings it to zero hands the save to the commit.
  std::atomic<size_t> chunks_left{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status status;                      // first failure, guarded by mu
  int level = 0;                      // guarded by mu
  bool store_raw = false;             // guarded by mu
  uint64_t encoded_since_change = 0;  // guarded by mu
  std::atomic<uint64_t> bytes_stored{0};
  std::array<std::atomic<uint64_t>, codec::kNumCodecs> codec_counts{};
  SteadyClock::time_point start;
  double blocked_seconds = 0;

  void Fail(const Status& why) {
    std::lock_guard lock(mu);
    if (status.ok()) status = why;
    failed = true;
  }
  Status FirstFailure() {
    std::lock_guard lock(mu);
    return status;
  }
  // The options to encode the next chunk with.
  CompressionOptions Compression(CompressionOptions options) {
    std::lock_guard lock(mu);
    options.level = level;
    if (store_raw) options.kind = CompressionKind::kNone;
    return options;
  }
};

struct ChunkMsg {
  std::shared_ptr<SaveJob> save;
  uint32_t job = 0;
  uint64_t seq = 0;
  StagingLease lease;
  std::unique_ptr<CopyFence> fence;
  BufferRecycler::Buffer out;
  codec::EncodedChunk encoded;
  uint64_t file_offset = 0;
};

using ChunkPtr = std::shared_ptr<ChunkMsg>;
using SavePtr = std::shared_ptr<SaveJob>;
using WriteNode = tbb::flow::multifunction_node<ChunkPtr, std::tuple<SavePtr>>;

std::string ChunkContext(const SaveJob& save, const ChunkMsg& msg) {
  const auto& job = save.jobs[msg.job];
  return save.final_name + ": tensor '" + save.tensors[job.tensor].name + "' chunk " +
         std::to_string(job.chunk);
}

// Runs `body`, turning anything it throws into the save's failure.
template <typename Body>
void Guarded(SaveJob& save, const char* stage, Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    save.Fail(Status::Internal(save.final_name + ": " + stage + " threw: " + e.what()));
  } catch (...) {
    save.Fail(Status::Internal(save.final_name + ": " + stage + " threw a non-standard exception"));
  }
}

// Workers an arena may ask for: oneTBB lends at most max_allowed_parallelism - 1 workers to all
// arenas together and prints a warning on stderr when one asks for more, which a default
// background_threads (every core) always did.
int ArenaWorkers(unsigned threads) {
  const size_t limit =
      tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
  return static_cast<int>(std::clamp<size_t>(limit > 1 ? limit - 1 : 1, 1, threads));
}

// Threads that help the training thread copy a snapshot into staging. oneTBB lends at most
// cores - 1 workers to all arenas together, and they are often busy elsewhere (the graph, the
// training step's own loops) at the moment of a save; a copy that runs on the training thread
// alone takes twice as long. These helpers sleep between saves and join every copy.
class CopyCrew {
 public:
  explicit CopyCrew(unsigned helpers) {
    for (unsigned i = 0; i < helpers; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~CopyCrew() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& thread : threads_) thread.join();
  }
  // Runs body(i) for every i in [0, n) on the caller and every helper; returns when all ran.
  void Run(size_t n, const std::function<void(size_t)>& body) {
    // A wave of one chunk (streaming through a small budget) is not worth waking anyone for.
    if (n <= 1 || threads_.empty()) {
      for (size_t i = 0; i < n; ++i) body(i);
      return;
    }
    {
      std::lock_guard lock(mu_);
      body_ = &body;
      n_ = n;
      next_ = 0;
      finished_ = 0;
      ++generation_;
    }
    wake_.notify_all();
    Work();
    // Every helper takes part in every generation, so none can run a stale body later.
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return finished_ == threads_.size(); });
  }

 private:
  void Work() {
    for (size_t i = next_.fetch_add(1); i < n_; i = next_.fetch_add(1)) (*body_)(i);
  }
  void Loop() {
    uint64_t seen = 0;
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      lock.unlock();
      Work();
      lock.lock();
      ++finished_;
      done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> threads_;
  const std::function<void(size_t)>* body_ = nullptr;  // written under mu_ while helpers idle
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
  size_t finished_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace

class Engine::Impl {
 public:
  Impl(const EngineOptions& options, io::FileSystem* fs, CheckpointManager* manager,
       const TensorRegistry* registry, DoneFn on_done, std::shared_ptr<Device> staging_device,
       uint64_t budget, unsigned threads)
      : options_(options),
        fs_(fs),
        manager_(manager),
        registry_(registry),
        on_done_(std::move(on_done)),
        threads_(threads),
        // No slot is reserved for an outside thread: the graph must run with only workers.
        arena_(ArenaWorkers(threads), 0,
               options.high_priority ? tbb::task_arena::priority::high
                                     : tbb::task_arena::priority::normal),
        // The training thread joins the copies, beside the workers.
        copy_crew_(threads > 1 ? threads - 1 : 0),
        pool_(std::move(staging_device), budget) {}

  ~Impl() {
    WaitAll();
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
    RETURN_IF_ERROR(pool_.Prepare());
    RegisterStaging();
    arena_.execute([&] { BuildGraph(); });
    return Status::OK();
  }

  Result<SubmitOutcome> Submit(const CheckpointMetadata& metadata, bool skip_if_busy,
                               const std::function<void()>& before_copy, double* blocked_seconds);
  void WaitAll() {
    if (graph_) arena_.execute([&] { graph_->wait_for_all(); });
  }
  int64_t in_flight() const { return in_flight_.load(); }
  StagingPool& pool() { return pool_; }

 private:
  void BuildGraph();
  void RegisterStaging();
  SavePtr NewSave(const CheckpointMetadata& metadata);
  void CopyWave(SaveJob& save, std::vector<ChunkPtr>& wave);
  ChunkPtr Encode(ChunkPtr msg);
  void MaybeLowerLevel(SaveJob& save);
  ChunkPtr Place(ChunkPtr msg);
  Status OpenFiles(SaveJob& save);
  void Write(const ChunkPtr& msg, WriteNode::output_ports_type& ports);
  void Commit(const SavePtr& save);
  Status Durable(SaveJob& save);
  void RemoveTemporary(SaveJob& save);
  void ReleaseSubmitHold(const SavePtr& save);
  bool WaitForFlightRoom(bool skip_if_busy);
  void LeaveFlight();
  template <typename Fn>
  void EnqueueInGraph(Fn&& fn);

  const EngineOptions options_;
  io::FileSystem* const fs_;
  CheckpointManager* const manager_;
  const TensorRegistry* const registry_;
  const DoneFn on_done_;
  const unsigned threads_;
  tbb::task_arena arena_;
  CopyCrew copy_crew_;
  StagingPool pool_;
  BufferRecycler recycler_;
  tbb::enumerable_thread_specific<codec::Scratch> scratch_;

  std::unique_ptr<tbb::flow::graph> graph_;
  std::unique_ptr<tbb::flow::function_node<ChunkPtr, ChunkPtr>> encode_;
  std::unique_ptr<tbb::flow::sequencer_node<ChunkPtr>> chunk_order_;
  std::unique_ptr<tbb::flow::function_node<ChunkPtr, ChunkPtr>> place_;
  std::unique_ptr<WriteNode> write_;
  std::unique_ptr<tbb::flow::sequencer_node<SavePtr>> save_order_;
  std::unique_ptr<tbb::flow::function_node<SavePtr, tbb::flow::continue_msg>> commit_;

  // Training-thread only.
  uint64_t next_chunk_seq_ = 0;
  uint64_t next_save_id_ = 0;
  // Shared with the graph.
  std::atomic<int64_t> in_flight_{0};  // changed under flight_mu_, read anywhere
  std::mutex flight_mu_;
  std::condition_variable flight_done_;  // a save left the flight
  std::atomic<int64_t> pending_encode_{0};
  std::atomic<int64_t> pending_write_{0};
};

void Engine::Impl::BuildGraph() {
  using namespace tbb::flow;
  graph_ = std::make_unique<graph>();
  encode_ = std::make_unique<function_node<ChunkPtr, ChunkPtr>>(
      *graph_, unlimited, [this](ChunkPtr msg) { return Encode(std::move(msg)); });
  chunk_order_ = std::make_unique<sequencer_node<ChunkPtr>>(
      *graph_, [](const ChunkPtr& msg) -> size_t { return msg->seq; });
  place_ = std::make_unique<function_node<ChunkPtr, ChunkPtr>>(
      *graph_, serial, [this](ChunkPtr msg) { return Place(std::move(msg)); });
  write_ = std::make_unique<WriteNode>(
      *graph_, std::max<size_t>(1, options_.num_data_files),
      [this](const ChunkPtr& msg, WriteNode::output_ports_type& ports) { Write(msg, ports); });
  save_order_ = std::make_unique<sequencer_node<SavePtr>>(
      *graph_, [](const SavePtr& save) -> size_t { return save->id; });
  commit_ = std::make_unique<function_node<SavePtr, continue_msg>>(*graph_, serial,
                                                                   [this](const SavePtr& save) {
                                                                     Commit(save);
                                                                     return continue_msg();
                                                                   });
  make_edge(*encode_, *chunk_order_);
  make_edge(*chunk_order_, *place_);
  make_edge(*place_, *write_);
  make_edge(output_port<0>(*write_), *save_order_);
  make_edge(*save_order_, *commit_);
}

void Engine::Impl::RegisterStaging() {
  auto* uring = dynamic_cast<io::UringFileSystem*>(fs_);
  if (uring == nullptr) return;
  auto [data, size] = pool_.region();
  std::vector<iovec> pieces;
  for (uint64_t offset = 0; offset < size; offset += kMaxRegisteredBuffer) {
    pieces.push_back(iovec{data + offset, std::min(kMaxRegisteredBuffer, size - offset)});
  }
  io::IoStatus status = uring->RegisterBuffers(pieces);
  if (!status.ok()) LogLine("staging buffers not registered with io_uring: " + status.message());
}

SavePtr Engine::Impl::NewSave(const CheckpointMetadata& metadata) {
  auto save = std::make_shared<SaveJob>();
  save->metadata = metadata;
  save->final_name = format::CheckpointDirName(options_.basename, metadata.step);
  save->tmp_name = TempDirName(save->final_name);
  save->tmp_path = options_.checkpoint_dir + "/" + save->tmp_name;
  save->level = options_.compression.level;
  for (const TensorRef& ref : registry_->tensors()) {
    // The data pointer may be device memory: it is only checked for null, never read here.
    save->tensors.push_back(
        format::HostTensor{ref.name, ref.dtype, ref.shape, ref.data, ref.bytes});
  }
  save->jobs = format::PlanChunks(save->tensors, options_.chunk_bytes, options_.num_data_files);
  save->entries.resize(save->jobs.size());
  save->chunks_left = save->jobs.size() + 1;  // + Submit's hold
  return save;
}

// Messages from the training thread enter the graph through tasks enqueued in its arena rather
// than through arena_.execute: a try_put inside execute spawns the node's task into the training
// thread's own slot, which nobody runs when the arena has no worker (background_threads = 1
// used to leave it none, and a one-core machine has none by default) while the training thread
// blocks on staging that only that task would free. Enqueued work always gets a worker (oneTBB's
// mandatory concurrency). reserve_wait keeps wait_for_all from returning before the task ran.
template <typename Fn>
void Engine::Impl::EnqueueInGraph(Fn&& fn) {
  graph_->reserve_wait();
  arena_.enqueue([this, fn = std::forward<Fn>(fn)] {
    fn();
    graph_->release_wait();
  });
}

// Takes a place among the saves in flight, waiting for one (or giving up, with skip_if_busy)
// while max_saves_in_flight are; true once it is taken.
bool Engine::Impl::WaitForFlightRoom(bool skip_if_busy) {
  const int64_t limit = std::max(1, options_.max_saves_in_flight);
  std::unique_lock lock(flight_mu_);
  if (skip_if_busy && in_flight_.load() >= limit) return false;
  flight_done_.wait(lock, [&] { return in_flight_.load() < limit; });
  ++in_flight_;
  return true;
}

void Engine::Impl::LeaveFlight() {
  {
    std::lock_guard lock(flight_mu_);
    --in_flight_;
  }
  flight_done_.notify_all();
}

// Submit is done with the save (its blocked time and any failure are recorded): the commit may
// run once the last chunk is written, not before.
void Engine::Impl::ReleaseSubmitHold(const SavePtr& save) {
  if (--save->chunks_left == 0) {
    EnqueueInGraph([this, save] { save_order_->try_put(save); });
  }
}

Result<SubmitOutcome> Engine::Impl::Submit(const CheckpointMetadata& metadata, bool skip_if_busy,
                                           const std::function<void()>& before_copy,
                                           double* blocked_seconds) {
  const auto start = SteadyClock::now();
  SavePtr save = NewSave(metadata);
  save->start = start;
  // Checked before anything is copied or written: a name or rank the index cannot hold would
  // otherwise fail only at the commit, after every byte was written.
  RETURN_IF_ERROR(format::ValidateTensors(save->tensors).WithContext(save->final_name));
  RETURN_IF_ERROR(format::ValidateMetadata(metadata).WithContext(save->final_name));
  if (skip_if_busy) {
    uint64_t needed = 0;
    for (const auto& job : save->jobs) needed += StagingPool::RoundUp(job.length);
    // A snapshot larger than the budget streams through it: it is busy only while earlier saves
    // hold staging, else it would be skipped at every trigger, forever.
    needed = std::min<uint64_t>(needed, pool_.budget());
    if (pool_.in_use() + needed > pool_.budget()) {
      *blocked_seconds = SecondsSince(start);
      return SubmitOutcome::kSkipped;
    }
  }
  if (!WaitForFlightRoom(skip_if_busy)) {
    *blocked_seconds = SecondsSince(start);
    return SubmitOutcome::kSkipped;
  }
  if (before_copy) before_copy();
  save->id = next_save_id_++;
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
      auto lease = pool_.lease(save->jobs[next].length);
      if (!lease.ok()) save->Fail(lease.status().WithContext(save->final_name));
      add(lease.ok() ? std::move(lease).value() : StagingLease());
    }
    while (next < save->jobs.size()) {
      if (save->failed) {
        add(StagingLease());  // passes through the graph so the save completes
        continue;
      }
      auto lease = pool_.try_lease(save->jobs[next].length);
      if (!lease.ok() || lease->data() == nullptr) break;
      add(std::move(lease).value());
    }
    CopyWave(*save, wave);
    pending_encode_ += static_cast<int64_t>(wave.size());
    EnqueueInGraph([this, wave = std::move(wave)] {
      for (const auto& msg : wave) encode_->try_put(msg);
    });
  }
  if (options_.stream_ordered) {
    for (const TensorRef& ref : registry_->tensors()) {
      if (ref.device && ref.device->kind() == DeviceKind::kCuda) {
        Status status = WaitForCopiesOnComputeStream(*ref.device);
        if (!status.ok()) save->Fail(status);
        break;  // one device per registry: one wait covers every copy
      }
    }
  }
  *blocked_seconds = SecondsSince(start);
  save->blocked_seconds = *blocked_seconds;
  ReleaseSubmitHold(save);
  return SubmitOutcome::kSubmitted;
}

void Engine::Impl::CopyWave(SaveJob& save, std::vector<ChunkPtr>& wave) {
  if (save.failed) return;  // its chunks pass through the graph empty
  const bool wait_here = !options_.stream_ordered;
  copy_crew_.Run(wave.size(), [&](size_t i) {
    ChunkMsg& msg = *wave[i];
    if (msg.lease.data() == nullptr || save.failed) return;
    Guarded(save, "snapshot copy", [&] {
      const auto& job = save.jobs[msg.job];
      const TensorRef& ref = registry_->tensors()[job.tensor];
      const std::shared_ptr<Device>& device = ref.device ? ref.device : HostDevice();
      const auto* src = static_cast<const uint8_t*>(ref.data) + job.offset;
      auto fence = device->copy_to_host_async(src, msg.lease.data(), job.length);
      if (!fence.ok()) {
        save.Fail(fence.status().WithContext(ChunkContext(save, msg)));
      } else if (wait_here) {
        Status done = (*fence)->wait();
        if (!done.ok()) save.Fail(done.WithContext(ChunkContext(save, msg)));
      } else {
        msg.fence = std::move(fence).value();
      }
    });
  });
}

void Engine::Impl::MaybeLowerLevel(SaveJob& save) {
  if (options_.compression.kind == CompressionKind::kNone) return;
  std::lock_guard lock(save.mu);
  if (save.store_raw || ++save.encoded_since_change < 2 * threads_) return;
  // Encoders are the bottleneck when the writers have nothing to do while chunks queue up for
  // encoding: then a cheaper level (and at last raw) finishes the save sooner.
  const bool writers_idle = pending_write_.load() == 0;
  const bool encoders_backed_up = pending_encode_.load() > static_cast<int64_t>(2 * threads_);
  if (!writers_idle || !encoders_backed_up) return;
  save.encoded_since_change = 0;
  if (save.level > 1) {
    save.level = 1;
  } else if (save.level > -5) {
    save.level = -5;
  } else {
    save.store_raw = true;
  }
}

ChunkPtr Engine::Impl::Encode(ChunkPtr msg) {
  SaveJob& save = *msg->save;
  Guarded(save, "encode", [&] {
    if (save.failed) return;
    if (msg->fence) {
      Status copied = msg->fence->wait();
      msg->fence.reset();
      if (!copied.ok()) return save.Fail(copied.WithContext(ChunkContext(save, *msg)));
    }
    MaybeLowerLevel(save);
    const CompressionOptions compression = save.Compression(options_.compression);
    const auto& job = save.jobs[msg->job];
    const size_t elem = DTypeSize(save.tensors[job.tensor].dtype);
    std::span<const uint8_t> raw(msg->lease.data(), job.length);
    codec::Scratch& scratch = scratch_.local();
    Result<codec::EncodedChunk> encoded = [&]() -> Result<codec::EncodedChunk> {
      if (compression.kind == CompressionKind::kNone) {
        return codec::Encode(raw, elem, compression, scratch);
      }
      msg->out = recycler_.get(job.length);
      return codec::Encode(raw, elem, compression, scratch,
                           std::span<uint8_t>(msg->out.data, msg->out.capacity));
    }();
    if (!encoded.ok()) return save.Fail(encoded.status().WithContext(ChunkContext(save, *msg)));
    msg->encoded = *encoded;
    if (msg->encoded.codec == codec::Codec::kRaw) {
      recycler_.put(std::exchange(msg->out, {}));
      msg->encoded.stored = raw;  // write straight from staging
    }
    save.bytes_stored += msg->encoded.stored.size();
    ++save.codec_counts[static_cast<size_t>(msg->encoded.codec)];
  });
  --pending_encode_;
  return msg;
}

Status Engine::Impl::OpenFiles(SaveJob& save) {
  save.files_open = true;
  RETURN_IF_ERROR(ToStatus(fs_->create_dir(save.tmp_path)));
  const uint32_t count = options_.num_data_files;
  for (uint32_t i = 0; i < count; ++i) {
    io::OpenOptions open_options{
        .write = true, .create = true, .truncate = true, .direct = options_.use_o_direct};
    std::unique_ptr<io::File> file;
    RETURN_IF_ERROR(ToStatus(
        fs_->open(save.tmp_path + "/" + format::DataFileName(i, count), open_options, &file)));
    save.files.push_back(std::move(file));
  }
  save.file_end.assign(count, 0);
  save.logical_end.assign(count, 0);
  return Status::OK();
}

ChunkPtr Engine::Impl::Place(ChunkPtr msg) {
  // Counted from here, not from the end of encode: chunks that wait in the sequencer for an
  // earlier one are waiting for the encoders, not for the writers.
  ++pending_write_;
  SaveJob& save = *msg->save;
  Guarded(save, "place", [&] {
    if (!save.failed && !save.files_open) {
      Status opened = OpenFiles(save);
      if (!opened.ok()) save.Fail(opened.WithContext(save.final_name));
    }
    if (save.failed) return;
    const auto& job = save.jobs[msg->job];
    const uint32_t file = job.file_index;
    const uint64_t stored = msg->encoded.stored.size();
    msg->file_offset = save.file_end[file];
    save.file_end[file] += save.files[file]->is_direct() ? StagingPool::RoundUp(stored) : stored;
    save.logical_end[file] = msg->file_offset + stored;
    save.entries[msg->job] = format::ChunkEntry{job.offset,       file,       msg->file_offset,
                                                stored,           job.length, msg->encoded.codec,
                                                msg->encoded.xxh3};
  });
  return msg;
}

void Engine::Impl::Write(const ChunkPtr& msg, WriteNode::output_ports_type& ports) {
  SaveJob& save = *msg->save;
  Guarded(save, "write", [&] {
    if (save.failed) return;
    const auto& job = save.jobs[msg->job];
    io::File* file = save.files[job.file_index].get();
    const size_t stored = msg->encoded.stored.size();
    size_t length = stored;
    if (file->is_direct()) {
      // Whole pages from a page-aligned buffer; the padding is zeroed, never stale state.
      auto* buffer = msg->out.data != nullptr ? msg->out.data : msg->lease.data();
      length = StagingPool::RoundUp(stored);
      std::memset(buffer + stored, 0, length - stored);
    }
    const io::WriteOp op{file, msg->file_offset, msg->encoded.stored.data(), length};
    io::IoStatus written = fs_->write_batch(std::span<const io::WriteOp>(&op, 1));
    if (!written.ok()) save.Fail(ToStatus(written).WithContext(ChunkContext(save, *msg)));
  });
  msg->lease.reset();
  recycler_.put(std::exchange(msg->out, {}));
  --pending_write_;
  if (--save.chunks_left == 0) std::get<0>(ports).try_put(msg->save);
}

Status Engine::Impl::Durable(SaveJob& save) {
  if (!save.files_open) RETURN_IF_ERROR(OpenFiles(save));
  std::vector<Status> synced(save.files.size());
  tbb::parallel_for(size_t{0}, save.files.size(), [&](size_t i) {
    io::File& file = *save.files[i];
    if (file.is_direct() && save.logical_end[i] != save.file_end[i]) {
      synced[i] = ToStatus(file.truncate(save.logical_end[i]));
      if (!synced[i].ok()) return;
    }
    synced[i] = ToStatus(file.sync());
  });
  for (const Status& status : synced) RETURN_IF_ERROR(status);
  ASSIGN_OR_RETURN(format::Index index,
                   format::AssembleIndex(save.tensors, save.metadata, options_.num_data_files,
                                         save.jobs, save.entries));
  RETURN_IF_ERROR(format::WriteIndexFile(*fs_, save.tmp_path, index));
  save.files.clear();
  return CommitDirectory(*fs_, options_.checkpoint_dir, save.tmp_name, save.final_name);
}

void Engine::Impl::Commit(const SavePtr& save) {
  SaveStats stats;
  stats.step = save->metadata.step;
  Guarded(*save, "commit", [&] {
    if (save->failed) return;
    Status status = Durable(*save);
    if (!status.ok()) return save->Fail(status.WithContext(save->final_name));
    stats.path = options_.checkpoint_dir + "/" + save->final_name;
    status = manager_->RecordCommitted(save->final_name, save->metadata.wall_time);
    if (!status.ok()) save->Fail(status.WithContext(save->final_name));
  });
  if (save->failed && stats.path.empty()) RemoveTemporary(*save);
  stats.status = save->FirstFailure();
  for (const auto& job : save->jobs) stats.bytes_raw += job.length;
  stats.bytes_stored = save->bytes_stored;
  for (int c = 0; c < codec::kNumCodecs; ++c) {
    const uint64_t count = save->codec_counts[c];
    if (count > 0) stats.chunks_by_codec[std::string(codec::CodecName(codec::Codec(c)))] = count;
  }
  {
    std::lock_guard lock(save->mu);
    stats.final_level = save->level;
    stats.switched_to_raw = save->store_raw;
  }
  stats.blocked_seconds = save->blocked_seconds;
  stats.seconds_to_durable = SecondsSince(save->start);
  if (on_done_) {
    // A listener that throws must not take the graph (and every later save) down with it.
    try {
      on_done_(stats);
    } catch (const std::exception& e) {
      LogLine("a listener threw after the save of " + save->final_name + ": " + e.what());
    } catch (...) {
      LogLine("a listener threw after the save of " + save->final_name);
    }
  }
  LeaveFlight();
}

// The cleanup of a failed save runs outside Guarded (the save has already failed), so it must
// catch for itself: an exception escaping a node would cancel the whole graph.
void Engine::Impl::RemoveTemporary(SaveJob& save) {
  try {
    save.files.clear();
    bool exists = false;
    bool is_dir = false;
    if (!fs_->stat(save.tmp_path, &exists, &is_dir).ok() || !exists) return;
    const io::IoStatus removed = fs_->remove_tree(save.tmp_path);
    if (!removed.ok()) {
      LogLine("could not remove " + save.tmp_path + " of a failed save: " + removed.message());
    }
  } catch (const std::exception& e) {
    LogLine("removing " + save.tmp_path + " of a failed save threw: " + e.what());
  } catch (...) {
    LogLine("removing " + save.tmp_path + " of a failed save threw");
  }
}

EngineOptions EngineOptionsFor(const SaverOptions& saver) {
  EngineOptions options;
  options.checkpoint_dir = saver.checkpoint_dir;
  options.basename = saver.basename;
  options.chunk_bytes = saver.chunk_bytes;
  options.num_data_files = saver.num_data_files;
  options.compression = saver.compression;
  options.staging_bytes = saver.staging_bytes;
  options.use_o_direct = saver.use_o_direct;
  options.background_threads = saver.background_threads;
  options.stream_ordered = saver.cuda_stream_ordered;
  return options;
}

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options, io::FileSystem* fs,
                                               CheckpointManager* manager,
                                               const TensorRegistry* registry, DoneFn on_done) {
  if (fs == nullptr || manager == nullptr || registry == nullptr) {
    return Status::InvalidArgument("the engine needs a file system, a manager and a registry");
  }
  // Staging is pinned by the accelerator the state lives on (one per registry), else the host.
  std::shared_ptr<Device> staging_device = HostDevice();
  for (const TensorRef& ref : registry->tensors()) {
    if (ref.device && ref.device->kind() != DeviceKind::kHost) {
      staging_device = ref.device;
      break;
    }
  }
  uint64_t snapshot = 0;
  uint64_t largest_chunk = 0;
  std::vector<format::HostTensor> tensors;
  for (const TensorRef& ref : registry->tensors()) {
    tensors.push_back(format::HostTensor{ref.name, ref.dtype, ref.shape, nullptr, ref.bytes});
  }
  for (const auto& job : format::PlanChunks(tensors, options.chunk_bytes, options.num_data_files)) {
    snapshot += StagingPool::RoundUp(job.length);
    largest_chunk = std::max<uint64_t>(largest_chunk, StagingPool::RoundUp(job.length));
  }
  const uint64_t budget = options.staging_bytes == 0 ? snapshot : options.staging_bytes;
  if (budget < largest_chunk) {
    return Status::InvalidArgument("staging_bytes " + std::to_string(options.staging_bytes) +
                                   " is smaller than one chunk (" + std::to_string(largest_chunk) +
                                   " bytes); raise it or lower chunk_bytes");
  }
  const unsigned threads = options.background_threads != 0
                               ? options.background_threads
                               : std::max(1u, std::thread::hardware_concurrency());
  auto impl = std::make_unique<Impl>(options, fs, manager, registry, std::move(on_done),
                                     std::move(staging_device), budget, threads);
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

Result<SubmitOutcome> Engine::Submit(const CheckpointMetadata& metadata, bool skip_if_busy,
                                     const std::function<void()>& before_copy,
                                     double* blocked_seconds) {
  return impl_->Submit(metadata, skip_if_busy, before_copy, blocked_seconds);
}
void Engine::WaitAll() { impl_->WaitAll(); }
int64_t Engine::in_flight() const { return impl_->in_flight(); }
uint64_t Engine::staging_high_water() const { return impl_->pool().high_water(); }
uint64_t Engine::staging_budget() const { return impl_->pool().budget(); }
uint64_t Engine::staging_allocations() const { return impl_->pool().allocations(); }

}  // namespace asyncckpt
