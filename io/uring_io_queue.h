#pragma once

// The io_uring IoQueue (UringFileSystem::new_io_queue): one thread per queue owns a ring and
// keeps up to depth requests in flight across every file, the queue-depth loop of liburing's
// examples/io_uring-cp.c run as a service.
//
// The life of a queue. submit_write/submit_read only append to a list under a mutex and, when
// the owner has not been told yet, write to an eventfd: the submitter never waits for the
// kernel. The owner keeps one read of that eventfd in flight in its own ring, so a single
// io_uring_submit_and_wait() sleeps until either an I/O request or a submitter needs it. Each
// turn it takes the new requests, prepares SQEs while fewer than depth are in flight (one SQE
// per request: a request larger than a piece goes piece after piece), submits them in one
// call, and reaps every ready CQE: a short transfer is resubmitted for the remainder,
// -EAGAIN/-EINTR are resubmitted as they were, anything else fails the request, and a
// finished request's callback runs on the owner thread. A request on a File with no
// descriptor (fd() == -1: a wrapper whose Files add behaviour) runs through File::write_at /
// read_at on a small thread pool instead, and a write to a file that lives in memory
// (File::in_memory(): tmpfs, ramfs) on a thread of its file (io/per_file_io_queue.h), both
// counted against the same depth. The destructor
// drains, then stops the owner by the same eventfd, whose read is the last request of the
// ring; the ring is closed with nothing in flight.
//
// Registered buffers. Every ring holds its own copy of the file system's fixed-buffer table
// (UringFixedBuffers): the owner registers it when the ring starts, and register_buffers()
// asks every live queue to re-register and waits until each one has. The owner switches at a
// safe point: from the moment it sees a new table it sends no request as fixed, and it
// replaces the ring's table once no fixed request is in flight, so the kernel never sees a
// fixed request against a table that changed under it. Each ring pins the pages again, and
// each pin counts against RLIMIT_MEMLOCK; a ring whose registration fails uses plain
// reads and writes.

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/file_system.h"

namespace asyncckpt::io {

class UringIoQueue;

/// The fixed-buffer table of one UringFileSystem, shared with its queues (which may outlive
/// it). Thread-safe.
class UringFixedBuffers {
 public:
  /// A version of the table: sorted by address, non-overlapping, each at most 1 GiB.
  struct Table {
    uint64_t generation = 0;
    std::vector<iovec> buffers;
  };

  /// Replaces the table and waits until every live queue's ring holds it; returns the first
  /// queue's failure (the queues that failed use plain I/O). Not from a queue's callback.
  IoStatus Publish(std::vector<iovec> buffers);
  /// The current table.
  Table Current() const;
  /// The current table's generation (0: never published), cheap enough to poll.
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }
  /// Requests sent as READ_FIXED / WRITE_FIXED by every queue so far.
  uint64_t fixed_requests() const { return fixed_requests_.load(std::memory_order_relaxed); }
  /// Counts `n` fixed requests.
  void AddFixedRequests(uint64_t n) { fixed_requests_.fetch_add(n, std::memory_order_relaxed); }

 private:
  friend class UringIoQueue;
  void Attach(UringIoQueue* queue);
  // Returns once no Publish() is talking to `queue`.
  void Detach(UringIoQueue* queue);

  mutable std::mutex table_mu_;
  Table table_;  // guarded by table_mu_
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> fixed_requests_{0};
  // Held while publishing, so that a queue cannot leave while Publish() waits for it.
  std::mutex queues_mu_;
  std::set<UringIoQueue*> queues_;  // guarded by queues_mu_
};

/// What a UringIoQueue is made from.
struct UringIoQueueSettings {
  /// Depth (clamped to [1, 4096]) and callback, as for any IoQueue.
  IoQueueOptions options;
  /// The file system's fixed buffers; null: none.
  std::shared_ptr<UringFixedBuffers> fixed_buffers;
  /// Most bytes in one SQE: Linux moves at most ~2 GiB per call and io_uring lengths are 32
  /// bits. Tests lower it to see a request go in pieces. A multiple of 4096 (O_DIRECT).
  size_t max_piece_bytes = size_t{1} << 30;
  /// Most threads that write files living in memory (File::in_memory()); 0: one per CPU.
  unsigned max_file_threads = 0;
};

/// The io_uring IoQueue described at the top of this file. Thread-safe as any IoQueue.
class UringIoQueue final : public IoQueue {
 public:
  /// Sets up the ring and starts the owner thread; EINVAL for a missing callback, depth 0 or
  /// a bad piece size, else the errno of io_uring_queue_init / eventfd when a ring cannot be
  /// set up (the caller falls back to the thread pool).
  static IoStatus Create(UringIoQueueSettings settings, std::unique_ptr<UringIoQueue>* queue);
  ~UringIoQueue() override;
  UringIoQueue(const UringIoQueue&) = delete;
  UringIoQueue& operator=(const UringIoQueue&) = delete;

