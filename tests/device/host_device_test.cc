#include "device/host_device.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/device.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/session.h"
#include "asyncckpt/tensor.h"

namespace asyncckpt {
namespace {

bool IsPageAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 4096 == 0; }

std::vector<uint8_t> Pattern(size_t n, uint8_t salt) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 31 + salt + (i >> 11));
  return bytes;
}

class PinnedBufferTest : public ::testing::Test {
 protected:
  // A buffer over `storage_` whose release is counted instead of freeing anything.
  PinnedBuffer Counted() {
    return PinnedBuffer(storage_, sizeof(storage_), [this](void* p) {
      EXPECT_EQ(p, storage_);
      ++frees_;
    });
  }

  alignas(64) char storage_[64] = {};
  int frees_ = 0;
};

TEST_F(PinnedBufferTest, DestructorFreesExactlyOnce) {
  { PinnedBuffer buffer = Counted(); }
  EXPECT_EQ(frees_, 1);
}

TEST_F(PinnedBufferTest, MoveTransfersOwnershipWithoutFreeing) {
  PinnedBuffer outer;
  {
    PinnedBuffer inner = Counted();
    outer = std::move(inner);
    EXPECT_EQ(frees_, 0);
    EXPECT_EQ(inner.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
    EXPECT_EQ(inner.size(), 0u);
  }
  EXPECT_EQ(frees_, 0);
  EXPECT_EQ(outer.data(), storage_);
  EXPECT_EQ(outer.size(), sizeof(storage_));
  PinnedBuffer moved_again(std::move(outer));
  EXPECT_EQ(frees_, 0);
  moved_again.reset();
  EXPECT_EQ(frees_, 1);
  EXPECT_EQ(moved_again.data(), nullptr);
  moved_again.reset();  // a second reset frees nothing
  EXPECT_EQ(frees_, 1);
}

TEST_F(PinnedBufferTest, MoveAssignmentFreesTheOldBuffer) {
  PinnedBuffer first = Counted();
  alignas(64) static char other[64];
  int other_frees = 0;
  first = PinnedBuffer(other, sizeof(other), [&](void*) { ++other_frees; });
  EXPECT_EQ(frees_, 1);
  EXPECT_EQ(other_frees, 0);
  first.reset();
  EXPECT_EQ(other_frees, 1);
}

TEST(HostDeviceTest, IsTheProcessWideHostDevice) {
  std::shared_ptr<Device> device = HostDevice();
  ASSERT_NE(device, nullptr);
  EXPECT_EQ(device, HostDevice());
  EXPECT_EQ(device->kind(), DeviceKind::kHost);
  EXPECT_EQ(device->name(), "host");
}

TEST(HostDeviceTest, PinnedAllocationIsPageAlignedAndCoversWholePages) {
  for (size_t bytes : {size_t{1}, size_t{4096}, size_t{5000}, size_t{3} << 20}) {
    SCOPED_TRACE("bytes " + std::to_string(bytes));
    Result<PinnedBuffer> buffer = HostDevice()->allocate_pinned(bytes);
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    EXPECT_TRUE(IsPageAligned(buffer->data()));
    EXPECT_EQ(buffer->size(), bytes);
    // O_DIRECT writes cover the last page whole: it must be ours (ASan would catch it).
    const size_t whole_pages = (bytes + 4095) / 4096 * 4096;
    std::memset(buffer->data(), 0x5A, whole_pages);
    EXPECT_EQ(static_cast<uint8_t*>(buffer->data())[whole_pages - 1], 0x5A);
  }
}

TEST(HostDeviceTest, ZeroBytePinnedAllocationIsValid) {
  Result<PinnedBuffer> buffer = HostDevice()->allocate_pinned(0);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  EXPECT_EQ(buffer->size(), 0u);
  EXPECT_TRUE(IsPageAligned(buffer->data()));
}

TEST(HostDeviceTest, PinnedAllocationFreedByDestructorCanBeRepeated) {
  // Leaks show up under ASan/LSan; here the loop would also exhaust memory quickly if every
  // 64 MiB were kept.
  for (int i = 0; i < 64; ++i) {
    Result<PinnedBuffer> buffer = HostDevice()->allocate_pinned(64u << 20);
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    static_cast<uint8_t*>(buffer->data())[i * 4096] = 1;
  }
}

TEST(HostDeviceTest, CopyToHostAsyncThenCopyFromHostRoundTrips) {
  const std::vector<uint8_t> source = Pattern(1'000'003, 7);
  Result<PinnedBuffer> pinned = HostDevice()->allocate_pinned(source.size());
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();

  auto fence = HostDevice()->copy_to_host_async(source.data(), pinned->data(), source.size());
  ASSERT_TRUE(fence.ok()) << fence.status().ToString();
  EXPECT_TRUE((*fence)->ready());  // host copies complete before the call returns
  ASSERT_TRUE((*fence)->wait().ok());
  EXPECT_TRUE((*fence)->wait().ok());  // waiting twice is allowed
  EXPECT_EQ(std::memcmp(pinned->data(), source.data(), source.size()), 0);

  std::vector<uint8_t> back(source.size(), 0);
  ASSERT_TRUE(HostDevice()->copy_from_host(pinned->data(), back.data(), back.size()).ok());
  EXPECT_EQ(back, source);
}

TEST(HostDeviceTest, SynchronousCopyToHostCopies) {
  const std::vector<uint8_t> source = Pattern(4099, 3);
  std::vector<uint8_t> dst(source.size(), 0);
  ASSERT_TRUE(HostDevice()->copy_to_host(source.data(), dst.data(), dst.size()).ok());
  EXPECT_EQ(dst, source);
}

TEST(HostDeviceTest, ZeroByteCopiesTouchNothing) {
  // Null pointers with zero bytes: memcpy would be undefined, the device must not call it.
  auto fence = HostDevice()->copy_to_host_async(nullptr, nullptr, 0);
  ASSERT_TRUE(fence.ok());
  EXPECT_TRUE((*fence)->ready());
  EXPECT_TRUE(HostDevice()->copy_from_host(nullptr, nullptr, 0).ok());
}

TEST(HostDeviceTest, FenceCanBeWaitedOnFromAnotherThread) {
  const std::vector<uint8_t> source = Pattern(8192, 1);
  std::vector<uint8_t> dst(source.size());
  auto fence = HostDevice()->copy_to_host_async(source.data(), dst.data(), dst.size());
  ASSERT_TRUE(fence.ok());
  Status waited;
  std::thread waiter([&] { waited = (*fence)->wait(); });
  waiter.join();
  EXPECT_TRUE(waited.ok());
  EXPECT_EQ(dst, source);
}

TEST(HostDeviceTest, StreamOrderedModeIsAFailedPrecondition) {
  int fake_stream = 0;
  Status set = SetCudaComputeStream(*HostDevice(), &fake_stream);
  EXPECT_EQ(set.code(), StatusCode::kFailedPrecondition) << set.ToString();
  EXPECT_NE(set.message().find("host"), std::string::npos) << set.message();
  Status cleared = SetCudaComputeStream(*HostDevice(), nullptr);
  EXPECT_EQ(cleared.code(), StatusCode::kFailedPrecondition) << cleared.ToString();
  Status wait = WaitForCopiesOnComputeStream(*HostDevice());
  EXPECT_EQ(wait.code(), StatusCode::kFailedPrecondition) << wait.ToString();
  EXPECT_NE(wait.message().find("host"), std::string::npos) << wait.message();
}

// The same save-and-restore the CUDA test makes on GPU memory, on tensors that name the host
// device explicitly (not a null device), through the asynchronous hook's staging path.
class HostDeviceCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/host_device_test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
};

