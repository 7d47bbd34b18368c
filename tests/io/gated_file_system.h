#pragma once

// Test support: a file system that holds every write until the test opens its gate, so a test
// can keep staging leased (leases return only after their chunk is written) as long as it needs.

#include <condition_variable>
#include <memory>
#include <mutex>
#include <span>

#include "asyncckpt/file_system.h"

namespace asyncckpt::testing_support {

/// Holds every write_batch at the gate until Open(); then lets all through.
class GatedFileSystem final : public io::FileSystemWrapper {
 public:
  /// Wraps `target` (not owned).
  explicit GatedFileSystem(io::FileSystem* target) : FileSystemWrapper(target) {}
  /// Wraps and owns `target`.
  explicit GatedFileSystem(std::unique_ptr<io::FileSystem> target)
      : FileSystemWrapper(target.get()), owned_(std::move(target)) {}

  io::IoStatus write_batch(std::span<const io::WriteOp> ops) override {
    {
      std::unique_lock lock(mu_);
      ++waiting_;
      changed_.notify_all();
      changed_.wait(lock, [&] { return open_; });
      --waiting_;
    }
    return target()->write_batch(ops);
  }
  /// Lets every held and later write through.
  void Open() {
    std::lock_guard lock(mu_);
    open_ = true;
    changed_.notify_all();
  }
  /// Blocks until at least n writes are held at the gate.
  void WaitForWaiting(int n) {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return waiting_ >= n; });
  }

 private:
  std::unique_ptr<io::FileSystem> owned_;
  std::mutex mu_;
  std::condition_variable changed_;
  bool open_ = false;
  int waiting_ = 0;
};

}  // namespace asyncckpt::testing_support
