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
};

/// InvalidArgument naming the flag when the config is unsupported (dtype, tensor count, size).
Status ValidateSimConfig(const SimConfig& config);

/// A model whose state lives in xtensor arrays registered in a TensorRegistry. Not thread-safe.
class SimModel {
 public:
  /// InvalidArgument for an unsupported dtype, a non-positive tensor count or too small a state.
  static Result<std::unique_ptr<SimModel>> Create(const SimConfig& config);

  /// The registry naming every array (the model's state).
  const TensorRegistry& registry() const { return registry_; }
  /// Puts every array back to its initial state (the state at step 0), in place: the
  /// registry's buffers stay where they are.
  void Reset();
  /// Applies one training step: every element of every array changes, as a function of the
  /// seed, the step and `batch_mix` (a digest of the step's input batch).
  void Step(int64_t step, uint64_t batch_mix);
  /// XXH3-64 over every tensor's bytes, in name order.
  uint64_t Digest() const;
  /// Total bytes of state.
  uint64_t state_bytes() const { return registry_.total_bytes(); }

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
  std::vector<Array> arrays_;
  std::vector<Slot> slots_;
  TensorRegistry registry_;
};

/// XXH3-64 over every tensor of a registry (host memory), in name order.
uint64_t RegistryDigest(const TensorRegistry& registry);

}  // namespace asyncckpt::cli
