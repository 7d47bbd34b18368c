#pragma once

// Test support: a file system whose queued requests complete late, as on a busy disk, so that
// saves stay pending for a while; it counts the writes it slowed, so a test can show that the
// engine's write path (an IoQueue) went through it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>

#include "asyncckpt/file_system.h"
#include "tests/io/io_queue_wrapper.h"

namespace asyncckpt::testing_support {

/// Holds back the completion of every request submitted to one of its IoQueues by `delay`
/// (on the queue's completion thread) before the submitter hears of it. Everything else
/// passes through.
class SlowFileSystem final : public io::FileSystemWrapper {
 public:
  /// Wraps `target` (not owned).
  SlowFileSystem(io::FileSystem* target, std::chrono::microseconds delay)
      : FileSystemWrapper(target), delay_(delay) {}
  /// Wraps and owns `target`.
  SlowFileSystem(std::unique_ptr<io::FileSystem> target, std::chrono::microseconds delay)
      : FileSystemWrapper(target.get()), owned_(std::move(target)), delay_(delay) {}

  io::IoStatus new_io_queue(const io::IoQueueOptions& options,
                            std::unique_ptr<io::IoQueue>* queue) override {
    io::IoQueueOptions slowed = options;
    // The queue may outlive this wrapper: the callback holds copies, not `this`.
    slowed.on_complete = [delay = delay_, on_complete = options.on_complete](uint64_t tag,
                                                                             io::IoStatus status) {
      std::this_thread::sleep_for(delay);
      on_complete(tag, std::move(status));
    };
    std::unique_ptr<io::IoQueue> inner;
    io::IoStatus status = target()->new_io_queue(slowed, &inner);
    if (status.ok()) *queue = std::make_unique<CountingQueue>(std::move(inner), this);
    return status;
  }

  /// Writes submitted to this file system's queues so far (each one completes late).
  uint64_t slowed_writes() const { return slowed_writes_.load(); }

 private:
  class CountingQueue final : public IoQueueWrapper {
   public:
    CountingQueue(std::unique_ptr<io::IoQueue> target, SlowFileSystem* owner)
        : IoQueueWrapper(std::move(target)), owner_(owner) {}
    void submit_write(const io::WriteOp& op, uint64_t tag) override {
      ++owner_->slowed_writes_;
      target()->submit_write(op, tag);
    }

   private:
    SlowFileSystem* owner_;
  };

  std::unique_ptr<io::FileSystem> owned_;
  const std::chrono::microseconds delay_;
  std::atomic<uint64_t> slowed_writes_{0};
};

}  // namespace asyncckpt::testing_support
