// The saver hooks in a job of several processes (mpirun -np 2 and -np 4), over MpiCoordinator,
// every rank saving into one shared checkpoint_dir: sharded saves commit once for the job,
// save_secs saves the same steps on every rank whatever each rank's clock says, replicas are
// written once (by the lowest rank holding them), and a start that fails on one rank fails on
// every rank, naming it.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/mpi_coordinator.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/state.h"
#include "asyncckpt/timer.h"
#include "io/fault_injection_file_system.h"
#include "src/format/format.h"
#include "tests/support/shared_temp_dir.h"
#include "tests/support/tensor_ref.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using testing_support::Ref;

// Returns the hook a Create() made, as a SessionRunHook, or its error.
#define ASSIGN_OR_RETURN_HOOK(expr)                                       \
  do {                                                                    \
    auto made_hook = (expr);                                              \
    if (!made_hook.ok()) return made_hook.status();                       \
    return std::unique_ptr<SessionRunHook>(std::move(made_hook).value()); \
  } while (false)

// Records the steps whose saves started and the stats of those that finished.
class Recorder : public CheckpointSaverListener {
 public:
  void before_save(int64_t step) override { steps.push_back(step); }
  std::vector<int64_t> steps;
};

class SaverMpiTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<Coordinator>> made =
        NewMpiCoordinator(MPI_COMM_WORLD, {.timeout_seconds = 120});
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    coordinator_ = std::move(made).value();
    rank_ = coordinator_->rank();
    Result<std::string> job_dir =
        testing_support::SharedTempDir(*coordinator_, "asyncckpt-saver-mpi");
    ASSERT_TRUE(job_dir.ok()) << job_dir.status().ToString();
    job_dir_ = *job_dir;
  }

  void TearDown() override {
    if (coordinator_ == nullptr) return;
    // Every rank is done with the directory before rank 0 removes it.
    ASSERT_TRUE(coordinator_->all_gather({}).ok());
    if (rank_ == 0) fs::remove_all(job_dir_);
  }

  SaverOptions Options() const {
    SaverOptions options;
    options.checkpoint_dir = job_dir_ + "/ckpt";
    options.coordinator = coordinator_.get();
    options.force_posix_io = true;
    options.use_o_direct = false;
    options.num_data_files = 1;
    options.max_to_keep = 0;
    return options;
  }

  // The synchronous or the asynchronous hook, as the test's parameter says.
  Result<std::unique_ptr<SessionRunHook>> MakeHook(SaverOptions options,
                                                   const TensorRegistry* registry,
                                                   CheckpointSaverListener* listener) {
    if (GetParam()) {
      ASSIGN_OR_RETURN_HOOK(
          AsyncCheckpointSaverHook::Create(std::move(options), registry, {listener}));
    }
    ASSIGN_OR_RETURN_HOOK(CheckpointSaverHook::Create(std::move(options), registry, {listener}));
  }

  // Every rank's list of steps, in rank order.
  std::vector<std::vector<int64_t>> GatherSteps(const std::vector<int64_t>& steps) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(steps.data());
    Result<std::vector<std::vector<uint8_t>>> gathered =
        coordinator_->all_gather({bytes, steps.size() * sizeof(int64_t)});
    EXPECT_TRUE(gathered.ok()) << gathered.status().ToString();
    std::vector<std::vector<int64_t>> all;
    if (!gathered.ok()) return all;
    for (const auto& b : *gathered) {
      std::vector<int64_t> s(b.size() / sizeof(int64_t));
      if (!s.empty()) std::memcpy(s.data(), b.data(), s.size() * sizeof(int64_t));
      all.push_back(std::move(s));
    }
    return all;
  }

  std::unique_ptr<Coordinator> coordinator_;
  int rank_ = 0;
  std::string job_dir_;
};

