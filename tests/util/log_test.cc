// Tests of src/util/log.cc: every line goes to the sink set last, one call per line, and a null
// sink gives the lines back to stderr.

#include "src/util/log.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace asyncckpt {
namespace {

TEST(LogTest, TheSinkSetLastGetsEachLineWithoutThePrefix) {
  std::vector<std::string> first;
  std::vector<std::string> second;
  LogSinkFunction before =
      SetLogSink([&first](LogLevel, std::string_view line) { first.emplace_back(line); });
  LogInfo("one");
  LogSinkFunction replaced =
      SetLogSink([&second](LogLevel, std::string_view line) { second.emplace_back(line); });
  ASSERT_TRUE(replaced);  // the previous sink comes back to its setter
  LogInfo("two");
  SetLogSink(std::move(before));
  EXPECT_EQ(first, std::vector<std::string>{"one"});
  EXPECT_EQ(second, std::vector<std::string>{"two"});
}

TEST(LogTest, LinesFromSeveralThreadsReachTheSinkOneCallAtATime) {
  std::vector<std::string> lines;
  int inside = 0;
  bool overlapped = false;
  LogSinkFunction before = SetLogSink([&](LogLevel, std::string_view line) {
    overlapped = overlapped || ++inside > 1;
    lines.emplace_back(line);
    --inside;
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 100; ++i) LogInfo("thread " + std::to_string(t));
    });
  }
  for (std::thread& thread : threads) thread.join();
  SetLogSink(std::move(before));
  EXPECT_FALSE(overlapped);
  EXPECT_EQ(lines.size(), 400u);
}

TEST(LogTest, ANullSinkGivesTheLinesBackToStderr) {
  LogSinkFunction before = SetLogSink([](LogLevel, std::string_view) {});
  SetLogSink(nullptr);
  ::testing::internal::CaptureStderr();
  LogInfo("to stderr");
  const std::string written = ::testing::internal::GetCapturedStderr();
  SetLogSink(std::move(before));
  EXPECT_EQ(written, "asyncckpt: to stderr\n");
}

TEST(LogTest, EachLineReachesTheSinkWithItsLevelAndStderrNamesWarningsAndErrors) {
  std::vector<std::pair<LogLevel, std::string>> seen;
  LogSinkFunction before = SetLogSink(
      [&](LogLevel level, std::string_view line) { seen.emplace_back(level, std::string(line)); });
  LogInfo("did it");
  LogWarning("look at it");
  LogError("it broke");
  SetLogSink(nullptr);
  ::testing::internal::CaptureStderr();
  LogWarning("look at it");
  LogError("it broke");
  const std::string written = ::testing::internal::GetCapturedStderr();
  SetLogSink(std::move(before));
  EXPECT_EQ(seen, (std::vector<std::pair<LogLevel, std::string>>{{LogLevel::kInfo, "did it"},
                                                                 {LogLevel::kWarning, "look at it"},
                                                                 {LogLevel::kError, "it broke"}}));
  EXPECT_EQ(written, "asyncckpt: WARNING: look at it\nasyncckpt: ERROR: it broke\n");
}

}  // namespace
}  // namespace asyncckpt
