// Tests of src/state/retention_score.cc: a save's score read from its metadata.

#include "src/state/retention_score.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

#include "asyncckpt/state.h"

namespace asyncckpt {
namespace {

using ::testing::HasSubstr;

Result<std::optional<double>> ScoreOf(const std::string& text) {
  return RetentionScore({{"other", "x"}, {kRetentionScoreKey, text}});
}

TEST(RetentionScoreTest, NoKeyIsNoScore) {
  Result<std::optional<double>> score = RetentionScore({{"other", "1.5"}});
  ASSERT_TRUE(score.ok()) << score.status().ToString();
  EXPECT_FALSE(score->has_value());
}

TEST(RetentionScoreTest, ReadsWhatPythonsReprWrites) {
  for (const auto& [text, value] :
       std::map<std::string, double>{{"0.1", 0.1},
                                     {"-2.5e-07", -2.5e-07},
                                     {"3", 3.0},
                                     {"1.7976931348623157e+308", 1.7976931348623157e+308}}) {
    Result<std::optional<double>> score = ScoreOf(text);
    ASSERT_TRUE(score.ok()) << text << ": " << score.status().ToString();
    ASSERT_TRUE(score->has_value()) << text;
    EXPECT_EQ(**score, value) << text;
  }
}

TEST(RetentionScoreTest, AnythingButAWholeFiniteNumberIsRefusedNamingTheKey) {
  for (const std::string text : {"", "nan", "inf", "-inf", " 1", "1 ", "1.0x", "0x10", "1e999"}) {
    Result<std::optional<double>> score = ScoreOf(text);
    ASSERT_FALSE(score.ok()) << "'" << text << "'";
    EXPECT_EQ(score.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(score.status().message(), HasSubstr(kRetentionScoreKey));
    EXPECT_THAT(score.status().message(), HasSubstr("not a finite number"));
  }
}

}  // namespace
}  // namespace asyncckpt
