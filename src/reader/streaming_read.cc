#include "src/reader/streaming_read.h"

#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "src/util/io_status.h"

namespace asyncckpt::reader {
namespace {

// Bounce buffers are sized in these steps, so that extents of similar sizes reuse them.
constexpr size_t kBufferStep = 1u << 20;

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};

// An aligned bounce buffer.
struct Buffer {
  std::unique_ptr<uint8_t, FreeDeleter> data;
  size_t capacity = 0;
};

// Bounce buffers, kept for reuse: a restore touches each page once rather than once per extent.
// Holds at most `limit` bytes in free buffers plus what the caller has taken.
class BufferPool {
 public:
  BufferPool(size_t alignment, uint64_t limit) : alignment_(alignment), limit_(limit) {}

  // A buffer of at least n bytes; data is null when it could not be allocated.
  Buffer Acquire(uint64_t n, uint64_t held_by_caller) {
    auto fits =
        std::find_if(free_.begin(), free_.end(), [&](const Buffer& b) { return b.capacity >= n; });
    if (fits != free_.end()) {
      Buffer buffer = std::move(*fits);
      free_.erase(fits);
      free_bytes_ -= buffer.capacity;
      return buffer;
    }
    const uint64_t capacity = (n + kBufferStep - 1) / kBufferStep * kBufferStep;
    // None fits: the smaller free ones go before a new one would exceed the limit.
    while (!free_.empty() && free_bytes_ + held_by_caller + capacity > limit_) {
      free_bytes_ -= free_.back().capacity;
      free_.pop_back();
    }
    Buffer buffer;
    if (capacity > SIZE_MAX) return buffer;
    buffer.data.reset(static_cast<uint8_t*>(std::aligned_alloc(alignment_, capacity)));
    if (buffer.data) buffer.capacity = capacity;
    return buffer;
  }

  void Release(Buffer buffer) {
    if (!buffer.data) return;
    free_bytes_ += buffer.capacity;
    free_.push_back(std::move(buffer));
  }

 private:
  const size_t alignment_;
  const uint64_t limit_;
  std::vector<Buffer> free_;
  uint64_t free_bytes_ = 0;
};

// One run of a plan. The calling thread submits extents and delivers completed ones; the
// queue's threads only record completions.
class PlanRunner {
 public:
  PlanRunner(std::span<const DataFileHandles> files, std::span<const Extent> plan,
             const std::function<uint64_t(const PlannedChunk&)>& chunk_bytes,
             const StreamOptions& options, const ChunkSink& sink, const ChunkFailed& failed)
      : files_(files),
        plan_(plan),
        chunk_bytes_(chunk_bytes),
        options_(options),
        sink_(sink),
        failed_(failed),
        pool_(options.alignment, std::max<uint64_t>(options.buffer_bytes, 1)),
        slots_(plan.size()) {}

  void Run(io::FileSystem& fs) {
    std::unique_ptr<io::IoQueue> queue;
    if (plan_.size() > 1) {
      done_.reserve(plan_.size());
      io::IoQueueOptions queue_options;
      queue_options.depth = options_.queue_depth;
      queue_options.on_complete = [this](uint64_t tag, io::IoStatus status) {
        Complete(tag, std::move(status));
      };
      if (!fs.new_io_queue(queue_options, &queue).ok()) queue.reset();
    }
    if (queue == nullptr) return RunOneAtATime();
    // On any exit, `queue` drains before the slots and buffers it writes into go away.
    RunQueued(*queue);
  }

 private:
  struct Slot {
    Buffer buffer;
    uint8_t* data = nullptr;
    io::IoStatus status;
  };

  void RunOneAtATime() {
    for (size_t i = 0; i < plan_.size(); ++i) {
      if (!Prepare(i, 0)) continue;
      const Extent& e = plan_[i];
      slots_[i].status = File(e)->read_at(e.offset, slots_[i].data, e.length);
      Deliver(i);
      Finish(i);
    }
  }

  void RunQueued(io::IoQueue& queue) {
    const unsigned depth = options_.queue_depth;
    size_t next = 0;
    for (;;) {
      while (next < plan_.size() && in_flight_ < depth) {
        const uint64_t need = BounceBytes(plan_[next]);
        if (need > 0 && in_flight_ > 0 && held_bytes_ + need > options_.buffer_bytes) break;
        if (Prepare(next, held_bytes_)) {
          const Extent& e = plan_[next];
          queue.submit_read(io::ReadOp{File(e), e.offset, slots_[next].data, e.length}, next);
        }
        ++next;
      }
      if (in_flight_ == 0) {
        if (next == plan_.size()) return;
        continue;
      }
      std::vector<size_t> ready = TakeCompleted();
      DeliverAll(ready);
      for (size_t i : ready) Finish(i);
    }
  }

  static uint64_t BounceBytes(const Extent& e) { return e.target != nullptr ? 0 : e.length; }

  io::File* File(const Extent& e) const {
    const DataFileHandles& handles = files_[e.file];
    return e.direct_io && handles.direct != nullptr ? handles.direct : handles.buffered;
  }

  // Points extent i at its memory and counts it in flight; false (its chunks failed) when no
  // bounce buffer could be had.
  bool Prepare(size_t i, uint64_t held) {
    const Extent& e = plan_[i];
    Slot& slot = slots_[i];
    const uint64_t need = BounceBytes(e);
    if (need == 0) {
      slot.data = e.target;
    } else {
      slot.buffer = pool_.Acquire(need, held);
      if (!slot.buffer.data) {
        const Status status = Status::ResourceExhausted("out of memory for a read buffer of " +
                                                        std::to_string(need) + " bytes");
        for (const PlannedChunk& chunk : e.chunks) failed_(chunk, status);
        return false;
      }
      slot.data = slot.buffer.data.get();
    }
    held_bytes_ += need;
    ++in_flight_;
    return true;
  }

