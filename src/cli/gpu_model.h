#pragma once

// train-sim --device cuda: the model's state in GPU memory. A step has a read phase (kernels that
// read every tensor, standing for forward and backward) and an update phase (a kernel that writes
// every tensor, standing for the optimizer), both on one compute stream, and ends with the
// stream's synchronisation, as a loop that reads its loss does. With stream-ordered saves the
// update first makes the compute stream wait for the snapshot's copies
// (WaitForCopiesOnComputeStream): the read phase overlaps them.

#include <cstdint>
#include <memory>
#include <vector>

#include "asyncckpt/device.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"
#include "src/cli/sim_model.h"

namespace asyncckpt::cli {

/// The state of SimConfig (f32 only) in GPU memory of cuda:0.
class GpuModel final : public TrainModel {
 public:
  /// Unavailable, saying why, when this build has no CUDA kernels or no GPU is visible;
  /// InvalidArgument for a dtype other than f32 or --shard. `wait_before_update`: stream-ordered
  /// saves, whose copies the update must wait for.
  static Result<std::unique_ptr<GpuModel>> Create(const SimConfig& config, bool wait_before_update);
  ~GpuModel() override;

  const TensorRegistry& registry() const override { return registry_; }
  void Reset() override;
  void Step(int64_t step, uint64_t batch_mix) override;
  /// Copies every tensor to the host to hash it (the end of a run only).
  uint64_t Digest() const override;
  Status status() const override { return status_; }
  /// The GPU.
  const std::shared_ptr<Device>& device() const { return device_; }
  /// The compute stream (a cudaStream_t).
  void* compute_stream() const { return compute_; }
  /// Seconds one copy of the whole state into pinned host memory takes (measured by Create):
  /// the yardstick of what a save may cost the loop.
  double d2h_seconds() const { return d2h_seconds_; }

 private:
  GpuModel(const SimConfig& config, bool wait_before_update)
      : config_(config), wait_before_update_(wait_before_update) {}
  Status Build();
  Status MeasureD2H();
  void Record(const Status& status);

  SimConfig config_;
  bool wait_before_update_;
  std::shared_ptr<Device> device_;
  void* compute_ = nullptr;
  void* scratch_ = nullptr;
  std::vector<float*> tensors_;
  std::vector<size_t> elements_;
  TensorRegistry registry_;
  Status status_;
  double d2h_seconds_ = 0;
};

}  // namespace asyncckpt::cli
