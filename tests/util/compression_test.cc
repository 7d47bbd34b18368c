// Tests of src/util/compression.cc: the codec names the CLI and Python take, and the ranges of
// CompressionOptions.

#include "asyncckpt/compression.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace asyncckpt {
namespace {

using ::testing::HasSubstr;

TEST(CompressionTest, EveryKindRoundTripsThroughItsName) {
  for (CompressionKind kind :
       {CompressionKind::kNone, CompressionKind::kZstd, CompressionKind::kShuffleZstd}) {
    EXPECT_EQ(ParseCompressionKind(CompressionKindName(kind)), kind);
  }
  EXPECT_EQ(CompressionKindName(CompressionKind::kShuffleZstd), "shuffle+zstd");
  EXPECT_EQ(ParseCompressionKind("shuffle_zstd"), CompressionKind::kShuffleZstd);
  EXPECT_FALSE(ParseCompressionKind("lz4").has_value());
  EXPECT_FALSE(ParseCompressionKind("").has_value());
}

TEST(CompressionTest, TheDefaultsAreValid) {
  const CompressionOptions options;
  EXPECT_EQ(options.kind, CompressionKind::kShuffleZstd);
  EXPECT_TRUE(ValidateCompressionOptions(options).ok());
}

TEST(CompressionTest, LevelAndMinSavingAreHeldToTheirRangesNamingThem) {
  CompressionOptions options;
  for (int level : {-7, 19}) {
    options.level = level;
    EXPECT_TRUE(ValidateCompressionOptions(options).ok()) << level;
  }
  for (int level : {-8, 20}) {
    options.level = level;
    const Status status = ValidateCompressionOptions(options);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << level;
    EXPECT_THAT(status.message(), HasSubstr("compression level must be in [-7, 19]")) << level;
  }
  options.level = 1;
  for (double saving : {-0.1, 1.0, std::nan("")}) {
    options.min_saving = saving;
    const Status status = ValidateCompressionOptions(options);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << saving;
    EXPECT_THAT(status.message(), HasSubstr("min_saving")) << saving;
  }
}

}  // namespace
}  // namespace asyncckpt
