// train-sim --device cuda's model (see gpu_model.h).

#include "src/cli/gpu_model.h"

#include <xxhash.h>

#include <string>

#include "src/util/status_macros.h"

#ifdef ASYNCCKPT_CLI_GPU
#include <cuda_runtime_api.h>

#include "src/cli/gpu_kernels.h"
#include "src/util/elapsed.h"
#endif

namespace asyncckpt::cli {

#ifdef ASYNCCKPT_CLI_GPU

namespace {

using gpu::LaunchFill;
using gpu::LaunchRead;
using gpu::LaunchUpdate;

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

Status Cuda(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::OK();
  return Status::IOError("train-sim --device cuda: " + what + ": " + cudaGetErrorString(err));
}

uint32_t Key(uint64_t seed, int64_t step, uint64_t batch_mix, size_t tensor) {
  return static_cast<uint32_t>(XXH3_64bits_withSeed(&step, sizeof(step), seed ^ batch_mix) ^
                               (tensor * 0x9E3779B97F4A7C15ull));
}

constexpr int kReadPasses = 2;  // forward and backward

}  // namespace

Result<std::unique_ptr<GpuModel>> GpuModel::Create(const SimConfig& config,
                                                   bool wait_before_update) {
  if (config.dtype != DType::kF32) {
    return Status::InvalidArgument("train-sim --device cuda holds f32 state only (--dtype f32)");
  }
  if (config.shard) return Status::InvalidArgument("train-sim --device cuda has no --shard");
  std::unique_ptr<GpuModel> model(new GpuModel(config, wait_before_update));
  RETURN_IF_ERROR(model->Build());
  return model;
}

Status GpuModel::Build() {
  auto device = NewCudaDevice(0);
  if (!device.ok()) {
    return device.status().WithContext("train-sim --device cuda needs a CUDA GPU");
  }
  device_ = *device;
  cudaStream_t stream = nullptr;
  RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  compute_ = stream;
  RETURN_IF_ERROR(Cuda(cudaMalloc(&scratch_, 64), "cudaMalloc"));
  const int slots = config_.optimizer == Optimizer::kAdam ? 3 : 1;
  const size_t count = static_cast<size_t>(config_.num_tensors) * slots;
  const size_t elements = config_.state_bytes / count / sizeof(float);
  if (elements == 0) return Status::InvalidArgument("--model_bytes is too small for --tensors");
  const char* kinds[] = {"param", "adam_m", "adam_v"};
  for (int t = 0; t < config_.num_tensors; ++t) {
    for (int s = 0; s < slots; ++s) {
      void* data = nullptr;
      RETURN_IF_ERROR(Cuda(cudaMalloc(&data, elements * sizeof(float)), "cudaMalloc of the state"));
      tensors_.push_back(static_cast<float*>(data));
      elements_.push_back(elements);
      TensorRef ref;
      ref.name = "layer_" + std::to_string(t) + "/" + kinds[s];
      ref.shape = {static_cast<int64_t>(elements)};
      ref.data = data;
      ref.bytes = elements * sizeof(float);
      ref.device = device_;
      RETURN_IF_ERROR(registry_.add(std::move(ref)));
    }
  }
  Reset();
  RETURN_IF_ERROR(status_);
  return MeasureD2H();
}

Status GpuModel::MeasureD2H() {
  uint64_t largest = 0;
  for (size_t e : elements_) largest = std::max<uint64_t>(largest, e * sizeof(float));
  ASSIGN_OR_RETURN(PinnedBuffer pinned, device_->allocate_pinned(largest));
  const auto start = SteadyClock::now();
  for (size_t t = 0; t < tensors_.size(); ++t) {
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(pinned.data(), tensors_[t], elements_[t] * sizeof(float),
                                         cudaMemcpyDeviceToHost, AsStream(compute_)),
                         "D2H yardstick"));
  }
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(AsStream(compute_)), "D2H yardstick"));
  d2h_seconds_ = SecondsSince(start);
  return Status::OK();
}

GpuModel::~GpuModel() {
  if (compute_ != nullptr) cudaStreamSynchronize(AsStream(compute_));
  for (float* data : tensors_) cudaFree(data);
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (compute_ != nullptr) cudaStreamDestroy(AsStream(compute_));
}

void GpuModel::Record(const Status& status) {
  if (status_.ok() && !status.ok()) status_ = status;
}

void GpuModel::Reset() {
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const auto seed = static_cast<uint32_t>(config_.seed * 1000003u + t);
    Record(Cuda(LaunchFill(tensors_[t], elements_[t], seed, AsStream(compute_)), "fill"));
  }
  Record(Cuda(cudaStreamSynchronize(AsStream(compute_)), "reset"));
}

void GpuModel::Step(int64_t step, uint64_t batch_mix) {
  auto* sink = static_cast<float*>(scratch_);
  for (size_t t = 0; t < tensors_.size(); ++t) {
    Record(Cuda(LaunchRead(tensors_[t], elements_[t], kReadPasses, sink, AsStream(compute_)),
                "read phase"));
  }
  // The state changes from here: a stream-ordered snapshot's copies must be over first.
  if (wait_before_update_) Record(WaitForCopiesOnComputeStream(*device_));
  for (size_t t = 0; t < tensors_.size(); ++t) {
    Record(Cuda(LaunchUpdate(tensors_[t], elements_[t], Key(config_.seed, step, batch_mix, t),
                             AsStream(compute_)),
                "update phase"));
  }
  Record(Cuda(cudaStreamSynchronize(AsStream(compute_)), "step"));
}

uint64_t GpuModel::Digest() const {
  std::vector<TensorRef> refs = registry_.tensors();
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<float> host;
  for (const TensorRef& ref : refs) {  // name order, as SimModel's digest
    host.resize(ref.bytes / sizeof(float));
    if (cudaMemcpy(host.data(), ref.data, ref.bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
      host.assign(host.size(), 0);
    }
    XXH3_64bits_update(state, host.data(), ref.bytes);
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

#else  // no CUDA kernels in this build

Result<std::unique_ptr<GpuModel>> GpuModel::Create(const SimConfig&, bool) {
  return Status::Unavailable(
      "train-sim --device cuda: this build has no CUDA kernels (configure with the CUDA "
      "toolkit's nvcc found)");
}
GpuModel::~GpuModel() = default;
void GpuModel::Reset() {}
void GpuModel::Step(int64_t, uint64_t) {}
uint64_t GpuModel::Digest() const { return 0; }

#endif

}  // namespace asyncckpt::cli
