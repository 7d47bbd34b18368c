#pragma once

// Test support: a file system whose write_batch or sync_dir throws while armed, to check that an
// exception inside the engine's graph becomes that save's failure.

#include <atomic>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include "asyncckpt/file_system.h"

namespace asyncckpt::testing_support {

/// Throws "write path exploded" from write_batch while `armed`, "sync_dir exploded" from
/// sync_dir while `armed_sync_dir`; otherwise passes every call through.
class ThrowingFileSystem final : public io::FileSystemWrapper {
 public:
  /// Wraps `target` (not owned).
  explicit ThrowingFileSystem(io::FileSystem* target) : FileSystemWrapper(target) {}
  /// Wraps and owns `target`.
  explicit ThrowingFileSystem(std::unique_ptr<io::FileSystem> target)
      : FileSystemWrapper(target.get()), owned_(std::move(target)) {}

  io::IoStatus write_batch(std::span<const io::WriteOp> ops) override {
    if (armed) throw std::runtime_error("write path exploded");
    return target()->write_batch(ops);
  }
  io::IoStatus sync_dir(const std::string& path) override {
    if (armed_sync_dir) throw std::runtime_error("sync_dir exploded");
    return target()->sync_dir(path);
  }

  std::atomic<bool> armed{false};
  std::atomic<bool> armed_sync_dir{false};

 private:
  std::unique_ptr<io::FileSystem> owned_;
};

}  // namespace asyncckpt::testing_support
