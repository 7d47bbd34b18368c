// Tests of src/state/checkpoint_validator.cc: the committed steps a reader may trust
// (ListCommittedSteps).

#include "src/state/checkpoint_validator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"
#include "io/fault_injection_file_system.h"
#include "src/util/log.h"
#include "tests/state/checkpoint_state_fixture.h"

namespace asyncckpt {
namespace {

using namespace state_testing;  // NOLINT(build/namespaces): the shared fixture
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// ---- committed steps for readers ----------------------------------------------------------------

TEST_F(CheckpointStateTest, CommittedStepsComeFromAHealthyStateFile) {
  for (int step : {1, 2, 3}) MakeCheckpointDir(Name(step), "complete 0");
  CheckpointState state;
  state.all_model_checkpoint_paths = {Name(2), Name(3)};
  state.model_checkpoint_path = Name(3);
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());
  Result<std::vector<int64_t>> steps =
      ListCommittedSteps(*posix_, dir_, kBasename, "checkpoint", ContentValidator());
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  EXPECT_THAT(*steps, ElementsAre(2, 3));
}

TEST_F(CheckpointStateTest, CommittedStepsFallBackToTheDirectoryWhenTheStateFileIsBroken) {
  for (int step : {1, 2, 3}) MakeCheckpointDir(Name(step), "complete 0");
  MakeCheckpointDir(Name(4), "torn");
  for (const std::string& text : {std::string(), std::string("garbage\n"),
                                  "model_checkpoint_path: \"" + Name(4) + "\"\n",     // incomplete
                                  "model_checkpoint_path: \"" + Name(9) + "\"\n"}) {  // missing
    SCOPED_TRACE(text);
    WriteText("checkpoint", text);
    Result<std::vector<int64_t>> steps =
        ListCommittedSteps(*posix_, dir_, kBasename, "checkpoint", ContentValidator());
    ASSERT_TRUE(steps.ok()) << steps.status().ToString();
    EXPECT_THAT(*steps, ElementsAre(1, 2, 3));
  }
  fs::remove(Path("checkpoint"));
  EXPECT_THAT(
      ListCommittedSteps(*posix_, dir_, kBasename, "checkpoint", ContentValidator()).value(),
      ElementsAre(1, 2, 3));
  EXPECT_TRUE(
      ListCommittedSteps(*posix_, dir_ + "/none", kBasename, "checkpoint", {}).value().empty());
}

}  // namespace
}  // namespace asyncckpt
