#pragma once

// Kernels of the GPU training loop (train-sim --device cuda, benchmarks/gpu/gpu_run.cc): a read
// phase that stands for forward and backward (reads every element, writes nothing of the state),
// an update phase that stands for the optimizer (writes every element), a fill and a checksum.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace asyncckpt::gpu {

/// Fills `n` floats with a pure function of (seed, index).
cudaError_t LaunchFill(float* data, size_t n, uint32_t seed, cudaStream_t stream);
/// Reads every element `passes` times and adds a reduction into *sink (state untouched).
cudaError_t LaunchRead(const float* data, size_t n, int passes, float* sink, cudaStream_t stream);
/// Writes every element: a pure function of (old value, key, index).
cudaError_t LaunchUpdate(float* data, size_t n, uint32_t key, cudaStream_t stream);
/// Adds a position-weighted sum of the bits of every element into *sum (bit-exact identity).
cudaError_t LaunchChecksum(const float* data, size_t n, unsigned long long* sum,
                           cudaStream_t stream);

}  // namespace asyncckpt::gpu
