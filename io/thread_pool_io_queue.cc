#include "io/thread_pool_io_queue.h"

#include <algorithm>
#include <deque>
#include <thread>
#include <vector>

namespace asyncckpt::io {

ThreadedIoQueue::ThreadedIoQueue(const IoQueueOptions& options)
    : on_complete_(options.on_complete), depth_(options.depth) {}

// Queues and notifies under the lock: once it is released, a thread may complete the request and
// a drain() waiting for it may return and destroy this queue while notify_one still runs
// (ThreadSanitizer saw that race when a test forwarded held writes from its own thread).
void ThreadedIoQueue::submit_write(const WriteOp& op, uint64_t tag) {
  std::lock_guard lock(mu_);
  ++unfinished_;
  QueueLocked(Request{op.file, op.offset, const_cast<void*>(op.data), op.length, tag, true});
}

void ThreadedIoQueue::submit_read(const ReadOp& op, uint64_t tag) {
  std::lock_guard lock(mu_);
  ++unfinished_;
  QueueLocked(Request{op.file, op.offset, op.data, op.length, tag, false});
}

void ThreadedIoQueue::drain() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return unfinished_ == 0; });
}

void ThreadedIoQueue::Run(const Request& r) {
  IoStatus status;
  if (r.length > 0) {
    status = r.write ? r.file->write_at(r.offset, r.data, r.length)
                     : r.file->read_at(r.offset, r.data, r.length);
  }
  // A callback that throws would take the thread, and every later completion, with it.
  try {
    on_complete_(r.tag, std::move(status));
  } catch (...) {
  }
}

void ThreadedIoQueue::FinishLocked() {
  if (--unfinished_ == 0) idle_.notify_all();
}

IoStatus CheckIoQueueOptions(const IoQueueOptions& options) {
  if (!options.on_complete) return IoStatus(EINVAL, "new_io_queue: on_complete is not set");
  if (options.depth == 0) return IoStatus(EINVAL, "new_io_queue: depth must be at least 1");
  return IoStatus::Ok();
}

namespace {

class ThreadPoolIoQueue final : public ThreadedIoQueue {
 public:
  explicit ThreadPoolIoQueue(const IoQueueOptions& options) : ThreadedIoQueue(options) {
    const unsigned threads = std::min(options.depth, kMaxPoolQueueThreads);
    for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  }

  ~ThreadPoolIoQueue() override {
    drain();
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    work_.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }

  std::string name() const override { return "thread_pool"; }

 private:
  void QueueLocked(const Request& request) override {
    pending_.push_back(request);
    work_.notify_one();
  }

  void Loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      work_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping, and drained by the destructor
      const Request request = pending_.front();
      pending_.pop_front();
      lock.unlock();
      Run(request);
      lock.lock();
      FinishLocked();
    }
  }

  std::condition_variable work_;
  std::deque<Request> pending_;  // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace

IoStatus NewThreadPoolIoQueue(const IoQueueOptions& options, std::unique_ptr<IoQueue>* queue) {
  if (IoStatus checked = CheckIoQueueOptions(options); !checked.ok()) return checked;
  *queue = std::make_unique<ThreadPoolIoQueue>(options);
  return IoStatus::Ok();
}

IoStatus FileSystem::new_io_queue(const IoQueueOptions& options, std::unique_ptr<IoQueue>* queue) {
  return NewThreadPoolIoQueue(options, queue);
}

}  // namespace asyncckpt::io