TEST_P(SaverMpiTest, SaveSecsWithASkewedClockSavesTheSameStepsOnEveryRank) {
  // Rank 0's clock advances one second per step. The last rank's is 5000 s ahead and runs 2.7
  // times as fast; the others are a little off. save_secs 4: by its own clock the last rank
  // would save nearly every step.
  const int last = coordinator_->size() - 1;
  double t = 0;
  const auto my_clock = [&t, rank = rank_, last]() -> double {
    if (rank == 0) return t;
    if (rank == last) return 5000 + 2.7 * t;
    return t + 0.3 * rank;
  };
  std::vector<float> w(64, 1.0f);
  TensorRegistry registry;
  ASSERT_TRUE(registry
                  .add(Ref("w", DType::kF32, {64}, w.data(), 256, {64 * coordinator_->size()},
                           {64 * rank_}))
                  .ok());
  SaverOptions options = Options();
  options.save_secs = 4;
  options.clock = my_clock;
  Recorder recorder;
  Result<std::unique_ptr<SessionRunHook>> hook = MakeHook(options, &registry, &recorder);
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  ASSERT_TRUE((*hook)->begin().ok());
  ASSERT_TRUE((*hook)->after_create_session(0).ok());
  constexpr int64_t kSteps = 21;
  for (int64_t step = 1; step <= kSteps; ++step) {
    t += 1;
    RunContext context(step);
    ASSERT_TRUE((*hook)->after_run(context, RunValues{}).ok()) << "step " << step;
  }
  ASSERT_TRUE((*hook)->end(kSteps).ok());
  const SaverTotals totals = GetParam() ? static_cast<AsyncCheckpointSaverHook&>(**hook).totals()
                                        : static_cast<CheckpointSaverHook&>(**hook).totals();
  EXPECT_EQ(totals.saves_committed, 7);
  EXPECT_EQ(totals.saves_failed, 0);
  for (const SaveStats& stats : totals.saves) {
    EXPECT_TRUE(stats.status.ok()) << "step " << stats.step << ": " << stats.status.ToString();
  }

  // Rank 0's clock alone: steps 0, 4, 8, 12, 16, 20, then the end's save of step 21.
  EXPECT_THAT(recorder.steps, ::testing::ElementsAre(0, 4, 8, 12, 16, 20, 21));
  const std::vector<std::vector<int64_t>> all = GatherSteps(recorder.steps);
  ASSERT_EQ(all.size(), static_cast<size_t>(coordinator_->size()));
  for (size_t r = 0; r < all.size(); ++r) EXPECT_EQ(all[r], all[0]) << "rank " << r;

  // The test means something: the last rank's own clock would have chosen other steps.
  Result<SecondOrStepTimer> local =
      SecondOrStepTimer::Create(std::nullopt, 4.0, [&t, last] { return 5000 + 2.7 * t; });
  ASSERT_TRUE(local.ok());
  std::vector<int64_t> local_steps;
  t = 0;
  (void)local->update_last_triggered_step(0);
  local_steps.push_back(0);
  for (int64_t step = 1; step <= kSteps; ++step) {
    t += 1;
    if (local->should_trigger_for_step(step)) {
      (void)local->update_last_triggered_step(step);
      local_steps.push_back(step);
    }
  }
  EXPECT_NE(local_steps, all[0]);
  (void)last;
}

