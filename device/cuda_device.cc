// The CUDA device: pinned staging (one cudaHostAlloc, or mmap pinned in parallel pieces),
// device-to-host copies on a copy stream, and stream-ordered mode's orderings.

#include "device/cuda_device.h"

#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace asyncckpt {

namespace {

Status CudaError(cudaError_t err, const std::string& what) {
  return Status::IOError(what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                         ")");
}

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

constexpr size_t kPinnedAlignment = 4096;

// Makes `ordinal` the calling thread's current device for the guard's life, then gives the
// caller back the device it had: the library runs on the training thread and must not change
// which GPU that thread's later calls go to.
class ScopedDevice {
 public:
  explicit ScopedDevice(int ordinal) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ == ordinal) {
      previous_ = -1;  // nothing to give back
    } else {
      error_ = cudaSetDevice(ordinal);
    }
  }
  ~ScopedDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  /// The failure of making the device current, if any.
  cudaError_t error() const { return error_; }

 private:
  int previous_ = -1;
  cudaError_t error_ = cudaSuccess;
};

// Completion of one copy: a CUDA event recorded on the copy stream after the copy.
class CudaFence final : public CopyFence {
 public:
  CudaFence(int ordinal, cudaEvent_t event) : ordinal_(ordinal), event_(event) {}
  ~CudaFence() override { cudaEventDestroy(event_); }
  Status wait() override {
    ScopedDevice on(ordinal_);
    cudaError_t err = cudaEventSynchronize(event_);
    return err == cudaSuccess ? Status::OK() : CudaError(err, "waiting for a device copy");
  }
  bool ready() override { return cudaEventQuery(event_) == cudaSuccess; }

 private:
  int ordinal_;
  cudaEvent_t event_;
};

}  // namespace

bool CudaAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

Result<std::shared_ptr<Device>> NewCudaDevice(int ordinal) {
  auto device = CudaDeviceImpl::Open(ordinal);
  if (!device.ok()) return device.status();
  return std::shared_ptr<Device>(std::move(device).value());
}

Status SetCudaComputeStream(Device& device, void* cuda_stream) {
  auto* cuda = dynamic_cast<CudaDeviceImpl*>(&device);
  if (cuda == nullptr) {
    return Status::FailedPrecondition("device " + device.name() + " is not a CUDA device");
  }
  cuda->set_compute_stream(cuda_stream);
  return Status::OK();
}

Result<std::shared_ptr<CudaDeviceImpl>> CudaDeviceImpl::Open(int ordinal) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    return Status::Unavailable("no CUDA GPU is visible (" + std::string(cudaGetErrorName(err)) +
                               ")");
  }
  if (ordinal < 0 || ordinal >= count) {
    return Status::InvalidArgument("CUDA device " + std::to_string(ordinal) +
                                   " does not exist; this machine has " + std::to_string(count));
  }
  ScopedDevice on(ordinal);
  if (on.error() != cudaSuccess) return CudaError(on.error(), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  // A blocking stream: without a compute stream, copies then start only after the work queued
  // on the legacy default stream, so a job that computes there never snapshots half a step.
  if ((err = cudaStreamCreateWithFlags(&stream, cudaStreamDefault)) != cudaSuccess) {
    return CudaError(err, "creating the copy stream");
  }
  cudaStream_t ordered = nullptr;
  if ((err = cudaStreamCreateWithFlags(&ordered, cudaStreamNonBlocking)) != cudaSuccess) {
    cudaStreamDestroy(stream);
    return CudaError(err, "creating the stream-ordered copy stream");
  }
  return std::shared_ptr<CudaDeviceImpl>(new CudaDeviceImpl(ordinal, stream, ordered));
}

CudaDeviceImpl::~CudaDeviceImpl() {
  ScopedDevice on(ordinal_);
  for (void* stream : {copy_stream_, ordered_stream_}) {
    cudaStreamSynchronize(AsStream(stream));
    cudaStreamDestroy(AsStream(stream));
  }
}

CudaDeviceImpl::PinnedAllocation CudaDeviceImpl::DefaultAllocation(size_t bytes) {
  (void)bytes;
  const char* how = std::getenv("ASYNCCKPT_PINNED_ALLOC");
  if (how != nullptr && std::strcmp(how, "parallel") == 0)
    return PinnedAllocation::kParallelRegister;
  return PinnedAllocation::kHostAlloc;
}

Result<PinnedBuffer> CudaDeviceImpl::allocate_pinned(size_t bytes) {
  return allocate_pinned_with(bytes, DefaultAllocation(bytes));
}

Result<PinnedBuffer> CudaDeviceImpl::allocate_pinned_with(size_t bytes, PinnedAllocation how) {
  // Whole pages, as on the host device, so O_DIRECT I/O of the last block stays inside.
  const size_t rounded =
      std::max<size_t>(1, (bytes + kPinnedAlignment - 1) / kPinnedAlignment) * kPinnedAlignment;
  if (how == PinnedAllocation::kParallelRegister) return AllocateParallel(rounded, bytes);
  return AllocateHostAlloc(rounded, bytes);
}

