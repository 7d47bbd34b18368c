#include "io/per_file_io_queue.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace asyncckpt::io {
namespace {

class PerFileIoQueue final : public IoQueue {
 public:
  PerFileIoQueue(const IoQueueOptions& options, unsigned max_threads)
      : on_complete_(options.on_complete),
        depth_(options.depth),
        max_threads_(std::min(options.depth, max_threads)) {}

  ~PerFileIoQueue() override {
    drain();
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    for (auto& worker : workers_) worker->wake.notify_all();
    for (auto& worker : workers_) worker->thread.join();
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
  std::string name() const override { return "per_file"; }

 private:
  struct Request {
    File* file;
    uint64_t offset;
    void* data;
    size_t length;
    uint64_t tag;
    bool write;
  };

  struct Worker {
    std::deque<Request> pending;  // guarded by mu_
    size_t files = 0;             // guarded by mu_: files placed here with requests outstanding
    std::condition_variable wake;
    std::thread thread;
  };

  // Where a file's requests go while it has any outstanding.
  struct Placement {
    Worker* worker;
    size_t outstanding;
  };

  // Notifies under the lock, as the thread pool does: once it is released a worker may finish
  // the request and a drain() may return and destroy the queue.
  void Push(Request request) {
    std::lock_guard lock(mu_);
    Worker* worker = Place(request.file);
    worker->pending.push_back(request);
    ++unfinished_;
    worker->wake.notify_one();
  }

  // A file with requests outstanding stays on its worker (its order); a new one goes to a worker
  // with no file, a new worker while there are fewer than max_threads_, else the one with fewest
  // files. Counting files, not queued requests: a worker whose one request is running has an
  // empty queue but is not free, and two files on it would write one after the other.
  Worker* Place(File* file) {
    auto it = files_.find(file);
    if (it != files_.end()) {
      ++it->second.outstanding;
      return it->second.worker;
    }
    Worker* chosen = nullptr;
    for (const auto& worker : workers_) {
      if (chosen == nullptr || worker->files < chosen->files) chosen = worker.get();
    }
    if ((chosen == nullptr || chosen->files > 0) && workers_.size() < max_threads_) {
      auto worker = std::make_unique<Worker>();
      Worker* raw = worker.get();
      worker->thread = std::thread([this, raw] { Loop(raw); });
      pthread_setname_np(worker->thread.native_handle(), "asyncckpt-file");
      workers_.push_back(std::move(worker));
      chosen = raw;
    }
    ++chosen->files;
    files_.emplace(file, Placement{chosen, 1});
    return chosen;
  }

  void Loop(Worker* self) {
    std::unique_lock lock(mu_);
    for (;;) {
      self->wake.wait(lock, [&] { return stopping_ || !self->pending.empty(); });
      if (self->pending.empty()) return;  // stopping, and drained by the destructor
      const Request request = self->pending.front();
      self->pending.pop_front();
      lock.unlock();
      Run(request);
      lock.lock();
      auto it = files_.find(request.file);
      if (--it->second.outstanding == 0) {
        --self->files;
        files_.erase(it);
      }
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
  const unsigned max_threads_;
  std::mutex mu_;
  std::condition_variable idle_;
  std::vector<std::unique_ptr<Worker>> workers_;  // guarded by mu_ (grows only)
  std::unordered_map<File*, Placement> files_;    // guarded by mu_
  size_t unfinished_ = 0;                         // guarded by mu_
  bool stopping_ = false;                         // guarded by mu_
};

}  // namespace

IoStatus NewPerFileIoQueue(const IoQueueOptions& options, unsigned max_threads,
                           std::unique_ptr<IoQueue>* queue) {
  if (!options.on_complete) return IoStatus(EINVAL, "new_io_queue: on_complete is not set");
  if (options.depth == 0) return IoStatus(EINVAL, "new_io_queue: depth must be at least 1");
  if (max_threads == 0) return IoStatus(EINVAL, "new_io_queue: max_threads must be at least 1");
  *queue = std::make_unique<PerFileIoQueue>(options, max_threads);
  return IoStatus::Ok();
}

}  // namespace asyncckpt::io
