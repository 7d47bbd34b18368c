// ValidateCheckpointDirectory (the savers' validator) and CommittedCheckpointSteps, on real
// checkpoints written by the format's writer.

#include "src/state/committed_steps.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

#include "asyncckpt/state.h"
#include "src/format/format.h"
#include "src/format/writer.h"
#include "src/state/checkpoint_state.h"
#include "tests/support/checkpoint_files.h"
#include "tests/support/files.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_support::WriteFile;

constexpr char kModel[] = "model.ckpt";

std::string Name(int step) { return std::string(kModel) + "-" + std::to_string(step); }

class CommittedStepsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::path(::testing::TempDir()) / "committed_steps_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    posix_ = io::NewPosixFileSystem();
    values_.resize(4096);
    for (size_t i = 0; i < values_.size(); ++i) values_[i] = static_cast<float>(i);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // A complete checkpoint "model.ckpt-<step>" with two data files, committed at `wall_time`.
  void WriteCheckpoint(int step, double wall_time = 0) {
    const std::string path = Path(Name(step));
    ASSERT_TRUE(fs::create_directory(path));
    const format::HostTensor tensor{
        "w", DType::kF32, {4096}, values_.data(), values_.size() * sizeof(float)};
    testing_support::WriterOptions options;
    options.chunk_bytes = 4096;
    options.num_data_files = 2;
    options.compression.kind = CompressionKind::kNone;
    const CheckpointMetadata metadata{step, wall_time, {}};
    auto written =
        testing_support::WriteCheckpointFiles(*posix_, path, {&tensor, 1}, metadata, options);
    ASSERT_TRUE(written.ok()) << written.status().ToString();
  }

  void WriteState(const std::vector<int>& steps) {
    CheckpointState state;
    for (int step : steps) {
      state.all_model_checkpoint_paths.push_back(Name(step));
      state.all_model_checkpoint_timestamps.push_back(step);
    }
    if (!steps.empty()) state.model_checkpoint_path = state.all_model_checkpoint_paths.back();
    ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());
  }

  std::string dir_;
  std::unique_ptr<io::FileSystem> posix_;
  std::vector<float> values_;
};

TEST_F(CommittedStepsTest, ValidatorAcceptsACompleteCheckpointWithItsWallTime) {
  WriteCheckpoint(3, 1234.5);
  Result<ValidCheckpoint> valid = ValidateCheckpointDirectory(*posix_, Path(Name(3)));
  ASSERT_TRUE(valid.ok()) << valid.status().ToString();
  EXPECT_EQ(valid->wall_time, 1234.5);
}

TEST_F(CommittedStepsTest, ValidatorRejectsEachKindOfIncompleteCheckpoint) {
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

TEST_F(CommittedStepsTest, ValidatorNeverOpensAFifoNorAllocatesAnOversizedIndex) {
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

// ---- committed steps for readers ----------------------------------------------------------------

TEST_F(CommittedStepsTest, CommittedStepsValidateWhatTheStateFileNames) {
  for (int step = 1; step <= 3; ++step) WriteCheckpoint(step);
  WriteState({2, 3});
  EXPECT_THAT(CommittedCheckpointSteps(dir_, kModel).value(), ElementsAre(2, 3));
  fs::resize_file(Path(Name(3) + "/" + format::DataFileName(0, 2)), 1);  // 3 goes bad
  EXPECT_THAT(CommittedCheckpointSteps(dir_, kModel).value(), ElementsAre(1, 2));
  EXPECT_TRUE(CommittedCheckpointSteps(dir_ + "/missing", kModel).value().empty());
}

}  // namespace
}  // namespace asyncckpt
