// Memory over many asynchronous saves: the heap a saver holds stays flat, whatever the number
// of saves (a per-save record that is never dropped shows as steady growth).

#include <gtest/gtest.h>
#include <malloc.h>
#include <stdlib.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/checkpointer.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/tensor.h"
#include "src/util/log.h"
#include "tests/support/tensor_ref.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;

// Heap bytes in use (glibc's count of allocated chunks).
int64_t HeapInUse() { return static_cast<int64_t>(::mallinfo2().uordblks); }

// 2,000 saves of a 16 KiB state. After a warm-up of kWarmUp saves (pools, rings, threads, the
// first checkpoints, a full window of kSaverTotalsWindow stats), the heap in use may grow by at
// most kBound bytes to the end: 1,500 saves, so a leak of 44 bytes per save or more fails (the
// reported growth was about 1 KiB a save). The bound leaves room for one-time allocations that
// a loaded machine moves past the warm-up (a oneTBB worker's first encode: about 22 KiB).
// Before kSaverTotalsWindow went from 1000 to 128 it grew by about 340 bytes a save here.
constexpr int kSaves = 2000;
constexpr int kWarmUp = 500;
constexpr int64_t kBound = 64 << 10;

TEST(SaveMemoryTest, TwoThousandAsyncSavesKeepTheHeapFlat) {
  std::string pattern = ::testing::TempDir() + "/save_memory_test-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
  const std::string dir = pattern;
  std::vector<float> weights(4096, 0.5f);
  TensorRegistry registry;
  ASSERT_TRUE(registry
                  .add(testing_support::Ref("weights", DType::kF32, {4096}, weights.data(),
                                            weights.size() * sizeof(float)))
                  .ok());
  SaverOptions options;
  options.checkpoint_dir = dir;
  options.save_steps = 1;
  options.max_to_keep = 1;
  options.num_data_files = 1;
  options.use_o_direct = false;
  auto previous = SetLogSink([](LogLevel, std::string_view) {});  // retention logs every save
  {
    auto checkpointer = Checkpointer::Create(options);
    ASSERT_TRUE(checkpointer.ok()) << checkpointer.status().ToString();
    int64_t at_warm_up = 0;
    for (int step = 1; step <= kSaves; ++step) {
      weights[0] = static_cast<float>(step);
      const Status saved = (*checkpointer)->save(step, registry);
      ASSERT_TRUE(saved.ok()) << saved.ToString();
      if (step == kWarmUp || step == kSaves) {
        ASSERT_TRUE((*checkpointer)->wait_until_finished().ok());
        ::malloc_trim(0);
        if (step == kWarmUp) at_warm_up = HeapInUse();
      }
      if (step % 250 == 0) {
        ASSERT_TRUE((*checkpointer)->wait_until_finished().ok());
        std::fprintf(stderr, "after %d saves: heap in use %lld bytes\n", step,
                     static_cast<long long>(HeapInUse()));
      }
    }
    const int64_t growth = HeapInUse() - at_warm_up;
    std::fprintf(stderr, "heap growth over saves %d..%d: %lld bytes (%.1f per save)\n", kWarmUp,
                 kSaves, static_cast<long long>(growth),
                 static_cast<double>(growth) / (kSaves - kWarmUp));
    EXPECT_LT(growth, kBound) << "the heap grows with every save";
    ASSERT_TRUE((*checkpointer)->close().ok());
  }
  SetLogSink(std::move(previous));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace asyncckpt
