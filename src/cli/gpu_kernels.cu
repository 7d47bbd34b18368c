// The GPU training loop's kernels (see gpu_kernels.h).

#include "src/cli/gpu_kernels.h"

namespace asyncckpt::gpu {

namespace {

constexpr int kThreads = 256;

int Blocks(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65536 ? blocks : 65536);  // grid-stride beyond
}

__device__ uint32_t Mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  return x ^ (x >> 16);
}

__global__ void Fill(float* data, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    data[i] = static_cast<float>(Mix(seed ^ static_cast<uint32_t>(i)) & 0xFFFF) / 65536.0f;
  }
}

__global__ void Read(const float* data, size_t n, int passes, float* sink) {
  float acc = 0;
  for (int p = 0; p < passes; ++p) {
    for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
         i += size_t{gridDim.x} * blockDim.x) {
      acc += data[i] * (p + 1);
    }
  }
  if (acc == 12345.678f) atomicAdd(sink, acc);  // keeps the loads; almost never taken
}

__global__ void Update(float* data, size_t n, uint32_t step) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float g = static_cast<float>(Mix(step * 2654435761U ^ static_cast<uint32_t>(i)) & 0xFF);
    data[i] = data[i] * 0.999f + g * 1e-4f;
  }
}

__global__ void Checksum(const float* data, size_t n, unsigned long long* sum) {
  unsigned long long acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    acc += static_cast<unsigned long long>(__float_as_uint(data[i])) * (2 * i + 1);
  }
  atomicAdd(sum, acc);
}

}  // namespace

cudaError_t LaunchFill(float* data, size_t n, uint32_t seed, cudaStream_t stream) {
  Fill<<<Blocks(n), kThreads, 0, stream>>>(data, n, seed);
  return cudaGetLastError();
}

cudaError_t LaunchRead(const float* data, size_t n, int passes, float* sink, cudaStream_t stream) {
  Read<<<Blocks(n), kThreads, 0, stream>>>(data, n, passes, sink);
  return cudaGetLastError();
}

cudaError_t LaunchUpdate(float* data, size_t n, uint32_t step, cudaStream_t stream) {
  Update<<<Blocks(n), kThreads, 0, stream>>>(data, n, step);
  return cudaGetLastError();
}

cudaError_t LaunchChecksum(const float* data, size_t n, unsigned long long* sum,
                           cudaStream_t stream) {
  Checksum<<<Blocks(n), kThreads, 0, stream>>>(data, n, sum);
  return cudaGetLastError();
}

}  // namespace asyncckpt::gpu
