// Stream-ordered snapshots on a fake accelerator that counts what the training thread asks of
// it: a save enqueues one copy per contiguous tensor and waits for none of them, so its cost
// follows the number of tensors and not their bytes. The fake copies only when its fence is
// waited for, so a checkpoint that holds the state also proves the encoder waited off the
// training thread.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/checkpointer.h"
#include "asyncckpt/device.h"
#include "asyncckpt/reader.h"

namespace asyncckpt {
namespace {

// "t<index>", appended piece by piece: GCC 12's -O3 -Wrestrict misfires on "t" + std::string&&.
std::string TensorName(size_t index) {
  std::string name = "t";
  name += std::to_string(index);
  return name;
}

// What one thread asked of the device.
struct Calls {
  int batches = 0;        // copy_regions_to_host_async
  int regions = 0;        // regions over every batch (a CUDA device's cudaMemcpyAsync calls)
  int chunk_copies = 0;   // copy_to_host_async
  int fence_waits = 0;    // CopyFence::wait
  int compute_waits = 0;  // wait_for_copies_on_compute_stream
  int total() const { return batches + chunk_copies + fence_waits + compute_waits; }
};

// Host memory standing for GPU memory. Counts the calls of the thread named by watch().
class CountingDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return "counting:0"; }
  Result<PinnedBuffer> allocate_pinned(size_t bytes) override {
    void* data = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096 + 4096);
    if (data == nullptr) return Status::Unavailable("out of memory");
    return PinnedBuffer(data, bytes, [](void* p) { std::free(p); });
  }
  Result<std::unique_ptr<CopyFence>> copy_to_host_async(const void* src, void* dst,
                                                        size_t bytes) override {
    Count([](Calls& c) { ++c.chunk_copies; });
    return MakeFence({CopyRegion{src, dst, bytes}});
  }
  Result<std::unique_ptr<CopyFence>> copy_regions_to_host_async(
      const std::vector<CopyRegion>& regions) override {
    Count([&](Calls& c) {
      ++c.batches;
      c.regions += static_cast<int>(regions.size());
    });
    return MakeFence(regions);
  }
  Status wait_for_copies_on_compute_stream() override {
    Count([](Calls& c) { ++c.compute_waits; });
    return Status::OK();
  }
  Status copy_from_host(const void* src, void* dst, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::OK();
  }

  // Counts the calls of the calling thread from now on, and returns what was counted before.
  void watch() {
    std::lock_guard lock(mu_);
    watched_ = std::this_thread::get_id();
    on_watched_ = Calls{};
  }
  Calls watched() {
    std::lock_guard lock(mu_);
    return on_watched_;
  }
  int fence_waits_elsewhere() const { return fence_waits_elsewhere_.load(); }
  // From now on every fence's wait fails (an illegal address on the GPU), after copying.
  std::atomic<bool> fail_fences{false};

 private:
  // Copies every region at its first wait: an "asynchronous" copy that lands only when waited.
  class LazyFence final : public CopyFence {
   public:
    LazyFence(CountingDevice* device, std::vector<CopyRegion> regions)
        : device_(device), regions_(std::move(regions)) {}
    Status wait() override {
      device_->CountWait();
      std::call_once(once_, [&] {
        for (const CopyRegion& r : regions_) std::memcpy(r.host_dst, r.device_src, r.bytes);
      });
      if (device_->fail_fences) return Status::IOError("illegal address");
      return Status::OK();
    }
    bool ready() override { return false; }

   private:
    CountingDevice* device_;
    std::vector<CopyRegion> regions_;
    std::once_flag once_;
  };

  std::unique_ptr<CopyFence> MakeFence(std::vector<CopyRegion> regions) {
    return std::make_unique<LazyFence>(this, std::move(regions));
  }
  template <typename F>
  void Count(F&& f) {
    std::lock_guard lock(mu_);
    if (std::this_thread::get_id() == watched_) f(on_watched_);
  }
  void CountWait() {
    std::lock_guard lock(mu_);
    if (std::this_thread::get_id() == watched_) {
      ++on_watched_.fence_waits;
    } else {
      ++fence_waits_elsewhere_;
    }
  }

  std::mutex mu_;
  std::thread::id watched_;
  Calls on_watched_;
  std::atomic<int> fence_waits_elsewhere_{0};
};

class StreamOrderedSnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/stream_ordered_test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // `tensors` tensors of `bytes` each on `device`, their bytes in `memory`.
  static TensorRegistry Registry(int tensors, size_t bytes, std::shared_ptr<Device> device,
                                 std::vector<std::vector<uint8_t>>& memory) {
    memory.resize(tensors);
    TensorRegistry registry;
    for (int t = 0; t < tensors; ++t) {
      memory[t].resize(bytes);
      for (size_t i = 0; i < bytes; ++i) memory[t][i] = static_cast<uint8_t>(i * 7 + t);
      TensorRef ref;
      ref.name = TensorName(t);
      ref.dtype = DType::kU8;
      ref.shape = {static_cast<int64_t>(bytes)};
      ref.data = memory[t].data();
      ref.bytes = bytes;
      ref.device = device;
      EXPECT_TRUE(registry.add(std::move(ref)).ok());
    }
    return registry;
  }

  SaverOptions Options(const std::string& name, bool defer_wait) const {
    SaverOptions options;
    options.checkpoint_dir = dir_ + "/" + name;
    options.save_steps = 1;
    options.chunk_bytes = 64 << 10;  // chunks grow with the bytes: 16 per MiB
    options.background_threads = 2;
    options.cuda_stream_ordered = true;
    options.cuda_defer_compute_wait = defer_wait;
    return options;
  }

  // Saves `tensors` tensors of `bytes` each, twice, and returns the training thread's calls of
  // the second save (the first may create the engine). Checks that the checkpoint holds them.
  Calls SaveTwice(int tensors, size_t bytes, bool defer_wait) {
    auto device = std::make_shared<CountingDevice>();
    std::vector<std::vector<uint8_t>> memory;
    TensorRegistry registry = Registry(tensors, bytes, device, memory);
    const SaverOptions options =
        Options(std::to_string(tensors).append("x").append(std::to_string(bytes)), defer_wait);
    auto made = Checkpointer::Create(options);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    if (!made.ok()) return {};
    std::unique_ptr<Checkpointer> checkpointer = std::move(made).value();
    EXPECT_TRUE(checkpointer->save(1, registry).ok());
    EXPECT_TRUE(checkpointer->wait_until_finished().ok());
    device->watch();
    EXPECT_TRUE(checkpointer->save(2, registry).ok());
    const Calls calls = device->watched();
    EXPECT_TRUE(checkpointer->wait_until_finished().ok());
    EXPECT_GT(device->fence_waits_elsewhere(), 0) << "nobody waited for the copies";
    ExpectHolds(*checkpointer, memory);
    return calls;
  }

  void ExpectHolds(Checkpointer& checkpointer, const std::vector<std::vector<uint8_t>>& memory) {
    auto reader = checkpointer.open(2);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    for (size_t t = 0; t < memory.size(); ++t) {
      std::vector<uint8_t> back(memory[t].size());
      ASSERT_TRUE((*reader)->read(TensorName(t), back.data(), back.size()).ok());
      EXPECT_EQ(back, memory[t]) << "tensor " << t;
    }
  }

  std::string dir_;
};

TEST_F(StreamOrderedSnapshotTest, TrainingThreadCallsScaleWithTensorsNotBytes) {
  const Calls small = SaveTwice(2, 1 << 20, false);  // 32 chunks
  const Calls large = SaveTwice(2, 8 << 20, false);  // 256 chunks
  const Calls many = SaveTwice(6, 1 << 20, false);   // 96 chunks
  for (const Calls& calls : {small, large, many}) {
    EXPECT_EQ(calls.batches, 1);
    EXPECT_EQ(calls.chunk_copies, 0) << "no copy per chunk";
    EXPECT_EQ(calls.fence_waits, 0) << "the training thread waits for no copy";
    EXPECT_EQ(calls.compute_waits, 1);
  }
  EXPECT_EQ(small.regions, 2);
  EXPECT_EQ(large.regions, 2) << "eight times the bytes, the same calls";
  EXPECT_EQ(large.total(), small.total());
  EXPECT_EQ(many.regions, 6) << "one region per tensor";
}

TEST_F(StreamOrderedSnapshotTest, DeferredWaitLeavesTheComputeWaitToTheLoop) {
  const Calls calls = SaveTwice(3, 1 << 20, true);
  EXPECT_EQ(calls.compute_waits, 0);
  EXPECT_EQ(calls.batches, 1);
  EXPECT_EQ(calls.regions, 3);
  EXPECT_EQ(calls.fence_waits, 0);
}

TEST_F(StreamOrderedSnapshotTest, EveryChunkWaitsForItsCopyEvenAfterTheSaveFailed) {
  // A chunk's staging returns to the pool with it: a chunk that skipped the wait because an
  // earlier chunk failed the save could hand back staging that a copy still lands in.
  auto device = std::make_shared<CountingDevice>();
  std::vector<std::vector<uint8_t>> memory;
  TensorRegistry registry = Registry(2, 1 << 20, device, memory);  // 32 chunks
  auto made = Checkpointer::Create(Options("failing", false));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  device->fail_fences = true;
  ASSERT_TRUE((*made)->save(1, registry).ok());  // the failure comes from the background
  Status finished = (*made)->wait_until_finished();
  EXPECT_EQ(finished.code(), StatusCode::kIOError) << finished.ToString();
  EXPECT_EQ(device->fence_waits_elsewhere(), 32);
}

}  // namespace
}  // namespace asyncckpt
