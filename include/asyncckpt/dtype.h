#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

namespace asyncckpt {

/// Element types a tensor may hold. The numeric values are stored on disk: never renumber.
enum class DType : uint8_t {
  kF64 = 1,
  kF32 = 2,
  kF16 = 3,
  kBF16 = 4,
  kF8E4M3 = 5,
  kF8E5M2 = 6,
  kI8 = 7,
  kI16 = 8,
  kI32 = 9,
  kI64 = 10,
  kU8 = 11,
  kU16 = 12,
  kU32 = 13,
  kU64 = 14,
  kBool = 15,
};

/// Every dtype, in on-disk order.
inline constexpr DType kAllDTypes[] = {DType::kF64,    DType::kF32,    DType::kF16, DType::kBF16,
                                       DType::kF8E4M3, DType::kF8E5M2, DType::kI8,  DType::kI16,
                                       DType::kI32,    DType::kI64,    DType::kU8,  DType::kU16,
                                       DType::kU32,    DType::kU64,    DType::kBool};

/// Bytes per element (bool is one byte).
size_t DTypeSize(DType dtype);
/// The short name used by the CLI and the index ("f32", "bf16", "f8e4m3", "bool").
std::string_view DTypeName(DType dtype);
/// Parses a short name; nullopt when unknown.
std::optional<DType> ParseDType(std::string_view name);
/// Maps an on-disk byte to a dtype; nullopt when the byte names none.
std::optional<DType> DTypeFromByte(uint8_t byte);

/// The dtype of a C++ element type, for typed reads into xtensor.
template <typename T>
constexpr std::optional<DType> DTypeOf() {
  if constexpr (std::is_same_v<T, double>) return DType::kF64;
  if constexpr (std::is_same_v<T, float>) return DType::kF32;
  if constexpr (std::is_same_v<T, int8_t>) return DType::kI8;
  if constexpr (std::is_same_v<T, int16_t>) return DType::kI16;
  if constexpr (std::is_same_v<T, int32_t>) return DType::kI32;
  if constexpr (std::is_same_v<T, int64_t>) return DType::kI64;
  if constexpr (std::is_same_v<T, uint8_t>) return DType::kU8;
  if constexpr (std::is_same_v<T, uint16_t>) return DType::kU16;
  if constexpr (std::is_same_v<T, uint32_t>) return DType::kU32;
  if constexpr (std::is_same_v<T, uint64_t>) return DType::kU64;
  if constexpr (std::is_same_v<T, bool>) return DType::kBool;
  return std::nullopt;
}

}  // namespace asyncckpt
