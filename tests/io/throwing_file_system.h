#pragma once

// Test support: a file system whose queued writes or sync_dir throw while armed, to check that
// an exception inside the engine's graph becomes that save's failure.

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>

#include "asyncckpt/file_system.h"
#include "tests/io/io_queue_wrapper.h"

namespace asyncckpt::testing_support {

/// Throws "write path exploded" from its IoQueues' submit_write while
/// `armed`, "sync_dir exploded" from sync_dir while `armed_sync_dir`; otherwise passes every
/// call through.
class ThrowingFileSystem final : public io::FileSystemWrapper {
 public:
  /// Wraps `target` (not owned).
  explicit ThrowingFileSystem(io::FileSystem* target) : FileSystemWrapper(target) {}
  /// Wraps and owns `target`.
  explicit ThrowingFileSystem(std::unique_ptr<io::FileSystem> target)
      : FileSystemWrapper(target.get()), owned_(std::move(target)) {}

  io::IoStatus new_io_queue(const io::IoQueueOptions& options,
                            std::unique_ptr<io::IoQueue>* queue) override {
    std::unique_ptr<io::IoQueue> inner;
    io::IoStatus status = target()->new_io_queue(options, &inner);
    if (status.ok()) *queue = std::make_unique<ThrowingQueue>(std::move(inner), this);
    return status;
  }
  io::IoStatus sync_dir(const std::string& path) override {
    if (armed_sync_dir) throw std::runtime_error("sync_dir exploded");
    return target()->sync_dir(path);
  }

  std::atomic<bool> armed{false};
  std::atomic<bool> armed_sync_dir{false};

 private:
  class ThrowingQueue final : public IoQueueWrapper {
   public:
    ThrowingQueue(std::unique_ptr<io::IoQueue> target, ThrowingFileSystem* owner)
        : IoQueueWrapper(std::move(target)), owner_(owner) {}
    void submit_write(const io::WriteOp& op, uint64_t tag) override {
      if (owner_->armed) throw std::runtime_error("write path exploded");
      target()->submit_write(op, tag);
    }

   private:
    ThrowingFileSystem* owner_;
  };

  std::unique_ptr<io::FileSystem> owned_;
};

}  // namespace asyncckpt::testing_support
