#pragma once

// CheckpointDirTest: a fresh temporary checkpoint directory with the POSIX file system, and
// helpers that fill it with complete checkpoints (written by the format's writer) and a state
// file. Shared by the tests of the savers' start-up and of the committed-steps validator.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"
#include "src/format/writer.h"
#include "src/state/checkpoint_state.h"
#include "tests/support/checkpoint_files.h"

namespace asyncckpt::testing_support {

/// The model checkpoints' basename these tests use by default.
inline constexpr char kModelBasename[] = "model.ckpt";

/// "<basename>-<step>".
inline std::string CheckpointName(const std::string& basename, int step) {
  return basename + "-" + std::to_string(step);
}

/// A temporary checkpoint directory (removed after the test) and ways to fill it.
class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::path(::testing::TempDir()) / "checkpoint_dir_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    posix_ = io::NewPosixFileSystem();
    values_.resize(4096);
    for (size_t i = 0; i < values_.size(); ++i) values_[i] = static_cast<float>(i);
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  /// `name` inside the directory.
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  /// A complete checkpoint "<basename>-<step>" with two data files, committed at `wall_time`.
  void WriteCheckpoint(int step, double wall_time = 0,
                       const std::string& basename = kModelBasename) {
    const std::string path = Path(CheckpointName(basename, step));
    ASSERT_TRUE(std::filesystem::create_directory(path));
    const format::HostTensor tensor{
        "w", DType::kF32, {4096}, values_.data(), values_.size() * sizeof(float)};
    WriterOptions options;
    options.chunk_bytes = 4096;
    options.num_data_files = 2;
    options.compression.kind = CompressionKind::kNone;
    const CheckpointMetadata metadata{step, wall_time, {}};
    auto written = WriteCheckpointFiles(*posix_, path, {&tensor, 1}, metadata, options);
    ASSERT_TRUE(written.ok()) << written.status().ToString();
  }

  /// A state file `state_file` listing "<basename>-<step>" for `steps`, the last the latest.
  void WriteState(const std::vector<int>& steps, const std::string& basename = kModelBasename,
                  const std::string& state_file = kCheckpointStateFileName) {
    CheckpointState state;
    for (int step : steps) {
      state.all_model_checkpoint_paths.push_back(CheckpointName(basename, step));
      state.all_model_checkpoint_timestamps.push_back(step);
    }
    if (!steps.empty()) state.model_checkpoint_path = state.all_model_checkpoint_paths.back();
    ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state, state_file).ok());
  }

  std::string dir_;
  std::unique_ptr<io::FileSystem> posix_;
  std::vector<float> values_;
};

}  // namespace asyncckpt::testing_support
