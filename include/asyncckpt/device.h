#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/status.h"

namespace asyncckpt {

/// Where a tensor's buffer lives.
enum class DeviceKind { kHost, kCuda };

/// Host memory that a device can copy into and out of at full speed (page-locked where the
/// device needs it). Owns the memory; frees it through the device that made it. Move-only.
class PinnedBuffer {
 public:
  /// An empty buffer.
  PinnedBuffer() = default;
  /// Takes ownership of data, released with free_fn.
  PinnedBuffer(void* data, size_t size, std::function<void(void*)> free_fn)
      : data_(data), size_(size), free_(std::move(free_fn)) {}
  PinnedBuffer(PinnedBuffer&& other) noexcept { *this = std::move(other); }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      free_ = std::move(other.free_);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { reset(); }

  /// The first byte (aligned to at least 4096).
  void* data() const { return data_; }
  /// Bytes owned.
  size_t size() const { return size_; }
  /// Frees the memory now.
  void reset() {
    if (data_ != nullptr && free_) free_(data_);
    data_ = nullptr;
    size_ = 0;
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  std::function<void(void*)> free_;
};

/// Completion of an asynchronous copy. wait() may be called from any thread, more than once.
class CopyFence {
 public:
  virtual ~CopyFence() = default;
  /// Blocks until the copy is complete; the copy's failure, if any.
  virtual Status wait() = 0;
  /// True once the copy is complete (never blocks).
  virtual bool ready() = 0;
};

/// One piece of a batched device-to-host copy (Device::copy_regions_to_host_async).
struct CopyRegion {
  /// Memory of the device.
  const void* device_src = nullptr;
  /// Host memory (pinned by the device).
  void* host_dst = nullptr;
  /// Bytes to copy.
  size_t bytes = 0;
};

/// A place tensors live: the host, or an accelerator. Implementations are thread-safe.
class Device {
 public:
  virtual ~Device() = default;
  /// Host or CUDA.
  virtual DeviceKind kind() const = 0;
  /// "host" or "cuda:0".
  virtual std::string name() const = 0;
  /// Allocates `bytes` of pinned host memory (4096-aligned) that copies to and from this
  /// device run at full speed into.
  virtual Result<PinnedBuffer> allocate_pinned(size_t bytes) = 0;
  /// Starts copying `bytes` from `device_src` (memory of this device) into `host_dst`;
  /// the fence says when it is done. The caller keeps both buffers alive until then.
  virtual Result<std::unique_ptr<CopyFence>> copy_to_host_async(const void* device_src,
                                                                void* host_dst, size_t bytes) = 0;
  /// Copies `bytes` from host memory into this device's memory and waits for it.
  virtual Status copy_from_host(const void* host_src, void* device_dst, size_t bytes) = 0;
  /// Copies `bytes` into host memory and waits for it.
  Status copy_to_host(const void* device_src, void* host_dst, size_t bytes);
  /// Starts copying `bytes` from host memory (pinned by this device, for full speed) into this
  /// device's memory; the fence says when it is done. The default copies synchronously.
  virtual Result<std::unique_ptr<CopyFence>> copy_from_host_async(const void* host_src,
                                                                  void* device_dst, size_t bytes);
  /// Starts every copy of `regions`, in order, and returns one fence for them all: the whole
  /// enqueue of a stream-ordered snapshot, so its cost follows the number of regions (one per
  /// contiguous tensor), not their bytes. The CUDA device orders the batch once after its compute
  /// stream, issues one cudaMemcpyAsync per region and records one event. The default starts
  /// each region with copy_to_host_async and its fence waits for all of them. The caller keeps
  /// every buffer alive until the fence is done.
  virtual Result<std::unique_ptr<CopyFence>> copy_regions_to_host_async(
      const std::vector<CopyRegion>& regions);
  /// Stream-ordered mode: makes the compute stream wait (on the device, not the host) for every
  /// copy started so far. FailedPrecondition on a device without a compute stream (the default).
  virtual Status wait_for_copies_on_compute_stream();
};

/// The process-wide host device (ordinary memory).
std::shared_ptr<Device> HostDevice();

/// True when this build has the CUDA device and at least one GPU is visible.
bool CudaAvailable();

/// The CUDA device for GPU `ordinal`; Unavailable when this build has no CUDA device or the
/// machine has no such GPU.
Result<std::shared_ptr<Device>> NewCudaDevice(int ordinal = 0);

/// Stream-ordered mode of a CUDA device: every snapshot copy is ordered after the work queued on
/// `cuda_stream` (a cudaStream_t) so far; null turns the mode off. FailedPrecondition for a
/// device that is not CUDA.
Status SetCudaComputeStream(Device& device, void* cuda_stream);

/// Makes the compute stream set by SetCudaComputeStream wait (on the GPU, not the host) for
/// every copy started so far, so that no later kernel overwrites state still being copied.
/// Call it right before the state changes (the optimizer's update), not right after save():
/// the forward and backward passes between the two only read the state, so the copy overlaps
/// them. A saver with SaverOptions::cuda_defer_compute_wait off calls it at the end of each
/// stream-ordered save itself. Costs a few microseconds of the host; never waits on it.
/// FailedPrecondition for a device without a compute stream.
Status WaitForCopiesOnComputeStream(Device& device);

}  // namespace asyncckpt