TEST_F(HostDeviceCheckpointTest, AsyncSaveOfHostDeviceTensorsRestoresBitForBit) {
  std::vector<float> weights(300'001);
  std::vector<int64_t> counters(17);
  TensorRegistry registry;
  ASSERT_TRUE(registry
                  .add({"w",
                        DType::kF32,
                        {300'001},
                        weights.data(),
                        weights.size() * sizeof(float),
                        HostDevice(),
                        {},
                        {}})
                  .ok());
  ASSERT_TRUE(registry
                  .add({"counters",
                        DType::kI64,
                        {17},
                        counters.data(),
                        counters.size() * sizeof(int64_t),
                        HostDevice(),
                        {},
                        {}})
                  .ok());
  SaverOptions options;
  options.checkpoint_dir = dir_;
  options.save_steps = 2;
  options.chunk_bytes = 256 << 10;  // several chunks
  auto hook = AsyncCheckpointSaverHook::Create(options, &registry);
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  auto session = SingularMonitoredSession::Create({hook->get()});
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  for (int step = 0; step < 5; ++step) {
    ASSERT_TRUE((*session)
                    ->run([&](StepContext& ctx) {
                      for (size_t i = 0; i < weights.size(); ++i) {
                        weights[i] = static_cast<float>(ctx.step()) * 0.5f + i * 1e-3f;
                      }
                      std::iota(counters.begin(), counters.end(), ctx.step());
                      return Status::OK();
                    })
                    .ok());
  }
  ASSERT_TRUE((*session)->close().ok());
  const std::vector<float> saved_weights = weights;
  const std::vector<int64_t> saved_counters = counters;

  std::fill(weights.begin(), weights.end(), -1.f);
  std::fill(counters.begin(), counters.end(), -1);
  auto reader = CheckpointReader::OpenLatest(dir_);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->metadata().step, 5);
  ASSERT_TRUE((*reader)->restore(registry).ok());
  EXPECT_EQ(std::memcmp(weights.data(), saved_weights.data(), weights.size() * sizeof(float)), 0);
  EXPECT_EQ(counters, saved_counters);
}

}  // namespace
}  // namespace asyncckpt
