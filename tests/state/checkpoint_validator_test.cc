// Tests of src/state/checkpoint_validator.cc: the savers' validator
// (ValidateCheckpointDirectory) on real checkpoints written by the format's writer.

#include "src/state/checkpoint_validator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "src/format/format.h"
#include "tests/support/checkpoint_dir_test.h"
#include "tests/support/files.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing_support::WriteFile;

constexpr char kModel[] = "model.ckpt";

std::string Name(int step) { return std::string(kModel) + "-" + std::to_string(step); }

class CheckpointValidatorTest : public testing_support::CheckpointDirTest {};

TEST_F(CheckpointValidatorTest, ValidatorAcceptsACompleteCheckpointWithItsWallTime) {
  WriteCheckpoint(3, 1234.5);
  Result<ValidCheckpoint> valid = ValidateCheckpointDirectory(*posix_, Path(Name(3)));
  ASSERT_TRUE(valid.ok()) << valid.status().ToString();
  EXPECT_EQ(valid->wall_time, 1234.5);
}

TEST_F(CheckpointValidatorTest, ValidatorRejectsEachKindOfIncompleteCheckpoint) {
  fs::create_directory(Path(Name(1)));  // empty
  WriteCheckpoint(2);
  fs::remove(Path(Name(2) + "/" + format::DataFileName(1, 2)));  // index and one data file
  WriteCheckpoint(3);
  fs::resize_file(Path(Name(3) + "/" + format::DataFileName(0, 2)), 100);  // cut short
  WriteCheckpoint(4);
  fs::resize_file(Path(Name(4) + "/index"), 30);  // torn index
  WriteCheckpoint(5);
  fs::remove(Path(Name(5) + "/index"));
  fs::create_directory(Path(Name(5) + "/index"));  // not a file
  for (int step = 1; step <= 5; ++step) {
    SCOPED_TRACE(step);
    const Status status = ValidateCheckpointDirectory(*posix_, Path(Name(step))).status();
    EXPECT_TRUE(status.code() == StatusCode::kNotFound || status.code() == StatusCode::kCorruption)
        << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr(Path(Name(step))));
  }
}

TEST_F(CheckpointValidatorTest, ValidatorNeverOpensAFifoNorAllocatesAnOversizedIndex) {
  fs::create_directory(Path(Name(1)));
  ASSERT_EQ(::mkfifo(Path(Name(1) + "/index").c_str(), 0600), 0);
  const Status fifo = ValidateCheckpointDirectory(*posix_, Path(Name(1))).status();
  EXPECT_EQ(fifo.code(), StatusCode::kCorruption) << fifo.ToString();
  EXPECT_THAT(fifo.message(), HasSubstr("not a regular file"));

  fs::create_directory(Path(Name(2)));
  WriteFile(Path(Name(2) + "/index"), "");
  fs::resize_file(Path(Name(2) + "/index"), format::kMaxIndexBytes + 1);  // sparse
  const Status huge = ValidateCheckpointDirectory(*posix_, Path(Name(2))).status();
  EXPECT_EQ(huge.code(), StatusCode::kCorruption) << huge.ToString();
  EXPECT_THAT(huge.message(), HasSubstr("at most"));
}

}  // namespace
}  // namespace asyncckpt
