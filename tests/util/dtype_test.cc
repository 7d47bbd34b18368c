// Tests of src/util/dtype.cc: element sizes, the short names the CLI and the index use, and the
// on-disk bytes, which are never renumbered.

#include "asyncckpt/dtype.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>

namespace asyncckpt {
namespace {

TEST(DTypeTest, EveryDTypeRoundTripsThroughItsNameAndItsByte) {
  std::set<std::string> names;
  for (DType dtype : kAllDTypes) {
    const std::string name(DTypeName(dtype));
    EXPECT_TRUE(names.insert(name).second) << name << " named twice";
    EXPECT_EQ(ParseDType(name), dtype) << name;
    EXPECT_EQ(DTypeFromByte(static_cast<uint8_t>(dtype)), dtype) << name;
    EXPECT_GT(DTypeSize(dtype), 0u) << name;
  }
}

TEST(DTypeTest, TheOnDiskBytesAndSizesArePinned) {
  EXPECT_EQ(static_cast<uint8_t>(DType::kF64), 1);
  EXPECT_EQ(static_cast<uint8_t>(DType::kBool), 15);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(DTypeName(DType::kF8E5M2), "f8e5m2");
}

TEST(DTypeTest, UnknownNamesAndBytesNameNoDType) {
  EXPECT_FALSE(ParseDType("float32").has_value());
  EXPECT_FALSE(ParseDType("").has_value());
  EXPECT_FALSE(DTypeFromByte(0).has_value());
  EXPECT_FALSE(DTypeFromByte(16).has_value());
  EXPECT_EQ(DTypeSize(static_cast<DType>(200)), 0u);
  EXPECT_EQ(DTypeName(static_cast<DType>(200)), "invalid");
}

TEST(DTypeTest, CppElementTypesMapToTheirDType) {
  EXPECT_EQ(DTypeOf<float>(), DType::kF32);
  EXPECT_EQ(DTypeOf<double>(), DType::kF64);
  EXPECT_EQ(DTypeOf<int64_t>(), DType::kI64);
  EXPECT_EQ(DTypeOf<uint16_t>(), DType::kU16);
  EXPECT_EQ(DTypeOf<bool>(), DType::kBool);
  EXPECT_FALSE(DTypeOf<char16_t>().has_value());
}

}  // namespace
}  // namespace asyncckpt
