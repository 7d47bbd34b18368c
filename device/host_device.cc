// The host device, and what every Device shares: the synchronous copy, batched copies and the
// stream-ordered calls' defaults.

#include "device/host_device.h"

#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "device/streaming_copy.h"

namespace asyncckpt {

namespace {
constexpr size_t kPinnedAlignment = 4096;

// The fences of a batch started one region at a time: done when all are.
class FenceGroup final : public CopyFence {
 public:
  explicit FenceGroup(std::vector<std::unique_ptr<CopyFence>> fences)
      : fences_(std::move(fences)) {}
  Status wait() override {
    Status first;
    for (auto& fence : fences_) {
      Status status = fence->wait();
      if (first.ok() && !status.ok()) first = status;
    }
    return first;
  }
  bool ready() override {
    for (auto& fence : fences_) {
      if (!fence->ready()) return false;
    }
    return true;
  }

 private:
  std::vector<std::unique_ptr<CopyFence>> fences_;
};

}  // namespace

Result<std::unique_ptr<CopyFence>> Device::copy_regions_to_host_async(
    const std::vector<CopyRegion>& regions) {
  std::vector<std::unique_ptr<CopyFence>> fences;
  fences.reserve(regions.size());
  for (const CopyRegion& region : regions) {
    auto fence = copy_to_host_async(region.device_src, region.host_dst, region.bytes);
    if (!fence.ok()) {
      // The caller frees the buffers on failure: the copies already started must land first.
      (void)FenceGroup(std::move(fences)).wait();
      return fence.status();
    }
    fences.push_back(std::move(fence).value());
  }
  return std::unique_ptr<CopyFence>(std::make_unique<FenceGroup>(std::move(fences)));
}

Result<std::unique_ptr<CopyFence>> Device::copy_from_host_async(const void* host_src,
                                                                void* device_dst, size_t bytes) {
  Status status = copy_from_host(host_src, device_dst, bytes);
  if (!status.ok()) return status;
  return std::unique_ptr<CopyFence>(std::make_unique<ReadyFence>());
}

Status Device::wait_for_copies_on_compute_stream() {
  return Status::FailedPrecondition("device " + name() +
                                    " has no compute stream (stream-ordered mode is CUDA's)");
}

Status WaitForCopiesOnComputeStream(Device& device) {
  return device.wait_for_copies_on_compute_stream();
}

Status Device::copy_to_host(const void* device_src, void* host_dst, size_t bytes) {
  auto fence = copy_to_host_async(device_src, host_dst, bytes);
  if (!fence.ok()) return fence.status();
  return (*fence)->wait();
}

std::shared_ptr<Device> HostDevice() {
  static const std::shared_ptr<Device> device = std::make_shared<HostDeviceImpl>();
  return device;
}

Result<PinnedBuffer> HostDeviceImpl::allocate_pinned(size_t bytes) {
  // Rounded up so O_DIRECT writes of the last block stay inside the allocation.
  const size_t rounded = (bytes + kPinnedAlignment - 1) / kPinnedAlignment * kPinnedAlignment;
  void* data = std::aligned_alloc(kPinnedAlignment, rounded == 0 ? kPinnedAlignment : rounded);
  if (data == nullptr) {
    return Status::Unavailable("cannot allocate " + std::to_string(bytes) +
                               " bytes of host staging memory");
  }
  return PinnedBuffer(data, bytes, [](void* p) { std::free(p); });
}

Result<std::unique_ptr<CopyFence>> HostDeviceImpl::copy_to_host_async(const void* device_src,
                                                                      void* host_dst,
                                                                      size_t bytes) {
  // The destination is staging, read back only by the encoder and the writer much later.
  StreamingCopy(host_dst, device_src, bytes);
  return std::unique_ptr<CopyFence>(std::make_unique<ReadyFence>());
}

Status HostDeviceImpl::copy_from_host(const void* host_src, void* device_dst, size_t bytes) {
  if (bytes > 0) std::memcpy(device_dst, host_src, bytes);
  return Status::OK();
}

#ifndef ASYNCCKPT_WITH_CUDA
bool CudaAvailable() { return false; }

Result<std::shared_ptr<Device>> NewCudaDevice(int ordinal) {
  return Status::Unavailable("asyncckpt was built without the CUDA device; cannot open cuda:" +
                             std::to_string(ordinal));
}

Status SetCudaComputeStream(Device& device, void* cuda_stream) {
  (void)cuda_stream;
  return Status::FailedPrecondition("device " + device.name() +
                                    " is not a CUDA device (this build has no CUDA device)");
}
#endif

}  // namespace asyncckpt
