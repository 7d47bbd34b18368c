// Tests of the saver core's bookkeeping: the running totals and the window of recent saves.
// (The core's start, engine and failure policy are exercised through every saver's tests.)

#include "src/saver/saver_core.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "asyncckpt/saver_hook.h"

namespace asyncckpt {
namespace {

// The stats of save `i` of a synthetic run: every 7th fails, sizes and times vary with i.
SaveStats StatsOfSave(int64_t i) {
  SaveStats stats;
  stats.step = i * 10;
  stats.path = "/ckpt/model.ckpt-" + std::to_string(stats.step);
  if (i % 7 == 3) stats.status = Status::IOError("disk full");
  stats.bytes_raw = 1000 + static_cast<uint64_t>(i);
  stats.bytes_stored = 500 + static_cast<uint64_t>(i % 13);
  stats.chunks_by_codec = {{"raw", 1}, {"zstd", static_cast<uint64_t>(i % 3)}};
  stats.blocked_seconds = 0.001 * static_cast<double>(i % 101);
  stats.seconds_to_durable = 0.01 * static_cast<double>(i % 37);
  return stats;
}

TEST(SaverTotalsTest, KeepsTheMostRecentSavesAndExactTotalsOverAll) {
  constexpr int64_t kSaves = 2 * static_cast<int64_t>(kSaverTotalsWindow) + 345;
  SaverTotals totals;
  SaverTotals expected;
  for (int64_t i = 0; i < kSaves; ++i) {
    const SaveStats stats = StatsOfSave(i);
    AddToTotals(stats, &totals);
    if (stats.status.ok()) {
      ++expected.saves_committed;
      expected.bytes_raw += stats.bytes_raw;
      expected.bytes_stored += stats.bytes_stored;
      expected.seconds_to_durable_total += stats.seconds_to_durable;
      expected.seconds_to_durable_max =
          std::max(expected.seconds_to_durable_max, stats.seconds_to_durable);
      for (const auto& [codec, n] : stats.chunks_by_codec) expected.chunks_by_codec[codec] += n;
    } else {
      ++expected.saves_failed;
    }
    expected.blocked_seconds_total += stats.blocked_seconds;
    expected.blocked_seconds_max = std::max(expected.blocked_seconds_max, stats.blocked_seconds);
  }
  ASSERT_EQ(totals.saves.size(), kSaverTotalsWindow);
  for (size_t k = 0; k < totals.saves.size(); ++k) {
    const int64_t i = kSaves - static_cast<int64_t>(kSaverTotalsWindow) + static_cast<int64_t>(k);
    EXPECT_EQ(totals.saves[k].step, i * 10);
    EXPECT_EQ(totals.saves[k].status.ok(), StatsOfSave(i).status.ok());
  }
  EXPECT_EQ(totals.saves_committed + totals.saves_failed, kSaves);
  EXPECT_EQ(totals.saves_committed, expected.saves_committed);
  EXPECT_EQ(totals.saves_failed, expected.saves_failed);
  EXPECT_EQ(totals.bytes_raw, expected.bytes_raw);
  EXPECT_EQ(totals.bytes_stored, expected.bytes_stored);
  EXPECT_EQ(totals.chunks_by_codec, expected.chunks_by_codec);
  // Summed in the same order, so equal to the last bit.
  EXPECT_EQ(totals.blocked_seconds_total, expected.blocked_seconds_total);
  EXPECT_EQ(totals.blocked_seconds_max, expected.blocked_seconds_max);
  EXPECT_EQ(totals.seconds_to_durable_total, expected.seconds_to_durable_total);
  EXPECT_EQ(totals.seconds_to_durable_max, expected.seconds_to_durable_max);
}

TEST(SaverTotalsTest, FewerSavesThanTheWindowAreAllKept) {
  SaverTotals totals;
  for (int64_t i = 0; i < 5; ++i) AddToTotals(StatsOfSave(i), &totals);
  ASSERT_EQ(totals.saves.size(), 5u);
  EXPECT_EQ(totals.saves.front().step, 0);
  EXPECT_EQ(totals.saves.back().step, 40);
  EXPECT_EQ(totals.saves_failed, 1);  // save 3
}

}  // namespace
}  // namespace asyncckpt
