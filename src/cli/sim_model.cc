#include "src/cli/sim_model.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/util/status_macros.h"

namespace asyncckpt::cli {

namespace {

constexpr float kLearningRate = 1e-3f;
constexpr float kBeta1 = 0.9f;
constexpr float kBeta2 = 0.999f;
constexpr float kEpsilon = 1e-8f;
constexpr float kWeightDecay = 1e-4f;

// A cheap, well-mixed hash of (key, index) into [-0.5, 0.5): the synthetic gradient.
inline float Noise(uint64_t key, uint64_t index) {
  uint64_t h = key ^ (index * 0x9E3779B97F4A7C15ull);
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f) - 0.5f;
}

inline uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t h = a * 0x94D049BB133111EBull + b + 0x9E3779B97F4A7C15ull;
  h ^= h >> 32;
  return h * 0xD6E8FEB86659FD93ull;
}

inline float Bf16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

inline uint16_t FloatToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  bits += 0x7FFF + ((bits >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

// Element access in float, whatever the storage type.
template <typename T>
inline float Load(const T& x) {
  if constexpr (std::is_same_v<T, uint16_t>)
    return Bf16ToFloat(x);
  else
    return static_cast<float>(x);
}
template <typename T>
inline T Store(float x) {
  if constexpr (std::is_same_v<T, uint16_t>)
    return FloatToBf16(x);
  else
    return static_cast<T>(x);
}

// `base` is the global index of element 0: the noise follows the global index, so a shard's
// elements take the values the same elements of the whole tensor take.
template <typename T>
void SgdUpdate(T* param, size_t n, uint64_t key, uint64_t base) {
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n, 1 << 16), [&](const auto& range) {
    for (size_t i = range.begin(); i != range.end(); ++i) {
      const float p = Load(param[i]);
      param[i] = Store<T>(p - kLearningRate * (Noise(key, base + i) + kWeightDecay * p));
    }
  });
}

template <typename T>
void AdamUpdate(T* param, T* m, T* v, size_t n, uint64_t key, uint64_t base) {
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n, 1 << 16), [&](const auto& range) {
    for (size_t i = range.begin(); i != range.end(); ++i) {
      const float g = Noise(key, base + i);
      const float mi = kBeta1 * Load(m[i]) + (1 - kBeta1) * g;
      const float vi = kBeta2 * Load(v[i]) + (1 - kBeta2) * g * g;
      m[i] = Store<T>(mi);
      v[i] = Store<T>(vi);
      param[i] = Store<T>(Load(param[i]) - kLearningRate * mi / (std::sqrt(vi) + kEpsilon));
    }
  });
}

template <typename T>
void FillInitial(T* data, size_t elements, uint64_t key, bool zero, uint64_t base) {
  tbb::parallel_for(tbb::blocked_range<size_t>(0, elements, 1 << 16), [&](const auto& range) {
    for (size_t i = range.begin(); i != range.end(); ++i) {
      data[i] = Store<T>(zero ? 0.0f : Noise(key, base + i) * 0.1f);
    }
  });
}

template <typename T>
xt::xarray<T> InitialArray(size_t elements, uint64_t key, bool zero, uint64_t base) {
  xt::xarray<T> array = xt::xarray<T>::from_shape({elements});
  FillInitial(array.data(), elements, key, zero, base);
  return array;
}

}  // namespace

