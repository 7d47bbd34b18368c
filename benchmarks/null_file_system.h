#pragma once

// A sink that accepts every data-file write and discards it, for benchmarks only (issue 17):
// with the disk out of the way, a save runs as fast as the engine itself can copy, encode,
// checksum and commit. Never linked into the library or the CLI.
//
// Only the data files are null. Directories, the index, the state file and renames go to the
// wrapped file system (a real directory, ideally on tmpfs), so that the engine's commit and
// retention run unchanged and a save's index can be checked afterwards.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "asyncckpt/file_system.h"

namespace asyncckpt::bench {

/// A data file whose writes vanish: only its size and the bytes written are kept.
class NullFile final : public io::File {
 public:
  /// `direct`: reported by is_direct(), so that the engine takes its O_DIRECT path.
  NullFile(std::string path, bool direct, std::atomic<uint64_t>* written)
      : path_(std::move(path)), direct_(direct), written_(written) {}
  const std::string& path() const override { return path_; }
  bool is_direct() const override { return direct_; }
  io::IoStatus write_at(uint64_t offset, const void* data, size_t n) override {
    (void)data;
    written_->fetch_add(n, std::memory_order_relaxed);
    Grow(offset + n);
    return io::IoStatus::Ok();
  }
  io::IoStatus read_at(uint64_t offset, void* data, size_t n) override {
    (void)offset;
    (void)data;
    (void)n;
    return io::IoStatus(EIO, "read " + path_ + ": a null file holds no bytes");
  }
  io::IoStatus sync() override { return io::IoStatus::Ok(); }
  io::IoStatus size(uint64_t* bytes) override {
    *bytes = size_.load();
    return io::IoStatus::Ok();
  }
  io::IoStatus truncate(uint64_t bytes) override {
    size_.store(bytes);
    return io::IoStatus::Ok();
  }
  io::IoStatus allocate(uint64_t offset, uint64_t n) override {
    Grow(offset + n);
    return io::IoStatus::Ok();
  }
  int fd() const override { return -1; }

 private:
  void Grow(uint64_t end) {
    uint64_t now = size_.load();
    while (now < end && !size_.compare_exchange_weak(now, end)) {
    }
  }

  const std::string path_;
  const bool direct_;
  std::atomic<uint64_t>* const written_;
  std::atomic<uint64_t> size_{0};
};

/// Completes each request on one thread of its own, the way the io_uring queue completes from
/// its ring thread: the engine's own per-write cost stays in the figure, a thread per request
/// does not.
class NullIoQueue final : public io::IoQueue {
 public:
  /// `options.on_complete` is called for every request, on the queue's thread.
  explicit NullIoQueue(io::IoQueueOptions options)
      : options_(std::move(options)), thread_([this] { Loop(); }) {}
  ~NullIoQueue() override {
    drain();
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void submit_write(const io::WriteOp& op, uint64_t tag) override {
    Push([op, tag, this] {
      options_.on_complete(tag, op.file->write_at(op.offset, op.data, op.length));
    });
  }
  void submit_read(const io::ReadOp& op, uint64_t tag) override {
    Push([op, tag, this] {
      options_.on_complete(tag, op.file->read_at(op.offset, op.data, op.length));
    });
  }
  void drain() override {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return queue_.empty() && running_ == 0; });
  }
  unsigned depth() const override { return options_.depth; }
  std::string name() const override { return "null"; }

 private:
  void Push(std::function<void()> request) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(request));
    }
    wake_.notify_one();
  }
  void Loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::deque<std::function<void()>> batch;
      batch.swap(queue_);
      running_ = batch.size();
      lock.unlock();
      for (auto& request : batch) request();
      lock.lock();
      running_ = 0;
      if (queue_.empty()) idle_.notify_all();
    }
  }

  const io::IoQueueOptions options_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> queue_;
  size_t running_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

/// Data files ("data-*") opened for writing are NullFiles; everything else goes to the target.
class NullDataFileSystem final : public io::FileSystemWrapper {
 public:
  /// `target` holds the directories, the index and the state file (not owned).
  explicit NullDataFileSystem(io::FileSystem* target) : FileSystemWrapper(target) {}
  std::string name() const override { return "null"; }
  io::IoStatus open(const std::string& path, const io::OpenOptions& options,
                    std::unique_ptr<io::File>* file) override {
    const size_t slash = path.find_last_of('/');
    const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
    if (!options.write || base.rfind("data-", 0) != 0) return target()->open(path, options, file);
    *file = std::make_unique<NullFile>(path, options.direct, &written_);
    return io::IoStatus::Ok();
  }
  io::IoStatus new_io_queue(const io::IoQueueOptions& options,
                            std::unique_ptr<io::IoQueue>* queue) override {
    if (!options.on_complete || options.depth == 0) {
      return io::IoStatus(EINVAL, "new_io_queue: needs on_complete and a depth");
    }
    *queue = std::make_unique<NullIoQueue>(options);
    return io::IoStatus::Ok();
  }
  io::IoStatus register_buffers(std::span<const io::IoBuffer> buffers) override {
    (void)buffers;
    return io::IoStatus(ENOTSUP, "register_buffers: a null sink has no use for it");
  }
  void unregister_buffers() override {}
  /// Data-file bytes accepted (and dropped) so far.
  uint64_t bytes_written() const { return written_.load(); }

 private:
  std::atomic<uint64_t> written_{0};
};

}  // namespace asyncckpt::bench
