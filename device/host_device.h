#pragma once

#include <memory>

#include "asyncckpt/device.h"

namespace asyncckpt {

/// Ordinary host memory. Copies run on the calling thread and complete before
/// copy_to_host_async returns (the engine runs many of them in parallel); copies into staging
/// use streaming stores (StreamingCopy), restores a plain memcpy.
class HostDeviceImpl final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kHost; }
  std::string name() const override { return "host"; }
  Result<PinnedBuffer> allocate_pinned(size_t bytes) override;
  Result<std::unique_ptr<CopyFence>> copy_to_host_async(const void* device_src, void* host_dst,
                                                        size_t bytes) override;
  Status copy_from_host(const void* host_src, void* device_dst, size_t bytes) override;
};

/// A fence that is complete from the start.
class ReadyFence final : public CopyFence {
 public:
  Status wait() override { return Status::OK(); }
  bool ready() override { return true; }
};

}  // namespace asyncckpt
