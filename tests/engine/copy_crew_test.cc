#include "src/engine/copy_crew.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace asyncckpt {
namespace {

TEST(CopyCrewTest, RunsEveryIndexExactlyOnceOverManyRuns) {
  CopyCrew crew(3);
  EXPECT_EQ(crew.helpers(), 3u);
  for (size_t n : {0u, 1u, 2u, 7u, 1000u}) {
    std::vector<std::atomic<int>> runs(n);
    crew.Run(n, [&](size_t i) { ++runs[i]; });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(runs[i].load(), 1) << "n " << n << " index " << i;
  }
}

TEST(CopyCrewTest, HelpersJoinTheCallerOnLargeRuns) {
  CopyCrew crew(2);
  std::mutex mu;
  std::set<std::thread::id> threads;
  std::atomic<int> arrived{0};
  // Each of the first three indices waits for the other two, so three threads must take part.
  crew.Run(3, [&](size_t) {
    {
      std::lock_guard lock(mu);
      threads.insert(std::this_thread::get_id());
    }
    ++arrived;
    while (arrived.load() < 3) std::this_thread::yield();
  });
  EXPECT_EQ(threads.size(), 3u);
}

TEST(CopyCrewTest, NoHelpersRunsOnTheCaller) {
  CopyCrew crew(0);
  std::set<std::thread::id> threads;
  crew.Run(5, [&](size_t) { threads.insert(std::this_thread::get_id()); });
  EXPECT_EQ(threads, std::set<std::thread::id>{std::this_thread::get_id()});
}

}  // namespace
}  // namespace asyncckpt
