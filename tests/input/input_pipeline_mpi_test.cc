// CheckpointInputPipelineHook in a job of several processes (mpirun -np 2 and -np 4): each
// worker's input checkpoints are its own (input_worker_<rank>.ckpt), and under save_secs every
// worker saves the steps rank 0's clock chooses, whatever its own clock says.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/mpi_coordinator.h"
#include "asyncckpt/state.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;

class CounterIterator final : public SaveableIterator {
 public:
  Status save(IteratorState* state) override {
    const int64_t value[1] = {counter};
    return state->put_i64("counter", value);
  }
  Status restore(const IteratorState& state) override {
    auto value = state.get_i64("counter", 1);
    if (!value.ok()) return value.status();
    counter = (*value)[0];
    return Status::OK();
  }
  int64_t counter = 0;
};

TEST(InputPipelineMpiTest, SaveSecsWithASkewedClockSavesRankZerosStepsOnEveryWorker) {
  Result<std::unique_ptr<Coordinator>> made =
      NewMpiCoordinator(MPI_COMM_WORLD, {.timeout_seconds = 120});
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Coordinator& coordinator = **made;
  const int rank = coordinator.rank();
  std::vector<uint8_t> path;
  if (rank == 0) {
    std::string pattern = (fs::temp_directory_path() / "asyncckpt-input-mpi-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    path.assign(pattern.begin(), pattern.end());
  }
  ASSERT_TRUE(coordinator.broadcast(path, 0).ok());
  const std::string dir(path.begin(), path.end());

  // Rank 0: one second per step. Every other rank: far ahead and 3.1 times as fast.
  double t = 0;
  InputPipelineOptions options;
  options.saver.checkpoint_dir = dir;
  options.saver.save_secs = 5;
  options.saver.max_to_keep = 0;
  options.saver.force_posix_io = true;
  options.saver.coordinator = &coordinator;
  options.saver.clock = [&t, rank] { return rank == 0 ? t : 9000 + 3.1 * t; };
  CounterIterator iterator;
  auto hook = CheckpointInputPipelineHook::Create(options, &iterator);
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  ASSERT_TRUE((*hook)->begin().ok());
  ASSERT_TRUE((*hook)->after_create_session(0).ok());
  for (int64_t step = 1; step <= 12; ++step) {
    RunContext context(step);
    ASSERT_TRUE((*hook)->before_run(context).ok());
    ++iterator.counter;
    t += 1;
    ASSERT_TRUE((*hook)->after_run(context, RunValues{}).ok()) << "step " << step;
  }
  ASSERT_TRUE((*hook)->end(12).ok());
  EXPECT_EQ((*hook)->saves_failed(), 0);

  // This worker's own checkpoints, at rank 0's steps: 0 (the initial state), 5, 10, and 12
  // (the end's).
  const std::string basename = "input_worker_" + std::to_string(rank) + ".ckpt";
  std::vector<std::string> mine;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(basename + "-", 0) == 0 && name.find(".tmp-") == std::string::npos) {
      mine.push_back(name);
    }
  }
  std::sort(mine.begin(), mine.end());
  EXPECT_THAT(mine, ::testing::ElementsAre(basename + "-0", basename + "-10", basename + "-12",
                                           basename + "-5"));
  ASSERT_TRUE(coordinator.all_gather({}).ok());  // every rank is done with the directory
  if (rank == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace asyncckpt