  void Finish(size_t i) {
    held_bytes_ -= BounceBytes(plan_[i]);
    --in_flight_;
    pool_.Release(std::move(slots_[i].buffer));
    slots_[i].data = nullptr;
  }

  // On a queue thread: must not throw (done_ has room for every extent).
  void Complete(uint64_t tag, io::IoStatus status) {
    {
      std::lock_guard lock(mu_);
      slots_[tag].status = std::move(status);
      done_.push_back(static_cast<size_t>(tag));
    }
    completed_.notify_one();
  }

  std::vector<size_t> TakeCompleted() {
    std::unique_lock lock(mu_);
    completed_.wait(lock, [&] { return !done_.empty(); });
    std::vector<size_t> ready(done_.begin(), done_.end());
    done_.clear();
    return ready;
  }

  void DeliverAll(const std::vector<size_t>& ready) {
    if (ready.size() == 1 && plan_[ready[0]].chunks.size() == 1) return Deliver(ready[0]);
    tbb::parallel_for(size_t{0}, ready.size(), [&](size_t k) { Deliver(ready[k]); });
  }

  void Deliver(size_t i) {
    const Extent& e = plan_[i];
    Slot& slot = slots_[i];
    if (slot.status.ok() || e.chunks.size() == 1) {
      const Status status = ToStatus(slot.status);
      tbb::parallel_for(size_t{0}, e.chunks.size(), [&](size_t k) {
        const PlannedChunk& chunk = e.chunks[k];
        if (status.ok()) {
          sink_(chunk, {slot.data + chunk.offset_in_extent, chunk_bytes_(chunk)});
        } else {
          failed_(chunk, status);
        }
      });
      return;
    }
    // The extent failed: read its chunks one by one to tell the bad ones from the good.
    io::File* buffered = files_[e.file].buffered;
    tbb::parallel_for(size_t{0}, e.chunks.size(), [&](size_t k) {
      const PlannedChunk& chunk = e.chunks[k];
      uint8_t* at = slot.data + chunk.offset_in_extent;
      const uint64_t bytes = chunk_bytes_(chunk);
      io::IoStatus again = buffered->read_at(e.offset + chunk.offset_in_extent, at, bytes);
      if (again.ok()) {
        sink_(chunk, {at, bytes});
      } else {
        failed_(chunk, ToStatus(again));
      }
    });
  }

  const std::span<const DataFileHandles> files_;
  const std::span<const Extent> plan_;
  const std::function<uint64_t(const PlannedChunk&)>& chunk_bytes_;
  const StreamOptions& options_;
  const ChunkSink& sink_;
  const ChunkFailed& failed_;
  BufferPool pool_;
  std::vector<Slot> slots_;  // one per extent; a queue thread writes only its status
  unsigned in_flight_ = 0;   // submitted or being delivered (submitting thread only)
  uint64_t held_bytes_ = 0;  // bounce bytes of those (submitting thread only)
  std::mutex mu_;
  std::condition_variable completed_;
  std::vector<size_t> done_;  // guarded by mu_: read, not yet delivered
};

}  // namespace

void RunReadPlan(io::FileSystem& fs, std::span<const DataFileHandles> files,
                 std::span<const Extent> plan,
                 const std::function<uint64_t(const PlannedChunk&)>& chunk_bytes,
                 const StreamOptions& options, const ChunkSink& sink, const ChunkFailed& failed) {
  PlanRunner runner(files, plan, chunk_bytes, options, sink, failed);
  runner.Run(fs);
}

std::vector<std::pair<uint8_t*, uint64_t>> RegionsReadInPlace(
    std::span<const std::pair<uint8_t*, uint64_t>> regions, std::span<const Extent> plan) {
  // Addresses as integers: pointers into different objects do not compare with <.
  std::vector<uintptr_t> targets;
  for (const Extent& extent : plan) {
    if (extent.target != nullptr) targets.push_back(reinterpret_cast<uintptr_t>(extent.target));
  }
  std::sort(targets.begin(), targets.end());
  std::vector<std::pair<uint8_t*, uint64_t>> used;
  for (const auto& [data, bytes] : regions) {
    // The first in-place target at or after the region's start: inside it, or none is.
    const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
    auto first = std::lower_bound(targets.begin(), targets.end(), begin);
    if (first != targets.end() && *first - begin < bytes) used.emplace_back(data, bytes);
  }
  return used;
}

RegisteredDestinations::RegisteredDestinations(
    io::FileSystem* fs, std::span<const std::pair<uint8_t*, uint64_t>> regions) {
  if (fs == nullptr || regions.empty() || regions.size() > kMaxRegions) return;
  constexpr uint64_t kMaxPiece = 1ull << 30;  // io_uring's limit per fixed buffer
  std::vector<io::IoBuffer> pieces;
  for (const auto& [data, bytes] : regions) {
    for (uint64_t offset = 0; offset < bytes; offset += kMaxPiece) {
      pieces.push_back(io::IoBuffer{data + offset, std::min(kMaxPiece, bytes - offset)});
    }
  }
  if (fs->register_buffers(pieces).ok()) fs_ = fs;
}

RegisteredDestinations::~RegisteredDestinations() {
  if (fs_ != nullptr) fs_->unregister_buffers();
}

}  // namespace asyncckpt::reader
