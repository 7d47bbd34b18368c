// Tests of src/util/status.cc: Status and Result, the error type of every call that can fail.

#include "asyncckpt/status.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace asyncckpt {
namespace {

TEST(StatusTest, OkHasNoMessageAndPrintsAsOk) {
  const Status ok = Status::OK();
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.code(), StatusCode::kOk);
  EXPECT_EQ(ok.message(), "");
  EXPECT_EQ(ok.ToString(), "OK");
}

TEST(StatusTest, AFailurePrintsItsCodeNameAndMessage) {
  const Status failed = Status::Corruption("index model.ckpt-3/index: bad magic number");
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(failed.ToString(), "Corruption: index model.ckpt-3/index: bad magic number");
}

TEST(StatusTest, EveryFactoryGivesItsOwnCodeWithAName) {
  const std::vector<std::pair<Status, std::string>> cases = {
      {Status::InvalidArgument("m"), "InvalidArgument"},
      {Status::NotFound("m"), "NotFound"},
      {Status::AlreadyExists("m"), "AlreadyExists"},
      {Status::IOError("m"), "IOError"},
      {Status::Corruption("m"), "Corruption"},
      {Status::Cancelled("m"), "Cancelled"},
      {Status::OutOfRange("m"), "OutOfRange"},
      {Status::FailedPrecondition("m"), "FailedPrecondition"},
      {Status::Unavailable("m"), "Unavailable"},
      {Status::Internal("m"), "Internal"},
      {Status::Aborted("m"), "Aborted"},
      {Status::ResourceExhausted("m"), "ResourceExhausted"},
  };
  for (const auto& [status, name] : cases) {
    EXPECT_FALSE(status.ok()) << name;
    EXPECT_EQ(StatusCodeName(status.code()), name);
    EXPECT_EQ(status.ToString(), name + ": m");
  }
}

TEST(StatusTest, ContextPrefixesAFailureAndLeavesOkAlone) {
  const Status failed = Status::IOError("fsync failed").WithContext("saving model.ckpt-10");
  EXPECT_EQ(failed.code(), StatusCode::kIOError);
  EXPECT_EQ(failed.message(), "saving model.ckpt-10: fsync failed");
  EXPECT_TRUE(Status::OK().WithContext("saving model.ckpt-10").ok());
  EXPECT_EQ(Status::OK().WithContext("saving").message(), "");
}

TEST(ResultTest, HoldsAValueOrTheStatusThatSaysWhyNot) {
  Result<std::string> value(std::string("model.ckpt-3"));
  ASSERT_TRUE(value.ok());
  EXPECT_TRUE(value.status().ok());
  EXPECT_EQ(*value, "model.ckpt-3");
  EXPECT_EQ(value->size(), 12u);
  EXPECT_EQ(std::move(value).value(), "model.ckpt-3");

  const Result<std::string> missing(Status::NotFound("no checkpoint"));
  EXPECT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(ResultTest, AResultBuiltFromOkIsAnInternalErrorNotAnEmptyValue) {
  const Result<int> wrong(Status::OK());
  EXPECT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace asyncckpt
