#include "io/per_file_io_queue.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "io/thread_pool_io_queue.h"

namespace asyncckpt::io {
namespace {

class PerFileIoQueue final : public ThreadedIoQueue {
 public:
  PerFileIoQueue(const IoQueueOptions& options, unsigned max_threads)
      : ThreadedIoQueue(options), max_threads_(std::min(options.depth, max_threads)) {}

  ~PerFileIoQueue() override {
    drain();
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    for (auto& worker : workers_) worker->wake.notify_all();
    for (auto& worker : workers_) worker->thread.join();
  }

  std::string name() const override { return "per_file"; }

 private:
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

  void QueueLocked(const Request& request) override {
    Worker* worker = Place(request.file);
    worker->pending.push_back(request);
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
      chosen = AddWorker();
    }
    ++chosen->files;
    files_.emplace(file, Placement{chosen, 1});
    return chosen;
  }

  Worker* AddWorker() {
    auto worker = std::make_unique<Worker>();
    Worker* raw = worker.get();
    worker->thread = std::thread([this, raw] { Loop(raw); });
    pthread_setname_np(worker->thread.native_handle(), "asyncckpt-file");
    workers_.push_back(std::move(worker));
    return raw;
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
      Release(self, request.file);
      FinishLocked();
    }
  }

  // A file with nothing outstanding is forgotten, so its next request is placed afresh.
  void Release(Worker* worker, File* file) {
    auto it = files_.find(file);
    if (--it->second.outstanding == 0) {
      --worker->files;
      files_.erase(it);
    }
  }

  const unsigned max_threads_;
  std::vector<std::unique_ptr<Worker>> workers_;  // guarded by mu_ (grows only)
  std::unordered_map<File*, Placement> files_;    // guarded by mu_
};

}  // namespace

IoStatus NewPerFileIoQueue(const IoQueueOptions& options, unsigned max_threads,
                           std::unique_ptr<IoQueue>* queue) {
  if (IoStatus checked = CheckIoQueueOptions(options); !checked.ok()) return checked;
  if (max_threads == 0) return IoStatus(EINVAL, "new_io_queue: max_threads must be at least 1");
  *queue = std::make_unique<PerFileIoQueue>(options, max_threads);
  return IoStatus::Ok();
}

}  // namespace asyncckpt::io
