// Restore into device memory through pinned bounce buffers: the pieces, and a fake device whose
// host-to-device copies land only when waited for, so that a bounce buffer reused before its
// copy finished would leave the wrong bytes on the device.

#include "src/reader/device_restore.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/device.h"

namespace asyncckpt::reader {
namespace {

class LazyDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return "lazy:0"; }
  Result<PinnedBuffer> allocate_pinned(size_t bytes) override {
    ++allocations;
    void* data = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    return PinnedBuffer(data, bytes, [](void* p) { std::free(p); });
  }
  Result<std::unique_ptr<CopyFence>> copy_to_host_async(const void*, void*, size_t) override {
    return Status::Unavailable("restore only");
  }
  Status copy_from_host(const void* src, void* dst, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::OK();
  }
  Result<std::unique_ptr<CopyFence>> copy_from_host_async(const void* src, void* dst,
                                                          size_t bytes) override {
    ++in_flight;
    most_in_flight = std::max(most_in_flight, in_flight);
    return std::unique_ptr<CopyFence>(std::make_unique<Lazy>(this, src, dst, bytes));
  }
  int allocations = 0;
  int in_flight = 0;
  int most_in_flight = 0;

 private:
  // Copies at its first wait: whatever the buffer holds then.
  class Lazy final : public CopyFence {
   public:
    Lazy(LazyDevice* device, const void* src, void* dst, size_t bytes)
        : device_(device), src_(src), dst_(dst), bytes_(bytes) {}
    Status wait() override {
      if (!done_) {
        std::memcpy(dst_, src_, bytes_);
        --device_->in_flight;
        done_ = true;
      }
      return Status::OK();
    }
    bool ready() override { return done_; }

   private:
    LazyDevice* device_;
    const void* src_;
    void* dst_;
    size_t bytes_;
    bool done_ = false;
  };
};

TensorRef Tensor(const std::string& name, std::vector<int64_t> shape, std::vector<float>& memory,
                 std::shared_ptr<Device> device) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  memory.assign(static_cast<size_t>(n), 0.0f);
  TensorRef ref;
  ref.name = name;
  ref.dtype = DType::kF32;
  ref.shape = std::move(shape);
  ref.data = memory.data();
  ref.bytes = memory.size() * sizeof(float);
  ref.device = std::move(device);
  return ref;
}

TEST(DeviceRestoreTest, PiecesAreWholeRowsWithinTheBudget) {
  auto device = std::make_shared<LazyDevice>();
  std::vector<float> a, b, host;
  TensorRegistry registry;
  ASSERT_TRUE(registry.add(Tensor("a", {10, 1000}, a, device)).ok());  // 4000-byte rows
  ASSERT_TRUE(registry.add(Tensor("b", {3}, b, device)).ok());
  ASSERT_TRUE(registry.add(Tensor("host", {5}, host, nullptr)).ok());
  const std::vector<DevicePiece> pieces = PlanDevicePieces(registry, 16000);
  ASSERT_EQ(pieces.size(), 4u);  // a: rows 0-3, 4-7, 8-9; b whole; no host tensor
  EXPECT_EQ(pieces[1].first, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(pieces[2].shape, (std::vector<int64_t>{2, 1000}));
  EXPECT_EQ(pieces[2].offset, 32000u);
  EXPECT_EQ(pieces[2].bytes, 8000u);
  EXPECT_EQ(pieces[3].ref->name, "b");
}

TEST(DeviceRestoreTest, ABounceBufferIsReusedOnlyAfterItsCopyLanded) {
  auto device = std::make_shared<LazyDevice>();
  std::vector<float> a;
  TensorRegistry registry;
  ASSERT_TRUE(registry.add(Tensor("a", {64, 256}, a, device)).ok());         // 1 KiB rows
  const std::vector<DevicePiece> pieces = PlanDevicePieces(registry, 4096);  // 16 pieces
  ASSERT_EQ(pieces.size(), 16u);
  Status status = RestoreDevicePieces(pieces, [](const DevicePiece& piece, uint8_t* host) {
    auto* values = reinterpret_cast<float*>(host);
    const int64_t row0 = piece.first[0];
    for (uint64_t i = 0; i < piece.bytes / sizeof(float); ++i) {
      values[i] = static_cast<float>(row0 * 256 + static_cast<int64_t>(i));
    }
    return Status::OK();
  });
  ASSERT_TRUE(status.ok()) << status.ToString();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], static_cast<float>(i)) << i;
  EXPECT_EQ(device->most_in_flight, kDeviceBounceBuffers) << "copies overlap the next reads";
  EXPECT_EQ(device->in_flight, 0) << "every copy landed before the call returned";
  EXPECT_EQ(device->allocations, kDeviceBounceBuffers);
}

TEST(DeviceRestoreTest, AReadFailureStopsAndStillLandsTheCopiesStarted) {
  auto device = std::make_shared<LazyDevice>();
  std::vector<float> a;
  TensorRegistry registry;
  ASSERT_TRUE(registry.add(Tensor("a", {8, 256}, a, device)).ok());
  int reads = 0;
  Status status =
      RestoreDevicePieces(PlanDevicePieces(registry, 1024), [&](const DevicePiece&, uint8_t* h) {
        std::memset(h, 0, 1024);
        return ++reads == 3 ? Status::Corruption("chunk 2: checksum mismatch") : Status::OK();
      });
  EXPECT_EQ(status.code(), StatusCode::kCorruption);
  EXPECT_EQ(reads, 3);
  EXPECT_EQ(device->in_flight, 0);
}

}  // namespace
}  // namespace asyncckpt::reader
