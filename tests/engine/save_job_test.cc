#include "src/engine/save_job.h"

#include <gtest/gtest.h>

namespace asyncckpt {
namespace {

TEST(SaveJobTest, TheFirstFailureIsTheOneReported) {
  SaveJob save;
  EXPECT_FALSE(save.failed);
  save.Fail(Status::IOError("first"));
  save.Fail(Status::Internal("second"));
  EXPECT_TRUE(save.failed);
  EXPECT_EQ(save.FirstFailure().message(), "first");
  EXPECT_EQ(save.Stats().status.message(), "first");
}

TEST(SaveJobTest, TheLevelDropsOnlyWhenEncodingIsTheBottleneckThenTurnsRaw) {
  SaveJob save;
  save.SetLevel(3);
  CompressionOptions options;
  options.kind = CompressionKind::kZstd;
  for (int i = 0; i < 10; ++i) save.MaybeLowerLevel(2, /*encoders_bottleneck=*/false);
  EXPECT_EQ(save.Compression(options).level, 3);
  save.MaybeLowerLevel(2, true);  // counts past `every` from the calls above
  EXPECT_EQ(save.Compression(options).level, 1);
  save.MaybeLowerLevel(2, true);
  save.MaybeLowerLevel(2, true);
  EXPECT_EQ(save.Compression(options).level, -5);
  save.MaybeLowerLevel(2, true);
  save.MaybeLowerLevel(2, true);
  EXPECT_EQ(save.Compression(options).kind, CompressionKind::kNone);
  const SaveStats stats = save.Stats();
  EXPECT_TRUE(stats.switched_to_raw);
  EXPECT_EQ(stats.final_level, -5);
}

TEST(SaveJobTest, StatsSumTheJobsAndCountCodecs) {
  SaveJob save;
  save.metadata.step = 42;
  save.jobs = {format::ChunkJob{0, 0, 0, 100, 0}, format::ChunkJob{0, 1, 100, 50, 1}};
  save.bytes_stored = 120;
  save.codec_counts[static_cast<size_t>(codec::Codec::kRaw)] = 2;
  const SaveStats stats = save.Stats();
  EXPECT_EQ(stats.step, 42);
  EXPECT_EQ(stats.bytes_raw, 150u);
  EXPECT_EQ(stats.bytes_stored, 120u);
  EXPECT_EQ(stats.chunks_by_codec.at("raw"), 2u);
  EXPECT_TRUE(stats.status.ok());
}

}  // namespace
}  // namespace asyncckpt
