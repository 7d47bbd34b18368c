#pragma once

// The CUDA device: built only when the CUDA toolkit is found (ASYNCCKPT_WITH_CUDA).

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

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
  /// cudaMemcpyAsync on the copy stream, completed by an event.
  Result<std::unique_ptr<CopyFence>> copy_from_host_async(const void* host_src, void* device_dst,
                                                          size_t bytes) override;
  /// One ordering after the compute stream (stream-ordered mode), one cudaMemcpyAsync per
  /// region (split only where a region crosses pieces of a parallel-pinned buffer), one event.
  Result<std::unique_ptr<CopyFence>> copy_regions_to_host_async(
      const std::vector<CopyRegion>& regions) override;
  Status wait_for_copies_on_compute_stream() override;

  /// How allocate_pinned pins memory.
  enum class PinnedAllocation {
    /// One cudaHostAlloc: the driver zeroes and pins every page on the calling thread.
    kHostAlloc,
    /// mmap, then pieces touched and cudaHostRegister'ed on several threads at once.
    kParallelRegister,
  };
  /// allocate_pinned with the way chosen by the caller (the GPU benchmark measures both).
  Result<PinnedBuffer> allocate_pinned_with(size_t bytes, PinnedAllocation how);
  /// The way allocate_pinned picks for `bytes`: ASYNCCKPT_PINNED_ALLOC ("host_alloc" or
  /// "parallel") when set; else one cudaHostAlloc (to be revisited with GPU measurements).
  static PinnedAllocation DefaultAllocation(size_t bytes);

  /// Stream-ordered mode: copies are ordered after work queued on `stream` (a cudaStream_t);
  /// null turns the mode off.
  void set_compute_stream(void* stream);

 private:
  CudaDeviceImpl(int ordinal, void* copy_stream, void* ordered_stream)
      : ordinal_(ordinal), copy_stream_(copy_stream), ordered_stream_(ordered_stream) {}
  Result<PinnedBuffer> AllocateHostAlloc(size_t rounded, size_t bytes);
  Result<PinnedBuffer> AllocateParallel(size_t rounded, size_t bytes);
  // The stream a device-to-host copy goes on now: ordered_stream_ while a compute stream is set
  // (ordered by event), else the blocking copy_stream_. mutex_ held.
  void* SnapshotStreamLocked() const { return compute_stream_ ? ordered_stream_ : copy_stream_; }
  // Enqueues one copy between `device` memory and `host` memory on `stream` (to the host
  // when `to_host`), split where the host side crosses pieces of a parallel-pinned buffer (a
  // copy must stay inside one registration). mutex_ held.
  Status EnqueueLocked(void* stream, void* device, void* host, size_t bytes, bool to_host);
  // Makes the copy stream wait for the compute stream's work so far, if one is set. mutex_ held.
  Status OrderAfterComputeLocked();

  int ordinal_;
  // Blocking (ordered after the legacy default stream): copies with no compute stream, restores.
  void* copy_stream_;
  // Non-blocking: stream-ordered copies, which an event orders after the compute stream. A
  // blocking stream here would also make the legacy default stream (torch's default) wait for
  // every copy, so forward and backward could not overlap it.
  void* ordered_stream_;
  std::mutex mutex_;  // guards compute_stream_ and ordering of enqueues
  void* compute_stream_ = nullptr;
  // Parallel-pinned buffers: first byte -> (end, piece bytes). Shared with their buffers'
  // release, which may run after the device is gone.
  struct PieceTable {
    std::mutex mu;
    std::map<uintptr_t, std::pair<uintptr_t, size_t>> buffers;
  };
  std::shared_ptr<PieceTable> pieces_ = std::make_shared<PieceTable>();
};

}  // namespace asyncckpt
