#pragma once

// Test support: a file system that holds every write until the test opens its gate, so a test
// can keep staging leased (leases return only after their chunk is written) as long as it needs.

#include <condition_variable>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "asyncckpt/file_system.h"
#include "tests/io/io_queue_wrapper.h"

namespace asyncckpt::testing_support {

/// Holds every write submitted to one of its IoQueues at the gate until Open(); then lets all
/// through. A held write does not block its submitter.
class GatedFileSystem final : public io::FileSystemWrapper {
 public:
  /// Wraps `target` (not owned).
  explicit GatedFileSystem(io::FileSystem* target) : FileSystemWrapper(target) {}
  /// Wraps and owns `target`.
  explicit GatedFileSystem(std::unique_ptr<io::FileSystem> target)
      : FileSystemWrapper(target.get()), owned_(std::move(target)) {}

  io::IoStatus new_io_queue(const io::IoQueueOptions& options,
                            std::unique_ptr<io::IoQueue>* queue) override {
    std::unique_ptr<io::IoQueue> inner;
    io::IoStatus status = target()->new_io_queue(options, &inner);
    if (status.ok()) *queue = std::make_unique<GatedQueue>(std::move(inner), this);
    return status;
  }
  /// Lets every held and later write through.
  void Open() {
    std::vector<Held> held;
    {
      std::lock_guard lock(mu_);
      open_ = true;
      held.swap(held_);
      waiting_ -= static_cast<int>(held.size());
      changed_.notify_all();
    }
    for (Held& h : held) h.queue->Forward(h.op, h.tag);
  }
  /// Blocks until at least n writes are held at the gate.
  void WaitForWaiting(int n) {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return waiting_ >= n; });
  }

 private:
  class GatedQueue;
  struct Held {
    GatedQueue* queue;
    io::WriteOp op;
    uint64_t tag;
  };
  class GatedQueue final : public IoQueueWrapper {
   public:
    GatedQueue(std::unique_ptr<io::IoQueue> target, GatedFileSystem* gate)
        : IoQueueWrapper(std::move(target)), gate_(gate) {}
    void submit_write(const io::WriteOp& op, uint64_t tag) override {
      {
        std::lock_guard lock(gate_->mu_);
        if (!gate_->open_) {
          gate_->held_.push_back(Held{this, op, tag});
          ++gate_->waiting_;
          gate_->changed_.notify_all();
          return;
        }
      }
      Forward(op, tag);
    }
    void Forward(const io::WriteOp& op, uint64_t tag) { target()->submit_write(op, tag); }

   private:
    GatedFileSystem* gate_;
  };

  std::unique_ptr<io::FileSystem> owned_;
  std::mutex mu_;
  std::condition_variable changed_;
  bool open_ = false;
  int waiting_ = 0;
  std::vector<Held> held_;
};

}  // namespace asyncckpt::testing_support