TEST_P(SaverMpiTest, ReplicasAreLeftOutOfEveryRankButTheLowestHoldingThem) {
  const int size = coordinator_->size();
  std::vector<float> bias(4, 2.0f);  // 16 bytes, a replica on every rank
  std::vector<float> w(10, 1.0f);    // 40 bytes, rank r's own rows of the global [10R]
  std::vector<float> half(6, 3.0f);  // 24 bytes, each half of "pair" on every other rank
  TensorRegistry registry;
  ASSERT_TRUE(registry.add(Ref("bias", DType::kF32, {4}, bias.data(), 16)).ok());
  ASSERT_TRUE(
      registry.add(Ref("w", DType::kF32, {10}, w.data(), 40, {10 * size}, {10 * rank_})).ok());
  ASSERT_TRUE(
      registry.add(Ref("pair", DType::kF32, {6}, half.data(), 24, {12}, {rank_ % 2 == 0 ? 0 : 6}))
          .ok());
  SaverOptions options = Options();
  options.save_steps = 1000;
  Recorder recorder;
  Result<std::unique_ptr<SessionRunHook>> hook = MakeHook(options, &registry, &recorder);
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  ASSERT_TRUE((*hook)->begin().ok());
  ASSERT_TRUE((*hook)->after_create_session(0).ok());
  ASSERT_TRUE((*hook)->end(0).ok());
  SaverTotals totals = GetParam() ? static_cast<AsyncCheckpointSaverHook&>(**hook).totals()
                                  : static_cast<CheckpointSaverHook&>(**hook).totals();
  ASSERT_EQ(totals.saves.size(), 1u);
  EXPECT_TRUE(totals.saves[0].status.ok()) << totals.saves[0].status.ToString();
  // Rank 0 writes bias, w and the first half of pair; rank 1 w and the second half; the
  // others only w.
  const uint64_t expected = rank_ == 0 ? 16 + 40 + 24 : rank_ == 1 ? 40 + 24 : 40;
  EXPECT_EQ(totals.saves[0].bytes_raw, expected);

  // The job's one committed index: one slice per distinct box, written by the lowest rank
  // holding it.
  const std::string index_path = job_dir_ + "/ckpt/model.ckpt-0/index";
  std::ifstream in(index_path, std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  const Result<format::Index> index = format::ParseIndex(bytes, index_path);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_TRUE(index->sharded);
  EXPECT_EQ(index->world_size, static_cast<uint32_t>(size));
  std::map<std::pair<std::string, int64_t>, uint32_t> writers;
  for (const format::TensorEntry& entry : index->tensors) {
    const int64_t first = entry.box_offset.empty() ? 0 : entry.box_offset[0];
    EXPECT_TRUE(writers.emplace(std::pair(entry.name, first), entry.writer_rank).second)
        << entry.name << " at " << first << " is in the index twice";
  }
  std::map<std::pair<std::string, int64_t>, uint32_t> expected_writers = {
      {{"bias", 0}, 0}, {{"pair", 0}, 0}, {{"pair", 6}, 1}};
  for (int r = 0; r < size; ++r) expected_writers[{"w", 10 * r}] = static_cast<uint32_t>(r);
  EXPECT_EQ(writers, expected_writers);
}

TEST_P(SaverMpiTest, InconsistentRegistriesFailBeginOnEveryRankNamingTensorAndRanks) {
  const int last = coordinator_->size() - 1;
  std::vector<float> w(rank_ == last ? 5 : 4);
  TensorRegistry registry;
  ASSERT_TRUE(
      registry.add(Ref("w", DType::kF32, {static_cast<int64_t>(w.size())}, w.data(), w.size() * 4))
          .ok());
  SaverOptions options = Options();
  options.save_steps = 10;
  Recorder recorder;
  Result<std::unique_ptr<SessionRunHook>> hook = MakeHook(options, &registry, &recorder);
  ASSERT_TRUE(hook.ok());
  const Status begun = (*hook)->begin();
  EXPECT_EQ(begun.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(begun.message(), HasSubstr("tensor 'w' has shape [4] on rank 0 but [5] on rank " +
                                         std::to_string(last)));
}

TEST_P(SaverMpiTest, RankZerosFailedStartFailsBeginOnEveryRank) {
  std::vector<float> w(4);
  TensorRegistry registry;
  ASSERT_TRUE(registry.add(Ref("w", DType::kF32, {4}, w.data(), 16)).ok());
  SaverOptions options = Options();
  options.save_steps = 10;
  if (rank_ == 0) {
    // A regular file where rank 0's checkpoint_dir should be.
    options.checkpoint_dir = job_dir_ + "/not-a-directory";
    std::ofstream(options.checkpoint_dir) << "x";
  }
  Recorder recorder;
  Result<std::unique_ptr<SessionRunHook>> hook = MakeHook(options, &registry, &recorder);
  ASSERT_TRUE(hook.ok());
  const Status begun = (*hook)->begin();
  EXPECT_FALSE(begun.ok());
  EXPECT_THAT(begun.message(), HasSubstr("rank 0 could not start"));
  EXPECT_THAT(begun.message(), HasSubstr("not-a-directory"));
}

TEST_P(SaverMpiTest, RankZeroAloneRemovesStaleTemporariesBeforeAnyRankWrites) {
  SaverOptions options = Options();
  options.save_steps = 10;
  // A save of step 5 that an earlier job left half-written: its shared temporary directory
  // with one rank's data file.
  const std::string stale = options.checkpoint_dir + "/model.ckpt-5.tmp-0123456789abcdef";
  if (rank_ == 0) {
    fs::create_directories(stale);
    std::ofstream(stale + "/data-00000-of-00002") << "partial";
  }
  std::vector<float> w(4);
  TensorRegistry registry;
  ASSERT_TRUE(registry.add(Ref("w", DType::kF32, {4}, w.data(), 16)).ok());
  Recorder recorder;
  Result<std::unique_ptr<SessionRunHook>> hook = MakeHook(options, &registry, &recorder);
  ASSERT_TRUE(hook.ok());
  ASSERT_TRUE((*hook)->begin().ok());
  EXPECT_FALSE(fs::exists(stale));
  const SaverTotals totals = GetParam() ? static_cast<AsyncCheckpointSaverHook&>(**hook).totals()
                                        : static_cast<CheckpointSaverHook&>(**hook).totals();
  // Reported once, by the rank that removed it.
  EXPECT_EQ(totals.stale_temporaries_removed.size(), rank_ == 0 ? 1u : 0u);
  ASSERT_TRUE((*hook)->after_create_session(0).ok());
  ASSERT_TRUE((*hook)->end(0).ok());
}

TEST_P(SaverMpiTest, OneRankFailingItsWritesCommitsNothingAndEveryRankNamesIt) {
  // Step 0 commits on every rank; then the last rank's data-file writes fail with ENOSPC, so the
  // save of step 5 must commit nowhere, fail on every rank naming the last rank, and leave step
  // 0 the latest.
  const int last = coordinator_->size() - 1;
  std::vector<float> w(8, static_cast<float>(rank_));
  TensorRegistry registry;
  ASSERT_TRUE(
      registry
          .add(Ref("w", DType::kF32, {8}, w.data(), 32, {8 * coordinator_->size()}, {8 * rank_}))
          .ok());
  std::unique_ptr<io::FileSystem> posix = io::NewPosixFileSystem();
  io::FaultInjectionFileSystem faulty(posix.get());
  SaverOptions options = Options();
  options.save_steps = 1000;
  options.coordination_timeout_secs = 60;
  options.file_system = rank_ == last ? static_cast<io::FileSystem*>(&faulty) : posix.get();
  {
    Recorder recorder;
    Result<std::unique_ptr<SessionRunHook>> hook = MakeHook(options, &registry, &recorder);
    ASSERT_TRUE(hook.ok()) << hook.status().ToString();
    ASSERT_TRUE((*hook)->begin().ok());
    ASSERT_TRUE((*hook)->after_create_session(0).ok());
    ASSERT_TRUE((*hook)->end(0).ok());
  }
  if (rank_ == last) faulty.fail_ops_matching("data-", ENOSPC, io::FaultOp::kWrite);
  Recorder recorder;
  Result<std::unique_ptr<SessionRunHook>> hook = MakeHook(options, &registry, &recorder);
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  ASSERT_TRUE((*hook)->begin().ok());
  const auto start = std::chrono::steady_clock::now();
  (void)(*hook)->after_create_session(5);  // the failure may surface here or at end()
  (void)(*hook)->end(5);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  SaverTotals totals = GetParam() ? static_cast<AsyncCheckpointSaverHook&>(**hook).totals()
                                  : static_cast<CheckpointSaverHook&>(**hook).totals();
  if (rank_ == last) {
    EXPECT_GT(faulty.injected_count(), 0u);
  }
  ASSERT_FALSE(totals.saves.empty());
  for (const SaveStats& stats : totals.saves) {
    EXPECT_FALSE(stats.status.ok()) << "step " << stats.step << " committed";
    EXPECT_EQ(stats.failed_rank, last) << stats.status.ToString();
    EXPECT_THAT(stats.status.message(), HasSubstr("No space left on device"));
  }
  EXPECT_LT(took, 60.0) << "a failed rank reports at once; nobody waits for the timeout";
  Result<std::string> latest = LatestCheckpoint(options.checkpoint_dir);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(*latest, options.checkpoint_dir + "/model.ckpt-0");
  EXPECT_FALSE(fs::exists(options.checkpoint_dir + "/model.ckpt-5"));
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, SaverMpiTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Async" : "Sync";
                         });

}  // namespace
}  // namespace asyncckpt
