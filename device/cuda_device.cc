#include "device/cuda_device.h"

#include <cuda_runtime_api.h>

#include <string>

namespace asyncckpt {

namespace {

Status CudaError(cudaError_t err, const std::string& what) {
  return Status::IOError(what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                         ")");
}

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Completion of one copy: a CUDA event recorded on the copy stream after the copy.
class CudaFence final : public CopyFence {
 public:
  CudaFence(int ordinal, cudaEvent_t event) : ordinal_(ordinal), event_(event) {}
  ~CudaFence() override { cudaEventDestroy(event_); }
  Status wait() override {
    cudaSetDevice(ordinal_);
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

Status WaitForCopiesOnComputeStream(Device& device) {
  auto* cuda = dynamic_cast<CudaDeviceImpl*>(&device);
  if (cuda == nullptr) {
    return Status::FailedPrecondition("device " + device.name() + " is not a CUDA device");
  }
  return cuda->wait_for_copies_on_compute_stream();
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
  if ((err = cudaSetDevice(ordinal)) != cudaSuccess) return CudaError(err, "cudaSetDevice");
  cudaStream_t stream = nullptr;
  if ((err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess) {
    return CudaError(err, "creating the copy stream");
  }
  return std::shared_ptr<CudaDeviceImpl>(new CudaDeviceImpl(ordinal, stream));
}

CudaDeviceImpl::~CudaDeviceImpl() {
  cudaSetDevice(ordinal_);
  cudaStreamSynchronize(AsStream(copy_stream_));
  cudaStreamDestroy(AsStream(copy_stream_));
}

Result<PinnedBuffer> CudaDeviceImpl::allocate_pinned(size_t bytes) {
  cudaSetDevice(ordinal_);
  void* data = nullptr;
  cudaError_t err = cudaHostAlloc(&data, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    return CudaError(err, "cudaHostAlloc of " + std::to_string(bytes) + " bytes");
  }
  return PinnedBuffer(data, bytes, [](void* p) { cudaFreeHost(p); });
}

Result<std::unique_ptr<CopyFence>> CudaDeviceImpl::copy_to_host_async(const void* device_src,
                                                                      void* host_dst,
                                                                      size_t bytes) {
  cudaSetDevice(ordinal_);
  std::lock_guard lock(mutex_);
  cudaError_t err;
  if (compute_stream_ != nullptr) {
    // The snapshot must see every write the compute stream queued before the save.
    cudaEvent_t ready = nullptr;
    if ((err = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming)) != cudaSuccess) {
      return CudaError(err, "cudaEventCreate");
    }
    err = cudaEventRecord(ready, AsStream(compute_stream_));
    if (err == cudaSuccess) err = cudaStreamWaitEvent(AsStream(copy_stream_), ready, 0);
    cudaEventDestroy(ready);
    if (err != cudaSuccess) return CudaError(err, "ordering the copy after the compute stream");
  }
  if (bytes > 0) {
    err = cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost,
                          AsStream(copy_stream_));
    if (err != cudaSuccess) return CudaError(err, "cudaMemcpyAsync device to host");
  }
  cudaEvent_t done = nullptr;
  if ((err = cudaEventCreateWithFlags(&done, cudaEventDisableTiming)) != cudaSuccess) {
    return CudaError(err, "cudaEventCreate");
  }
  if ((err = cudaEventRecord(done, AsStream(copy_stream_))) != cudaSuccess) {
    cudaEventDestroy(done);
    return CudaError(err, "cudaEventRecord");
  }
  return std::unique_ptr<CopyFence>(std::make_unique<CudaFence>(ordinal_, done));
}

Status CudaDeviceImpl::copy_from_host(const void* host_src, void* device_dst, size_t bytes) {
  if (bytes == 0) return Status::OK();
  cudaSetDevice(ordinal_);
  cudaError_t err;
  {
    std::lock_guard lock(mutex_);
    err = cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice,
                          AsStream(copy_stream_));
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(AsStream(copy_stream_));
  return err == cudaSuccess ? Status::OK() : CudaError(err, "copy host to device");
}

void CudaDeviceImpl::set_compute_stream(void* stream) {
  std::lock_guard lock(mutex_);
  compute_stream_ = stream;
}

Status CudaDeviceImpl::wait_for_copies_on_compute_stream() {
  cudaSetDevice(ordinal_);
  std::lock_guard lock(mutex_);
  if (compute_stream_ == nullptr) {
    return Status::FailedPrecondition("stream-ordered mode needs a compute stream");
  }
  cudaEvent_t done = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (err != cudaSuccess) return CudaError(err, "cudaEventCreate");
  err = cudaEventRecord(done, AsStream(copy_stream_));
  if (err == cudaSuccess) err = cudaStreamWaitEvent(AsStream(compute_stream_), done, 0);
  cudaEventDestroy(done);
  return err == cudaSuccess ? Status::OK() : CudaError(err, "ordering compute after the copies");
}

}  // namespace asyncckpt
