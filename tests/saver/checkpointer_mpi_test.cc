// The Checkpointer in a job of several processes (mpirun -np 2 and -np 4), over MpiCoordinator:
// every rank saves its shards of the same steps into one shared checkpoint_dir, each save one
// sharded checkpoint that restores on any box; tensors that appear between saves are agreed
// again; a failure one rank keeps fails the next save on every rank, naming it.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "asyncckpt/checkpointer.h"
#include "asyncckpt/mpi_coordinator.h"
#include "asyncckpt/reader.h"
#include "io/fault_injection_file_system.h"
#include "tests/support/shared_temp_dir.h"
#include "tests/support/tensor_ref.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing_support::Ref;

constexpr int64_t kRowsPerRank = 64;
constexpr int64_t kColumns = 48;

class CheckpointerMpiTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<Coordinator>> made =
        NewMpiCoordinator(MPI_COMM_WORLD, {.timeout_seconds = 120});
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    coordinator_ = std::move(made).value();
    rank_ = coordinator_->rank();
    world_ = coordinator_->size();
    Result<std::string> job_dir =
        testing_support::SharedTempDir(*coordinator_, "asyncckpt-ckptr-mpi");
    ASSERT_TRUE(job_dir.ok()) << job_dir.status().ToString();
    dir_ = *job_dir + "/ckpt";
    rows_.resize(size_t(kRowsPerRank * kColumns));
  }

  void TearDown() override {
    ASSERT_TRUE(coordinator_->all_gather({}).ok());
    if (rank_ == 0) fs::remove_all(fs::path(dir_).parent_path());
  }

  SaverOptions Options() const {
    SaverOptions options;
    options.checkpoint_dir = dir_;
    options.coordinator = coordinator_.get();
    options.save_steps = 1;
    options.max_to_keep = 0;
    options.force_posix_io = true;
    options.use_o_direct = false;
    options.num_data_files = 1;
    options.chunk_bytes = 4096;
    return options;
  }

  SaveMode Mode() const { return GetParam() ? SaveMode::kAsynchronous : SaveMode::kSynchronous; }

  // This rank's rows of the global "w" for `step`: element (row, col) of the global tensor is
  // step * 1e6 + row * kColumns + col.
  void Fill(int64_t step) {
    for (int64_t r = 0; r < kRowsPerRank; ++r) {
      for (int64_t c = 0; c < kColumns; ++c) {
        rows_[size_t(r * kColumns + c)] =
            float(step * 1000000 + (rank_ * kRowsPerRank + r) * kColumns + c);
      }
    }
    replica_ = float(step);
  }

  TensorRegistry Registry(bool with_moments) {
    TensorRegistry registry;
    EXPECT_TRUE(registry
                    .add(Ref("w", DType::kF32, {kRowsPerRank, kColumns}, rows_.data(),
                             rows_.size() * sizeof(float), {world_ * kRowsPerRank, kColumns},
                             {rank_ * kRowsPerRank, 0}))
                    .ok());
    EXPECT_TRUE(registry.add(Ref("step", DType::kF32, {1}, &replica_, sizeof(float))).ok());
    if (with_moments) {
      moments_.assign(rows_.size(), float(rank_ + 1));
      EXPECT_TRUE(registry
                      .add(Ref("opt/m", DType::kF32, {kRowsPerRank, kColumns}, moments_.data(),
                               moments_.size() * sizeof(float), {world_ * kRowsPerRank, kColumns},
                               {rank_ * kRowsPerRank, 0}))
                      .ok());
    }
    return registry;
  }

  // Rank 0: checkpoint `step` holds the global "w" of that step, whole, verified.
  void ExpectGlobalOfStep(int64_t step) {
    if (rank_ != 0) return;
    auto reader = CheckpointReader::Open(dir_ + "/model.ckpt-" + std::to_string(step));
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    EXPECT_TRUE((*reader)->sharded());
    EXPECT_EQ((*reader)->world_size(), uint32_t(world_));
    std::vector<float> global(size_t(world_ * kRowsPerRank * kColumns));
    ASSERT_TRUE((*reader)->read("w", global.data(), global.size() * sizeof(float)).ok());
    for (size_t i = 0; i < global.size(); ++i) {
      ASSERT_EQ(global[i], float(step * 1000000 + int64_t(i))) << i;
    }
    EXPECT_TRUE((*reader)->verify().problems.empty());
  }

  std::unique_ptr<Coordinator> coordinator_;
  int rank_ = 0;
  int world_ = 1;
  std::string dir_;
  std::vector<float> rows_;
  std::vector<float> moments_;
  float replica_ = 0;
};

