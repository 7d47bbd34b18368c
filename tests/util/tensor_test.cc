// Tests of src/util/tensor.cc: NumElements and the TensorRegistry's checks, which every saver and
// reader relies on (name order, one buffer per name, bytes matching shape and dtype, a shard's
// box inside its global tensor).

#include "asyncckpt/tensor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace asyncckpt {
namespace {

using ::testing::HasSubstr;

TensorRef Ref(std::string name, std::vector<int64_t> shape, void* data, size_t bytes) {
  TensorRef ref;
  ref.name = std::move(name);
  ref.dtype = DType::kF32;
  ref.shape = std::move(shape);
  ref.data = data;
  ref.bytes = bytes;
  return ref;
}

TEST(NumElementsTest, CountsElementsAndRefusesNegativeOrOverflowingShapes) {
  EXPECT_EQ(NumElements({}), 1);  // a scalar
  EXPECT_EQ(NumElements({2, 3, 4}), 24);
  EXPECT_EQ(NumElements({5, 0}), 0);
  EXPECT_EQ(NumElements({2, -1}), -1);
  EXPECT_EQ(NumElements({INT64_MAX, 2}), -1);
  EXPECT_EQ(NumElements({0, -1}), -1);
}

TEST(TensorRegistryTest, KeepsTensorsInNameOrderAndCountsTheirBytes) {
  std::vector<float> a(4), b(2);
  TensorRegistry registry;
  ASSERT_TRUE(registry.add(Ref("layer/1", {4}, a.data(), 16)).ok());
  ASSERT_TRUE(registry.add(Ref("layer/0", {2}, b.data(), 8)).ok());
  ASSERT_TRUE(registry.add(Ref("empty", {0}, nullptr, 0)).ok());
  ASSERT_EQ(registry.size(), 3u);
  EXPECT_EQ(registry.tensors()[0].name, "empty");
  EXPECT_EQ(registry.tensors()[1].name, "layer/0");
  EXPECT_EQ(registry.tensors()[2].name, "layer/1");
  EXPECT_EQ(registry.total_bytes(), 24u);
  ASSERT_NE(registry.find("layer/1"), nullptr);
  EXPECT_EQ(registry.find("layer/1")->data, a.data());
  EXPECT_EQ(registry.find("layer/2"), nullptr);
}

TEST(TensorRegistryTest, RefusesWhatNoSaveCouldHoldNamingTheTensor) {
  std::vector<float> a(4);
  TensorRegistry registry;
  ASSERT_TRUE(registry.add(Ref("w", {4}, a.data(), 16)).ok());
  struct Case {
    TensorRef ref;
    std::string fragment;
  };
  TensorRef bad_dtype = Ref("d", {4}, a.data(), 16);
  bad_dtype.dtype = static_cast<DType>(200);
  const std::vector<Case> cases = {
      {Ref("", {4}, a.data(), 16), "name must not be empty"},
      {Ref("w", {4}, a.data(), 16), "tensor 'w' is registered twice"},
      {bad_dtype, "tensor 'd' has an invalid dtype"},
      {Ref("n", {-4}, a.data(), 16), "tensor 'n' has a negative or overflowing shape"},
      {Ref("s", {4}, a.data(), 12), "tensor 's' holds 12 bytes but its shape and dtype need 16"},
      {Ref("p", {4}, nullptr, 16), "tensor 'p' has no buffer"},
  };
  for (const Case& c : cases) {
    const Status status = registry.add(c.ref);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.fragment;
    EXPECT_THAT(status.message(), HasSubstr(c.fragment));
  }
  EXPECT_EQ(registry.size(), 1u);
  EXPECT_EQ(registry.total_bytes(), 16u);
}

TEST(TensorRegistryTest, AShardsBoxMustLieInsideItsGlobalTensor) {
  std::vector<float> a(4);
  TensorRef shard = Ref("w", {2, 2}, a.data(), 16);
  shard.global_shape = {4, 2};
  shard.global_offset = {2, 0};
  TensorRegistry registry;
  ASSERT_TRUE(registry.add(shard).ok());
  EXPECT_TRUE(IsShard(*registry.find("w")));

  TensorRef outside = shard;
  outside.name = "outside";
  outside.global_offset = {3, 0};
  EXPECT_THAT(registry.add(outside).message(), HasSubstr("leaves the global tensor"));
  TensorRef ranks = shard;
  ranks.name = "ranks";
  ranks.global_offset = {2};
  EXPECT_THAT(registry.add(ranks).message(), HasSubstr("need the same rank"));
  TensorRef offset_only = Ref("offset_only", {4}, a.data(), 16);
  offset_only.global_offset = {0};
  EXPECT_THAT(registry.add(offset_only).message(), HasSubstr("global_offset but no global_shape"));
  EXPECT_FALSE(IsShard(offset_only));
}

}  // namespace
}  // namespace asyncckpt
