// The engine's own threads: a save completes while the training job's oneTBB work holds every
// worker (the arena pump), and the pump and commit threads are named for profiles.

#include "src/engine/engine_threads.h"

#include <gtest/gtest.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/engine/engine.h"
#include "src/state/checkpoint_state.h"
#include "tests/support/checkpoint_dir_test.h"
#include "tests/support/tensor_ref.h"

namespace asyncckpt {
namespace {

using testing_support::CheckpointDirTest;
using testing_support::Ref;

class EngineThreadsTest : public CheckpointDirTest {};

// Every oneTBB thread of the default arena busy until `release`, as in a training step's
// parallel_for; returns once all of them are inside.
std::thread HoldAllWorkers(std::atomic<bool>& release) {
  const int threads = tbb::this_task_arena::max_concurrency();
  auto inside = std::make_shared<std::atomic<int>>(0);
  std::thread holder([&release, inside, threads] {
    tbb::parallel_for(
        0, threads, 1,
        [&](int) {
          ++*inside;
          const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
          while (!release.load() && std::chrono::steady_clock::now() < give_up) {
            std::this_thread::yield();
          }
        },
        tbb::simple_partitioner());
  });
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (inside->load() < threads && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return holder;
}

TEST_F(EngineThreadsTest, SaveCommitsWhileTheJobHoldsEveryWorker) {
  std::vector<float> values(1 << 16, 1.5f);
  TensorRegistry registry;
  ASSERT_TRUE(registry.add(Ref("w", DType::kF32, {1 << 16}, values.data(), 1 << 18)).ok());
  EngineOptions options;
  options.saver.checkpoint_dir = dir_;
  options.saver.chunk_bytes = 16 << 10;
  CheckpointManager manager(posix_.get(), dir_, options.saver.basename, 0, 0, SystemClockSeconds);
  ASSERT_TRUE(manager.Start().ok());
  std::promise<SaveStats> done;
  auto plan = PlanSnapshot(registry, options, "test");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto engine = Engine::Create(options, *plan, posix_.get(), &manager, &registry,
                               [&](const SaveStats& stats) { done.set_value(stats); });
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();

  std::atomic<bool> release{false};
  std::thread holder = HoldAllWorkers(release);
  SubmitRequest request;
  request.metadata.step = 7;
  ASSERT_TRUE((*engine)->Submit(std::move(request)).ok());
  std::future<SaveStats> result = done.get_future();
  const bool committed_while_held =
      result.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  release = true;
  holder.join();
  EXPECT_TRUE(committed_while_held) << "the save waited for the job's oneTBB workers";
  EXPECT_TRUE(result.get().status.ok());
}

TEST(ArenaPumpTest, RunsItsWorkAgainAfterEachKick) {
  std::mutex mu;
  std::condition_variable ran;
  int runs = 0;
  {
    ArenaPump pump([&] {
      std::lock_guard lock(mu);
      ++runs;
      ran.notify_all();
    });
    for (int kick = 1; kick <= 3; ++kick) {
      pump.Kick();
      std::unique_lock lock(mu);
      ASSERT_TRUE(ran.wait_for(lock, std::chrono::seconds(10), [&] { return runs >= kick; }));
    }
  }
  EXPECT_EQ(runs, 3);
}

}  // namespace
}  // namespace asyncckpt

namespace asyncckpt {
namespace {

// The remover runs each removal on its own named thread, never on the caller's, and Wait
// returns only once every removal asked for so far has run to its end.
TEST(RetentionRemoverTest, RunsOnItsOwnThreadAndWaitCoversEveryAsk) {
  std::mutex mu;
  std::vector<std::string> names;
  std::atomic<int> runs{0};
  RetentionRemover remover([&] {
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    {
      std::lock_guard lock(mu);
      names.emplace_back(name);
    }
    ++runs;
  });
  remover.Ask();
  remover.Wait();
  EXPECT_GE(runs.load(), 1);
  remover.Ask();
  remover.Ask();
  remover.Wait();
  EXPECT_GE(runs.load(), 2);
  std::lock_guard lock(mu);
  for (const std::string& name : names) EXPECT_EQ(name, kRemoverThreadName);
}

}  // namespace
}  // namespace asyncckpt