TEST_P(CheckpointerMpiTest, EveryRanksShardsMakeOneCheckpointPerStepThatRestoresWhole) {
  auto made = Checkpointer::Create(Options(), Mode());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Checkpointer& checkpointer = **made;
  for (int64_t step : {10, 20}) {
    Fill(step);
    ASSERT_TRUE(checkpointer.save(step, Registry(false)).ok());
  }
  ASSERT_TRUE(checkpointer.close().ok());
  ExpectGlobalOfStep(10);
  ExpectGlobalOfStep(20);
  EXPECT_EQ(checkpointer.all_steps(), (std::vector<int64_t>{10, 20})) << "rank " << rank_;
}

TEST_P(CheckpointerMpiTest, TensorsThatAppearBetweenSavesAreAgreedAgainAndSaved) {
  auto made = Checkpointer::Create(Options(), Mode());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Checkpointer& checkpointer = **made;
  Fill(1);
  ASSERT_TRUE(checkpointer.save(1, Registry(false)).ok());
  Fill(2);
  ASSERT_TRUE(checkpointer.save(2, Registry(true)).ok());  // the optimizer's moments appear
  ASSERT_TRUE(checkpointer.close().ok());
  ExpectGlobalOfStep(2);
  if (rank_ == 0) {
    auto reader = CheckpointReader::Open(dir_ + "/model.ckpt-2");
    ASSERT_TRUE(reader.ok());
    std::vector<float> m(size_t(world_ * kRowsPerRank * kColumns));
    ASSERT_TRUE((*reader)->read("opt/m", m.data(), m.size() * sizeof(float)).ok());
    EXPECT_EQ(m.front(), 1.f);
    EXPECT_EQ(m.back(), float(world_));
    auto first = CheckpointReader::Open(dir_ + "/model.ckpt-1");
    ASSERT_TRUE(first.ok());
    EXPECT_EQ((*first)->find("opt/m"), nullptr);
  }
}

TEST_P(CheckpointerMpiTest, AFailureOneRankKeepsFailsTheNextSaveOnEveryRankNamingIt) {
  std::unique_ptr<io::FileSystem> posix = io::NewPosixFileSystem();
  io::FaultInjectionFileSystem faults(posix.get());
  SaverOptions options = Options();
  const int failing = world_ - 1;
  if (rank_ == failing) options.file_system = &faults;
  auto made = Checkpointer::Create(options, Mode());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Checkpointer& checkpointer = **made;
  Fill(1);
  ASSERT_TRUE(checkpointer.save(1, Registry(false)).ok());
  ASSERT_TRUE(checkpointer.wait_until_finished().ok());
  // That rank's data writes fail (its disk full); it can still tell rank 0 so.
  if (rank_ == failing) faults.fail_ops_matching("/data-", ENOSPC, io::FaultOp::kWrite);
  Fill(2);
  const Status second = checkpointer.save(2, Registry(false));
  const Status waited = second.ok() ? checkpointer.wait_until_finished() : second;
  EXPECT_FALSE(waited.ok()) << "rank " << rank_;
  Fill(3);
  const Status third = checkpointer.save(3, Registry(false));
  ASSERT_FALSE(third.ok()) << "rank " << rank_;
  EXPECT_THAT(third.message(), HasSubstr("rank " + std::to_string(failing)));
  (void)checkpointer.close();
  if (rank_ == 0) {
    EXPECT_TRUE(fs::exists(dir_ + "/model.ckpt-1"));
    EXPECT_FALSE(fs::exists(dir_ + "/model.ckpt-2")) << "a save with a failed part committed";
  }
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, CheckpointerMpiTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Async" : "Sync"; });

}  // namespace
}  // namespace asyncckpt
