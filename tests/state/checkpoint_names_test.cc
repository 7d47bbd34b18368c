// Tests of src/state/checkpoint_names.cc: the names a save and a deletion pass through, the step
// of a name, and the steps a name can carry.

#include "src/state/checkpoint_names.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace asyncckpt {
namespace {

TEST(TempDirNameTest, AppendsSixteenRandomHexDigits) {
  const std::string a = TempDirName("model.ckpt-10");
  const std::string b = TempDirName("model.ckpt-10");
  const std::string prefix = "model.ckpt-10.tmp-";
  for (const std::string& name : {a, b}) {
    ASSERT_EQ(name.size(), prefix.size() + 16) << name;
    EXPECT_EQ(name.substr(0, prefix.size()), prefix);
    EXPECT_EQ(name.find_first_not_of("0123456789abcdef", prefix.size()), std::string::npos) << name;
  }
  EXPECT_NE(a, b);
}

TEST(QuoteForMessageTest, QuotesAndEscapesEveryByteThatIsNotPrintableAscii) {
  EXPECT_EQ(QuoteForMessage(""), "''");
  EXPECT_EQ(QuoteForMessage("/ckpt/model.ckpt-5"), "'/ckpt/model.ckpt-5'");
  EXPECT_EQ(QuoteForMessage("a\x1b[31mb"), "'a\\x1b[31mb'");
  EXPECT_EQ(QuoteForMessage("it's\\\n\xff"), "'it\\x27s\\x5c\\x0a\\xff'");
  const std::string quoted = QuoteForMessage(std::string(1000, 'x'));
  EXPECT_EQ(quoted, "'" + std::string(200, 'x') + "'... (1000 bytes)");
}

TEST(CheckpointNameTest, ABadNameIsNamedEscaped) {
  const Status status = ValidateCheckpointName("a\x1b[2Jb");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message().find('\x1b'), std::string::npos) << status.message();
}

TEST(CheckpointStepTest, AcceptsExactlyWhatCheckpointDirNameWrites) {
  EXPECT_EQ(CheckpointStep("model.ckpt-0", "model.ckpt"), 0);
  EXPECT_EQ(CheckpointStep("model.ckpt-1200", "model.ckpt"), 1200);
  EXPECT_EQ(CheckpointStep("model.ckpt-9223372036854775807", "model.ckpt"), INT64_MAX);
  for (const char* name :
       {"model.ckpt-", "model.ckpt-01", "model.ckpt--1", "model.ckpt-+1", "model.ckpt-1a",
        "model.ckpt-1.tmp-01", "model.ckpt-1.deleting-01", "model.ckpt1", "xmodel.ckpt-1",
        "input.ckpt-1", "model.ckpt-9223372036854775808", "my-notes"}) {
    EXPECT_FALSE(CheckpointStep(name, "model.ckpt").has_value()) << name;
  }
}

TEST(CheckpointStepTest, ANegativeStepIsRefusedNamingIt) {
  EXPECT_TRUE(ValidateCheckpointStep(0).ok());
  EXPECT_TRUE(ValidateCheckpointStep(INT64_MAX).ok());
  const Status refused = ValidateCheckpointStep(-1);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("step -1"), std::string::npos) << refused.ToString();
}

TEST(DeletingDirNameTest, AppendsSixteenRandomHexDigits) {
  const std::string name = DeletingDirName("model.ckpt-10");
  const std::string prefix = "model.ckpt-10.deleting-";
  ASSERT_EQ(name.size(), prefix.size() + 16) << name;
  EXPECT_EQ(name.substr(0, prefix.size()), prefix);
  EXPECT_EQ(name.find_first_not_of("0123456789abcdef", prefix.size()), std::string::npos);
}

}  // namespace
}  // namespace asyncckpt