  void submit_write(const WriteOp& op, uint64_t tag) override;
  void submit_read(const ReadOp& op, uint64_t tag) override;
  void drain() override;
  unsigned depth() const override { return depth_; }
  std::string name() const override { return "io_uring"; }

  /// SQEs sent as READ_FIXED / WRITE_FIXED so far.
  uint64_t fixed_ops() const { return fixed_ops_.load(std::memory_order_relaxed); }
  /// SQEs sent for the remainder of a request after a short transfer or a piece so far.
  uint64_t continuations() const { return continuations_.load(std::memory_order_relaxed); }
  /// The most requests that were in flight at once (ring and thread pool together).
  unsigned most_in_flight() const { return most_in_flight_.load(std::memory_order_relaxed); }
  /// Requests that went through the thread pool (Files without a descriptor).
  uint64_t pool_requests() const { return pool_requests_.load(std::memory_order_relaxed); }
  /// Writes that ran on a file's thread (files living in memory) instead of the ring.
  uint64_t file_thread_requests() const {
    return file_thread_requests_.load(std::memory_order_relaxed);
  }

 private:
  friend class UringFixedBuffers;
  struct Ring;
  struct Request {
    File* file = nullptr;
    uint64_t offset = 0;
    char* data = nullptr;
    size_t length = 0;
    uint64_t tag = 0;
    bool write = false;
    size_t done = 0;     // bytes transferred so far
    size_t piece = 0;    // bytes asked for by the SQE in flight
    bool fixed = false;  // the SQE in flight is READ_FIXED / WRITE_FIXED
  };

  UringIoQueue(UringIoQueueSettings settings, std::unique_ptr<Ring> ring);

  // Submitter side (any thread).
  void Push(Request request);
  // Writes the eventfd unless the owner already has a wake-up coming (or `force`).
  void Wake(bool force);

  // Owner side (the owner thread only).
  void Loop();
  // Moves submitted requests and slots returned by the pool to the owner; true when stopping.
  bool TakeSubmitted();
  void ArmWake();
  void RefreshRegistration();
  void StartMore();
  void Start(const Request& request);
  void Prepare(uint32_t slot);
  int FindFixed(const char* data, size_t n) const;
  void Reap();
  void Complete(uint32_t slot, int res);
  void Finish(uint32_t slot, IoStatus status);
  void RunInPool(uint32_t slot);
  void RunOnFileThread(uint32_t slot);

  // Either side.
  void Callback(uint64_t tag, IoStatus status);
  // One request's callback, run by the owner, returned.
  void Finished();
  void PoolDone(uint32_t slot, IoStatus status);

  // Asked by UringFixedBuffers::Publish: returns once the ring holds `generation` or later,
  // with the errno of registering it (0: registered, or no buffers).
  int AwaitRegistration(uint64_t generation);

  const IoCallback on_complete_;
  const unsigned depth_;
  const size_t max_piece_;
  const unsigned max_file_threads_;
  const std::shared_ptr<UringFixedBuffers> fixed_buffers_;
  const std::unique_ptr<Ring> ring_;

  std::mutex mu_;
  std::condition_variable idle_;          // unfinished_ reached 0
  std::condition_variable registered_;    // registered_generation_ moved
  std::vector<Request> submitted_;        // guarded by mu_: not yet taken by the owner
  std::vector<uint32_t> returned_slots_;  // guarded by mu_: finished in the pool
  size_t unfinished_ = 0;                 // guarded by mu_: submitted, callback not returned
  bool wake_sent_ = false;                // guarded by mu_: the owner has a wake-up coming
  bool stopping_ = false;                 // guarded by mu_
  uint64_t registered_generation_ = 0;    // guarded by mu_: the table the ring holds
  int registration_error_ = 0;            // guarded by mu_: errno of registering it

  // The owner thread's own state.
  std::deque<Request> pending_;            // taken from submitted_, not started, oldest first
  std::vector<Request> slots_;             // depth_ of them; an SQE's user_data is its slot
  std::vector<uint32_t> free_slots_;       // slots not in flight
  unsigned in_flight_ = 0;                 // ring and pool
  unsigned fixed_in_flight_ = 0;           // SQEs in flight that use the ring's table
  bool wake_armed_ = false;                // the eventfd read is in the ring
  bool owner_submitted_ = false;           // a callback on the owner submitted since the last take
  uint64_t wake_value_ = 0;                // that read's buffer
  uint64_t owner_generation_ = 0;          // the table the ring holds
  bool use_fixed_ = false;                 // false while a new table waits for fixed SQEs to end
  std::vector<iovec> fixed_;               // the ring's table
  std::unique_ptr<IoQueue> pool_;          // made for the first request without a descriptor
  std::unique_ptr<IoQueue> file_threads_;  // made for the first write of an in-memory file

  std::atomic<uint64_t> fixed_ops_{0};
  std::atomic<uint64_t> continuations_{0};
  std::atomic<unsigned> most_in_flight_{0};
  std::atomic<uint64_t> pool_requests_{0};
  std::atomic<uint64_t> file_thread_requests_{0};
  std::thread::id owner_id_;
  std::thread owner_;
};

}  // namespace asyncckpt::io