DimRange SplitDim0(uint64_t extent, int rank, int world_size) {
  const uint64_t ranks = static_cast<uint64_t>(world_size);
  const uint64_t r = static_cast<uint64_t>(rank);
  const uint64_t base = extent / ranks;
  const uint64_t extra = extent % ranks;
  const uint64_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

uint64_t GlobalElementsPerTensor(const SimConfig& config) {
  const uint64_t slots = config.optimizer == Optimizer::kAdam ? 3 : 1;
  return config.state_bytes / (slots * static_cast<uint64_t>(config.num_tensors)) /
         DTypeSize(config.dtype);
}

Status ValidateSimConfig(const SimConfig& config) {
  if (config.dtype != DType::kF32 && config.dtype != DType::kF64 && config.dtype != DType::kBF16) {
    return Status::InvalidArgument("--dtype: train-sim supports f32, f64 and bf16, not " +
                                   std::string(DTypeName(config.dtype)));
  }
  if (config.num_tensors <= 0 || config.num_tensors > 100000) {
    return Status::InvalidArgument("--tensors must be in [1, 100000], got " +
                                   std::to_string(config.num_tensors));
  }
  const uint64_t slots = config.optimizer == Optimizer::kAdam ? 3 : 1;
  const uint64_t per_tensor = config.state_bytes / (slots * config.num_tensors);
  if (per_tensor < DTypeSize(config.dtype)) {
    return Status::InvalidArgument("--model_bytes " + std::to_string(config.state_bytes) +
                                   " is too small for " + std::to_string(config.num_tensors) +
                                   " tensors");
  }
  if (config.shard) {
    if (config.world_size < 1 || config.rank < 0 || config.rank >= config.world_size) {
      return Status::InvalidArgument("rank " + std::to_string(config.rank) + " of " +
                                     std::to_string(config.world_size) + " processes");
    }
    const uint64_t elements = GlobalElementsPerTensor(config);
    if (elements < static_cast<uint64_t>(config.world_size)) {
      return Status::InvalidArgument(
          "--model_bytes " + std::to_string(config.state_bytes) + " gives each tensor " +
          std::to_string(elements) + " elements, fewer than the " +
          std::to_string(config.world_size) + " processes of --shard: every rank needs one");
    }
  }
  return Status::OK();
}

Result<std::unique_ptr<SimModel>> SimModel::Create(const SimConfig& config) {
  RETURN_IF_ERROR(ValidateSimConfig(config));
  std::unique_ptr<SimModel> model(new SimModel(config));
  RETURN_IF_ERROR(model->Build());
  return model;
}

Status SimModel::Build() {
  const bool adam = config_.optimizer == Optimizer::kAdam;
  const uint64_t slots = adam ? 3 : 1;
  const size_t elem = DTypeSize(config_.dtype);
  const uint64_t global_elements = GlobalElementsPerTensor(config_);
  range_ = config_.shard ? SplitDim0(global_elements, config_.rank, config_.world_size)
                         : DimRange{0, global_elements};
  const size_t elements = range_.size();
  const uint64_t base = range_.begin;
  auto make = [&](uint64_t key, bool zero) -> Array {
    switch (config_.dtype) {
      case DType::kF64:
        return InitialArray<double>(elements, key, zero, base);
      case DType::kBF16:
        return InitialArray<uint16_t>(elements, key, zero, base);
      default:
        return InitialArray<float>(elements, key, zero, base);
    }
  };
  std::vector<int64_t> global_shape;
  std::vector<int64_t> global_offset;
  if (config_.shard) {
    global_shape = {static_cast<int64_t>(global_elements)};
    global_offset = {static_cast<int64_t>(range_.begin)};
  }
  arrays_.reserve(config_.num_tensors * slots);
  for (int t = 0; t < config_.num_tensors; ++t) {
    Slot slot{arrays_.size()};
    arrays_.push_back(make(Mix(config_.seed, t), false));
    if (adam) {
      slot.m = arrays_.size();
      arrays_.push_back(make(0, true));
      slot.v = arrays_.size();
      arrays_.push_back(make(0, true));
    }
    slots_.push_back(slot);
  }
  char prefix[32];
  for (size_t t = 0; t < slots_.size(); ++t) {
    std::snprintf(prefix, sizeof(prefix), "layer_%03zu/", t);
    auto add = [&](size_t index, const char* suffix) -> Status {
      return std::visit(
          [&](auto& array) {
            return registry_.add(TensorRef{std::string(prefix) + suffix,
                                           config_.dtype,
                                           {static_cast<int64_t>(array.size())},
                                           array.data(),
                                           array.size() * elem,
                                           nullptr,
                                           global_shape,
                                           global_offset});
          },
          arrays_[index]);
    };
    RETURN_IF_ERROR(add(slots_[t].param, "weights"));
    if (adam) {
      RETURN_IF_ERROR(add(slots_[t].m, "adam_m"));
      RETURN_IF_ERROR(add(slots_[t].v, "adam_v"));
    }
  }
  return Status::OK();
}

void SimModel::Reset() {
  const bool adam = config_.optimizer == Optimizer::kAdam;
  auto fill = [this](Array& array, uint64_t key, bool zero) {
    std::visit([&](auto& a) { FillInitial(a.data(), a.size(), key, zero, range_.begin); }, array);
  };
  for (size_t t = 0; t < slots_.size(); ++t) {
    fill(arrays_[slots_[t].param], Mix(config_.seed, t), false);
    if (adam) {
      fill(arrays_[slots_[t].m], 0, true);
      fill(arrays_[slots_[t].v], 0, true);
    }
  }
}

void SimModel::Step(int64_t step, uint64_t batch_mix) {
  const bool adam = config_.optimizer == Optimizer::kAdam;
  for (size_t t = 0; t < slots_.size(); ++t) {
    const uint64_t key = Mix(Mix(config_.seed, static_cast<uint64_t>(step)), Mix(t, batch_mix));
    std::visit(
        [&](auto& param) {
          using T = typename std::decay_t<decltype(param)>::value_type;
          if (adam) {
            auto& m = std::get<xt::xarray<T>>(arrays_[slots_[t].m]);
            auto& v = std::get<xt::xarray<T>>(arrays_[slots_[t].v]);
            AdamUpdate(param.data(), m.data(), v.data(), param.size(), key, range_.begin);
          } else {
            SgdUpdate(param.data(), param.size(), key, range_.begin);
          }
        },
        arrays_[slots_[t].param]);
  }
}

uint64_t SimModel::Digest() const { return RegistryDigest(registry_); }

uint64_t RegistryDigest(const TensorRegistry& registry) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const auto& tensor : registry.tensors())
    XXH3_64bits_update(state, tensor.data, tensor.bytes);
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

}  // namespace asyncckpt::cli
