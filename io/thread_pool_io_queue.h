#pragma once

// The default IoQueue: a small pool of threads, each running one request at a time through
// File::write_at / File::read_at. It works for every FileSystem, wrappers included (their Files'
// behaviour applies), at the cost of a thread per request in flight. The io_uring backend has
// its own queue, which keeps `depth` requests in flight from one thread.
//
// ThreadedIoQueue is what this pool and the per-file queue (io/per_file_io_queue.h) share: they
// differ only in which thread a request waits for.

#include <condition_variable>
#include <memory>
#include <mutex>

#include "asyncckpt/file_system.h"

namespace asyncckpt::io {

/// An IoQueue whose requests run on threads of its own through File::write_at / File::read_at;
/// a subclass owns the threads and decides which one runs each request.
class ThreadedIoQueue : public IoQueue {
 public:
  /// Queues a write for a thread.
  void submit_write(const WriteOp& op, uint64_t tag) final;
  /// Queues a read for a thread.
  void submit_read(const ReadOp& op, uint64_t tag) final;
  /// Waits until every submitted request's callback has returned.
  void drain() final;
  /// The depth the queue was made with.
  unsigned depth() const final { return depth_; }

 protected:
  /// One request, as submitted.
  struct Request {
    File* file;
    uint64_t offset;
    void* data;
    size_t length;
    uint64_t tag;
    bool write;
  };

  /// Keeps the options' callback and depth.
  explicit ThreadedIoQueue(const IoQueueOptions& options);

  /// Hands a request to one of the subclass's threads and wakes it; called with mu_ held.
  virtual void QueueLocked(const Request& request) = 0;
  /// Runs a request and its callback; called without mu_.
  void Run(const Request& request);
  /// Counts a request whose callback has returned; called with mu_ held.
  void FinishLocked();

  std::mutex mu_;
  bool stopping_ = false;  // guarded by mu_: set by the subclass's destructor after drain()

 private:
  const IoCallback on_complete_;
  const unsigned depth_;
  std::condition_variable idle_;
  size_t unfinished_ = 0;  // guarded by mu_: submitted, callback not yet returned
};

/// EINVAL when options.on_complete is empty or options.depth is 0, as every IoQueue reports.
IoStatus CheckIoQueueOptions(const IoQueueOptions& options);

/// A thread-pool IoQueue with min(options.depth, kMaxPoolQueueThreads) threads; EINVAL when
/// options.on_complete is empty or options.depth is 0.
IoStatus NewThreadPoolIoQueue(const IoQueueOptions& options, std::unique_ptr<IoQueue>* queue);

}  // namespace asyncckpt::io
