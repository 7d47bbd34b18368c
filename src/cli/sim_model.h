#pragma once

// The synthetic model that `asyncckpt train-sim` trains: a set of xtensor arrays (parameters
// and, for Adam, two moments each) that every step updates element by element. The update is a
// pure function of (seed, step, batch, old state), so the state at step S is the same whether
// the job ran straight through or was resumed from a checkpoint.

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>
#include <xtensor/xarray.hpp>

#include "asyncckpt/dtype.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"

namespace asyncckpt::cli {

/// The optimizer whose state the model carries.
enum class Optimizer { kSgd, kAdam };

/// The model's size and kind.
struct SimConfig {
  /// Total bytes of state (parameters plus optimizer moments).
  uint64_t state_bytes = 256ull << 20;
  /// Number of parameter tensors.
  int num_tensors = 8;
  /// Element type: f32, f64 or bf16.
  DType dtype = DType::kF32;
  /// sgd (parameters only) or adam (parameters + m + v).
  Optimizer optimizer = Optimizer::kAdam;
  /// Seed of the initial state and the synthetic gradients.
  uint64_t seed = 42;
  /// train-sim --shard: every tensor is a global tensor split along dimension 0 over
  /// `world_size` processes, and this process holds slice `rank` (SplitDim0), registered as a
  /// shard (TensorRef::global_shape / global_offset). Every element's value depends only on its
  /// global index, so the global state does not depend on the world size.
  bool shard = false;
  /// This process's rank (with shard).
  int rank = 0;
  /// Processes in the job (with shard).
  int world_size = 1;
};

/// The half-open range [begin, end) of a dimension's indices that one rank holds.
struct DimRange {
  /// First index held.
  uint64_t begin = 0;
  /// One past the last index held.
  uint64_t end = 0;
  /// Indices held.
  uint64_t size() const { return end - begin; }
};

/// Rank `rank`'s part of `extent` indices split over `world_size` ranks: the first
/// extent % world_size ranks hold one index more than the others (uneven splits), in rank order.
DimRange SplitDim0(uint64_t extent, int rank, int world_size);

/// Elements of each global tensor of the model.
uint64_t GlobalElementsPerTensor(const SimConfig& config);

/// InvalidArgument naming the flag when the config is unsupported (dtype, tensor count, size, or
/// tensors too small to give every rank at least one element).
Status ValidateSimConfig(const SimConfig& config);

/// What train-sim trains: a state registered in a TensorRegistry, stepped by a pure function of
/// (seed, step, batch), so that a resumed job ends where a straight one does. Not thread-safe.
class TrainModel {
 public:
  virtual ~TrainModel() = default;
  /// The registry naming every tensor (the model's state).
  virtual const TensorRegistry& registry() const = 0;
  /// Puts the state back to step 0's, in place.
  virtual void Reset() = 0;
  /// Applies one training step.
  virtual void Step(int64_t step, uint64_t batch_mix) = 0;
  /// XXH3-64 over every tensor's bytes, in name order.
  virtual uint64_t Digest() const = 0;
  /// The first failure of a step (a device's), or OK; host models never fail.
  virtual Status status() const { return Status::OK(); }
  /// Total bytes of state.
  uint64_t state_bytes() const { return registry().total_bytes(); }
};

/// A model whose state lives in xtensor arrays registered in a TensorRegistry. Not thread-safe.
class SimModel final : public TrainModel {
 public:
  /// InvalidArgument for an unsupported dtype, a non-positive tensor count or too small a state.
  static Result<std::unique_ptr<SimModel>> Create(const SimConfig& config);

  /// The registry naming every array (the model's state).
  const TensorRegistry& registry() const override { return registry_; }
  /// Puts every array back to its initial state (the state at step 0), in place: the
  /// registry's buffers stay where they are.
  void Reset() override;
  /// Applies one training step: every element of every array changes, as a function of the
  /// seed, the step and `batch_mix` (a digest of the step's input batch).
  void Step(int64_t step, uint64_t batch_mix) override;
  /// XXH3-64 over every tensor's bytes, in name order (with shard: this rank's slices only).
  uint64_t Digest() const override;

 private:
  using Array = std::variant<xt::xarray<float>, xt::xarray<double>, xt::xarray<uint16_t>>;
  struct Slot {
    size_t param;  // index into arrays_
    size_t m = 0;  // Adam moments (unused for SGD)
    size_t v = 0;
  };

  explicit SimModel(const SimConfig& config) : config_(config) {}
  Status Build();

  SimConfig config_;
  DimRange range_;  // the global indices this process holds (all of them without shard)
  std::vector<Array> arrays_;
  std::vector<Slot> slots_;
  TensorRegistry registry_;
};

/// XXH3-64 over every tensor of a registry (host memory), in name order.
uint64_t RegistryDigest(const TensorRegistry& registry);

}  // namespace asyncckpt::cli
