#include "asyncckpt/dtype.h"

namespace asyncckpt {

namespace {
struct DTypeInfo {
  DType dtype;
  size_t size;
  std::string_view name;
};
constexpr DTypeInfo kDTypeInfos[] = {
    {DType::kF64, 8, "f64"},   {DType::kF32, 4, "f32"},       {DType::kF16, 2, "f16"},
    {DType::kBF16, 2, "bf16"}, {DType::kF8E4M3, 1, "f8e4m3"}, {DType::kF8E5M2, 1, "f8e5m2"},
    {DType::kI8, 1, "i8"},     {DType::kI16, 2, "i16"},       {DType::kI32, 4, "i32"},
    {DType::kI64, 8, "i64"},   {DType::kU8, 1, "u8"},         {DType::kU16, 2, "u16"},
    {DType::kU32, 4, "u32"},   {DType::kU64, 8, "u64"},       {DType::kBool, 1, "bool"},
};
const DTypeInfo* FindDType(DType dtype) {
  for (const auto& info : kDTypeInfos) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}
}  // namespace

size_t DTypeSize(DType dtype) {
  const DTypeInfo* info = FindDType(dtype);
  return info ? info->size : 0;
}

std::string_view DTypeName(DType dtype) {
  const DTypeInfo* info = FindDType(dtype);
  return info ? info->name : "invalid";
}

std::optional<DType> ParseDType(std::string_view name) {
  for (const auto& info : kDTypeInfos) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

std::optional<DType> DTypeFromByte(uint8_t byte) {
  for (const auto& info : kDTypeInfos) {
    if (static_cast<uint8_t>(info.dtype) == byte) return info.dtype;
  }
  return std::nullopt;
}

}  // namespace asyncckpt
