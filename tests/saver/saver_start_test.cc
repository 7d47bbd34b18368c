// Tests of src/saver/saver_start.cc in one process: a start is its storage's start, and the
// agreement that every rank started is the process's own outcome. The multi-process paths run
// under mpirun: tests/saver/saver_mpi_test.cc.

#include "src/saver/saver_start.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/coordinator.h"
#include "tests/support/checkpoint_dir_test.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class SaverStartTest : public testing_support::CheckpointDirTest {
 protected:
  SaverOptions Options() {
    SaverOptions options;
    options.checkpoint_dir = dir_;
    options.save_steps = 1;
    options.file_system = posix_.get();
    return options;
  }
};

TEST_F(SaverStartTest, OneProcessStartsItsStorageAndWritesItsOwnRegistry) {
  fs::create_directory(Path("model.ckpt-3.tmp-0123456789abcdef"));  // an interrupted save
  SaverOptions options = Options();
  std::unique_ptr<Coordinator> single = NewSingleProcessCoordinator();
  options.coordinator = single.get();  // a job of one is a single process
  SaverStorage storage;
  Result<SaverStart> start = StartSaver(options, TensorRegistry(), &storage);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_THAT(start->removed, ElementsAre("model.ckpt-3.tmp-0123456789abcdef"));
  EXPECT_TRUE(start->job_token.empty());
  EXPECT_EQ(start->written, nullptr);
  EXPECT_NE(storage.lock, nullptr);
  EXPECT_NE(storage.manager, nullptr);
}

TEST_F(SaverStartTest, OneProcessAgreesWithItself) {
  EXPECT_TRUE(AgreeStarted(Options(), Status::OK()).ok());
  const Status failed = AgreeStarted(Options(), Status::Internal("no engine"));
  EXPECT_EQ(failed.code(), StatusCode::kInternal);
  EXPECT_THAT(failed.message(), HasSubstr("no engine"));
}

}  // namespace
}  // namespace asyncckpt
