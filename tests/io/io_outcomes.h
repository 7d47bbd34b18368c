#pragma once

// Test support: what an IoQueue's callback was called with, by tag, for the io tests.

#include <cstdint>
#include <map>
#include <mutex>

#include "asyncckpt/file_system.h"

namespace asyncckpt::testing_support {

/// Counts each tag's completions and keeps each failed tag's status; safe from any thread.
class IoOutcomes {
 public:
  /// A callback for IoQueueOptions that records into this object, which must outlive the queue.
  io::IoCallback Callback() {
    return [this](uint64_t tag, io::IoStatus status) {
      std::lock_guard lock(mu_);
      ++counts_[tag];
      if (!status.ok()) failures_[tag] = std::move(status);
    };
  }
  /// How many times each tag completed.
  std::map<uint64_t, int> counts() const {
    std::lock_guard lock(mu_);
    return counts_;
  }
  /// How many distinct tags completed.
  size_t completed() const {
    std::lock_guard lock(mu_);
    return counts_.size();
  }
  /// The status of each tag that failed.
  std::map<uint64_t, io::IoStatus> failures() const {
    std::lock_guard lock(mu_);
    return failures_;
  }

 private:
  mutable std::mutex mu_;
  std::map<uint64_t, int> counts_;
  std::map<uint64_t, io::IoStatus> failures_;
};

}  // namespace asyncckpt::testing_support
