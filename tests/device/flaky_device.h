#pragma once

// Test support: host memory behind a Device whose copies can be made to throw, to fail, or to
// hand back a failing fence, to check how the engine turns each into a save's failure.

#include <atomic>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>

#include "asyncckpt/device.h"

namespace asyncckpt::testing_support {

/// Copies through HostDevice() while `mode` is kOk. kThrow throws "copy engine hung", kFail
/// returns an IOError naming "ECC error", kFenceFails returns a fence whose wait() fails with
/// "illegal address".
class FlakyDevice final : public Device {
 public:
  enum class Mode { kOk, kThrow, kFail, kFenceFails };
  DeviceKind kind() const override { return DeviceKind::kHost; }
  std::string name() const override { return "flaky"; }
  Result<PinnedBuffer> allocate_pinned(size_t bytes) override {
    return HostDevice()->allocate_pinned(bytes);
  }
  Result<std::unique_ptr<CopyFence>> copy_to_host_async(const void* src, void* dst,
                                                        size_t bytes) override {
    switch (mode.load()) {
      case Mode::kThrow:
        throw std::runtime_error("copy engine hung");
      case Mode::kFail:
        return Status::IOError("copy failed: ECC error");
      case Mode::kFenceFails:
        return std::unique_ptr<CopyFence>(std::make_unique<FailingFence>());
      case Mode::kOk:
        break;
    }
    return HostDevice()->copy_to_host_async(src, dst, bytes);
  }
  Status copy_from_host(const void* src, void* dst, size_t bytes) override {
    return HostDevice()->copy_from_host(src, dst, bytes);
  }
  std::atomic<Mode> mode{Mode::kOk};

 private:
  class FailingFence final : public CopyFence {
   public:
    Status wait() override { return Status::IOError("stream reported an illegal address"); }
    bool ready() override { return true; }
  };
};

}  // namespace asyncckpt::testing_support
