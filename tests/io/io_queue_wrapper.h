#pragma once

// Test support: an IoQueue that forwards to another, for wrappers that watch or hold requests
// on their way to the device (GatedFileSystem, ThrowingFileSystem, the engine's in-flight
// counter).

#include <memory>
#include <string>

#include "asyncckpt/file_system.h"

namespace asyncckpt::testing_support {

/// Forwards every call to the queue it owns; decorators override what they change.
class IoQueueWrapper : public io::IoQueue {
 public:
  /// Wraps and owns `target`.
  explicit IoQueueWrapper(std::unique_ptr<io::IoQueue> target) : target_(std::move(target)) {}
  /// Drains the target before anything of the wrapper goes.
  ~IoQueueWrapper() override { target_.reset(); }
  void submit_write(const io::WriteOp& op, uint64_t tag) override {
    target_->submit_write(op, tag);
  }
  void submit_read(const io::ReadOp& op, uint64_t tag) override { target_->submit_read(op, tag); }
  void drain() override { target_->drain(); }
  unsigned depth() const override { return target_->depth(); }
  std::string name() const override { return target_->name(); }

 protected:
  io::IoQueue* target() const { return target_.get(); }

 private:
  std::unique_ptr<io::IoQueue> target_;
};

}  // namespace asyncckpt::testing_support