Result<PinnedBuffer> CudaDeviceImpl::AllocateHostAlloc(size_t rounded, size_t bytes) {
  ScopedDevice on(ordinal_);
  void* base = nullptr;
  cudaError_t err = cudaHostAlloc(&base, rounded, cudaHostAllocPortable);
  if (err == cudaSuccess && reinterpret_cast<uintptr_t>(base) % kPinnedAlignment != 0) {
    // CUDA promises only 256-byte alignment; O_DIRECT needs pages, so align by hand.
    cudaFreeHost(base);
    base = nullptr;
    err = cudaHostAlloc(&base, rounded + kPinnedAlignment, cudaHostAllocPortable);
  }
  if (err != cudaSuccess) {
    return CudaError(err, "cudaHostAlloc of " + std::to_string(bytes) + " bytes on " + name());
  }
  const uintptr_t address = reinterpret_cast<uintptr_t>(base);
  void* data = reinterpret_cast<void*>((address + kPinnedAlignment - 1) / kPinnedAlignment *
                                       kPinnedAlignment);
  return PinnedBuffer(data, bytes, [base](void*) { cudaFreeHost(base); });
}

namespace {

// Pieces of a parallel pinning: large enough that each registration is cheap to look up, small
// enough that every thread gets several.
constexpr size_t kMinPinPieceBytes = 256ull << 20;

// Touches (the kernel zeroes the pages) and registers piece `i` of [base, base + rounded).
cudaError_t PinPiece(int ordinal, uint8_t* base, size_t rounded, size_t piece, size_t i) {
  ScopedDevice on(ordinal);
  if (on.error() != cudaSuccess) return on.error();
  const size_t offset = i * piece;
  const size_t length = std::min(piece, rounded - offset);
  std::memset(base + offset, 0, length);
  return cudaHostRegister(base + offset, length, cudaHostRegisterPortable);
}

}  // namespace

Result<PinnedBuffer> CudaDeviceImpl::AllocateParallel(size_t rounded, size_t bytes) {
  void* mapped = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {
    return Status::Unavailable("mmap of " + std::to_string(rounded) + " bytes of staging failed");
  }
  auto* base = static_cast<uint8_t*>(mapped);
  const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
  const size_t piece = std::max(kMinPinPieceBytes, (rounded / threads + kPinnedAlignment - 1) /
                                                       kPinnedAlignment * kPinnedAlignment);
  const size_t count = (rounded + piece - 1) / piece;
  std::vector<cudaError_t> results(count, cudaSuccess);
  std::atomic<size_t> next{0};
  std::vector<std::thread> crew;
  for (unsigned t = 0; t < std::min<size_t>(threads, count); ++t) {
    crew.emplace_back([&] {
      for (size_t i = next++; i < count; i = next++) {
        results[i] = PinPiece(ordinal_, base, rounded, piece, i);
      }
    });
  }
  for (auto& thread : crew) thread.join();
  auto release = [base, rounded, piece, count, results](void*) {
    for (size_t i = 0; i < count; ++i) {
      if (results[i] == cudaSuccess) cudaHostUnregister(base + i * piece);
    }
    munmap(base, rounded);
  };
  for (cudaError_t err : results) {
    if (err == cudaSuccess) continue;
    release(nullptr);
    return CudaError(err, "cudaHostRegister of " + std::to_string(bytes) + " bytes on " + name());
  }
  const uintptr_t first = reinterpret_cast<uintptr_t>(base);
  {
    std::lock_guard lock(pieces_->mu);
    pieces_->buffers[first] = {first + rounded, piece};
  }
  return PinnedBuffer(base, bytes, [table = pieces_, first, release](void*) {
    {
      std::lock_guard lock(table->mu);
      table->buffers.erase(first);
    }
    release(nullptr);
  });
}

Status CudaDeviceImpl::OrderAfterComputeLocked() {
  if (compute_stream_ == nullptr) return Status::OK();
  // The snapshot must see every write the compute stream queued before the save.
  cudaEvent_t ready = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  if (err != cudaSuccess) return CudaError(err, "cudaEventCreate");
  err = cudaEventRecord(ready, AsStream(compute_stream_));
  if (err == cudaSuccess) err = cudaStreamWaitEvent(AsStream(ordered_stream_), ready, 0);
  cudaEventDestroy(ready);
  return err == cudaSuccess ? Status::OK()
                            : CudaError(err, "ordering the copy after the compute stream");
}

