#pragma once

// The CUDA device: built only when the CUDA toolkit is found (ASYNCCKPT_WITH_CUDA).

#include <memory>
#include <mutex>

#include "asyncckpt/device.h"

namespace asyncckpt {

/// GPU memory of one CUDA device. Pinned memory comes from cudaHostAlloc (whole pages, 4096-
/// aligned); device-to-host copies run with cudaMemcpyAsync on a dedicated copy stream and
/// complete on a CUDA event. The copy stream is a blocking stream: every copy starts after the
/// work queued on the legacy default stream before it. Work on other streams is not waited for
/// unless a compute stream is set (stream-ordered mode): then every copy first waits on the
/// compute stream's work so far, and wait_for_copies_on_compute_stream() makes later compute
/// wait for the copies; without one, the caller synchronizes such streams before a save.
/// Every call leaves the calling thread's current CUDA device as it found it.
class CudaDeviceImpl final : public Device {
 public:
  /// Opens GPU `ordinal` and creates its copy stream.
  static Result<std::shared_ptr<CudaDeviceImpl>> Open(int ordinal);
  ~CudaDeviceImpl() override;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return "cuda:" + std::to_string(ordinal_); }
  Result<PinnedBuffer> allocate_pinned(size_t bytes) override;
  Result<std::unique_ptr<CopyFence>> copy_to_host_async(const void* device_src, void* host_dst,
                                                        size_t bytes) override;
  Status copy_from_host(const void* host_src, void* device_dst, size_t bytes) override;

  /// Stream-ordered mode: copies are ordered after work queued on `stream` (a cudaStream_t);
  /// null turns the mode off.
  void set_compute_stream(void* stream);
  /// Makes the compute stream wait (on the GPU, not the host) for every copy started so far.
  Status wait_for_copies_on_compute_stream();

 private:
  CudaDeviceImpl(int ordinal, void* copy_stream) : ordinal_(ordinal), copy_stream_(copy_stream) {}

  int ordinal_;
  void* copy_stream_;
  std::mutex mutex_;  // guards compute_stream_ and ordering of enqueues on the copy stream
  void* compute_stream_ = nullptr;
};

}  // namespace asyncckpt
