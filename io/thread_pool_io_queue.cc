#include "io/thread_pool_io_queue.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace asyncckpt::io {
namespace {

class ThreadPoolIoQueue final : public IoQueue {
 public:
  explicit ThreadPoolIoQueue(const IoQueueOptions& options)
      : on_complete_(options.on_complete), depth_(options.depth) {
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

  void submit_write(const WriteOp& op, uint64_t tag) override {
    Push(Request{op.file, op.offset, const_cast<void*>(op.data), op.length, tag, true});
  }

  void submit_read(const ReadOp& op, uint64_t tag) override {
    Push(Request{op.file, op.offset, op.data, op.length, tag, false});
  }

  void drain() override {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return unfinished_ == 0; });
  }

  unsigned depth() const override { return depth_; }
  std::string name() const override { return "thread_pool"; }

 private:
  struct Request {
    File* file;
    uint64_t offset;
    void* data;
    size_t length;
    uint64_t tag;
    bool write;
  };

  // Notifies under the lock: once it is released, a worker may complete the request and a
  // drain() waiting for it may return and destroy this queue while notify_one still runs
  // (ThreadSanitizer saw that race when a test forwarded held writes from its own thread).
  void Push(Request request) {
    std::lock_guard lock(mu_);
    pending_.push_back(request);
    ++unfinished_;
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
      if (--unfinished_ == 0) idle_.notify_all();
    }
  }

  void Run(const Request& r) {
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

  const IoCallback on_complete_;
  const unsigned depth_;
  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable idle_;
  std::deque<Request> pending_;  // guarded by mu_
  size_t unfinished_ = 0;        // guarded by mu_: submitted, callback not yet returned
  bool stopping_ = false;        // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace

IoStatus NewThreadPoolIoQueue(const IoQueueOptions& options, std::unique_ptr<IoQueue>* queue) {
  if (!options.on_complete) return IoStatus(EINVAL, "new_io_queue: on_complete is not set");
  if (options.depth == 0) return IoStatus(EINVAL, "new_io_queue: depth must be at least 1");
  *queue = std::make_unique<ThreadPoolIoQueue>(options);
  return IoStatus::Ok();
}

IoStatus FileSystem::new_io_queue(const IoQueueOptions& options, std::unique_ptr<IoQueue>* queue) {
  return NewThreadPoolIoQueue(options, queue);
}

}  // namespace asyncckpt::io