Status CudaDeviceImpl::EnqueueLocked(void* stream, void* device, void* host, size_t bytes,
                                     bool to_host) {
  const auto dst = reinterpret_cast<uintptr_t>(host);
  size_t piece = bytes;  // one copy, unless dst lies in a parallel-pinned buffer
  uintptr_t base = dst;
  {
    std::lock_guard lock(pieces_->mu);
    if (auto it = pieces_->buffers.upper_bound(dst); it != pieces_->buffers.begin()) {
      --it;
      if (dst < it->second.first) {
        base = it->first;
        piece = it->second.second;
      }
    }
  }
  for (size_t done = 0; done < bytes;) {
    const uintptr_t at = dst + done;
    const size_t room = piece - (at - base) % piece;  // to the end of at's piece
    const size_t length = std::min(bytes - done, room);
    void* on_host = reinterpret_cast<void*>(at);
    void* on_device = static_cast<uint8_t*>(device) + done;
    const cudaError_t err =
        to_host
            ? cudaMemcpyAsync(on_host, on_device, length, cudaMemcpyDeviceToHost, AsStream(stream))
            : cudaMemcpyAsync(on_device, on_host, length, cudaMemcpyHostToDevice, AsStream(stream));
    if (err != cudaSuccess) {
      return CudaError(
          err, to_host ? "cudaMemcpyAsync device to host" : "cudaMemcpyAsync host to device");
    }
    done += length;
  }
  return Status::OK();
}

Result<std::unique_ptr<CopyFence>> CudaDeviceImpl::copy_to_host_async(const void* device_src,
                                                                      void* host_dst,
                                                                      size_t bytes) {
  return copy_regions_to_host_async({CopyRegion{device_src, host_dst, bytes}});
}

Result<std::unique_ptr<CopyFence>> CudaDeviceImpl::copy_regions_to_host_async(
    const std::vector<CopyRegion>& regions) {
  ScopedDevice on(ordinal_);
  std::lock_guard lock(mutex_);
  Status status = OrderAfterComputeLocked();
  if (!status.ok()) return status;
  void* stream = SnapshotStreamLocked();
  for (const CopyRegion& region : regions) {
    if (region.bytes == 0) continue;
    // The device side is only read: the const is cast away for EnqueueLocked's two directions.
    status = EnqueueLocked(stream, const_cast<void*>(region.device_src), region.host_dst,
                           region.bytes, /*to_host=*/true);
    if (!status.ok()) break;
  }
  cudaEvent_t done = nullptr;
  cudaError_t err = cudaSuccess;
  if (status.ok() &&
      (err = cudaEventCreateWithFlags(&done, cudaEventDisableTiming)) == cudaSuccess &&
      (err = cudaEventRecord(done, AsStream(stream))) == cudaSuccess) {
    return std::unique_ptr<CopyFence>(std::make_unique<CudaFence>(ordinal_, done));
  }
  if (done != nullptr) cudaEventDestroy(done);
  // The caller frees host_dst on failure: the copies already queued must not land in it later.
  cudaStreamSynchronize(AsStream(stream));
  if (!status.ok()) return status;
  return CudaError(err, "recording the completion of a device copy on " + name());
}

Status CudaDeviceImpl::copy_from_host(const void* host_src, void* device_dst, size_t bytes) {
  if (bytes == 0) return Status::OK();
  auto fence = copy_from_host_async(host_src, device_dst, bytes);
  if (!fence.ok()) return fence.status();
  return (*fence)->wait();
}

Result<std::unique_ptr<CopyFence>> CudaDeviceImpl::copy_from_host_async(const void* host_src,
                                                                        void* device_dst,
                                                                        size_t bytes) {
  ScopedDevice on(ordinal_);
  std::lock_guard lock(mutex_);
  // The host side is only read: the const is cast away for EnqueueLocked's two directions.
  Status status = EnqueueLocked(copy_stream_, device_dst, const_cast<void*>(host_src), bytes,
                                /*to_host=*/false);
  if (!status.ok()) {
    cudaStreamSynchronize(AsStream(copy_stream_));
    return status;
  }
  cudaError_t err = cudaSuccess;
  cudaEvent_t done = nullptr;
  if ((err = cudaEventCreateWithFlags(&done, cudaEventDisableTiming)) == cudaSuccess &&
      (err = cudaEventRecord(done, AsStream(copy_stream_))) == cudaSuccess) {
    return std::unique_ptr<CopyFence>(std::make_unique<CudaFence>(ordinal_, done));
  }
  if (done != nullptr) cudaEventDestroy(done);
  // The caller may reuse host_src on failure: what was queued must be over first.
  cudaStreamSynchronize(AsStream(copy_stream_));
  return CudaError(err, "copy host to device");
}

void CudaDeviceImpl::set_compute_stream(void* stream) {
  std::lock_guard lock(mutex_);
  compute_stream_ = stream;
}

Status CudaDeviceImpl::wait_for_copies_on_compute_stream() {
  ScopedDevice on(ordinal_);
  std::lock_guard lock(mutex_);
  if (compute_stream_ == nullptr) {
    return Status::FailedPrecondition("stream-ordered mode needs a compute stream");
  }
  // Both streams: a snapshot taken while no compute stream was set went on the blocking one.
  for (void* stream : {ordered_stream_, copy_stream_}) {
    cudaEvent_t done = nullptr;
    cudaError_t err = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (err != cudaSuccess) return CudaError(err, "cudaEventCreate");
    err = cudaEventRecord(done, AsStream(stream));
    if (err == cudaSuccess) err = cudaStreamWaitEvent(AsStream(compute_stream_), done, 0);
    cudaEventDestroy(done);
    if (err != cudaSuccess) return CudaError(err, "ordering compute after the copies");
  }
  return Status::OK();
}

}  // namespace asyncckpt
