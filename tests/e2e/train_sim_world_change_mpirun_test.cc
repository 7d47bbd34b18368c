// End-to-end tests of a train-sim --shard job that changes its world size, killed at each step
// of the change (--kill_at: the rank's own file system SIGKILLs it before one named operation,
// so the point is exact, not timed), and of the start-up comparison of every option that shapes
// the state, with ranks 2 and 3 given another value (MPMD). Label "mpi": mpirun is started here.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/e2e/train_sim_mpirun_support.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using testing_support::Digest;
using testing_support::JobResult;
using testing_support::TrainSimMpiTest;
using testing_support::TwoAndTwo;
using testing_support::With;

// One world-size change: the job of `from` ranks saved step 10; the job of `to` ranks, resumed
// there, dies at `kill_at` (rank:operation:name prefix); 0 ranks is a plain train-sim (no
// mpirun, no --shard). `resumes_at` is the step both sizes must then resume.
struct Change {
  const char* name;
  int from, to;
  const char* kill_at;
  int64_t resumes_at;
};

class TrainSimWorldChangeTest : public TrainSimMpiTest,
                                public ::testing::WithParamInterface<Change> {
 protected:
  // --max_to_keep 1: no older set to fall back on, the case the issue found losing every one.
  std::vector<std::string> ChangeFlags(const std::string& dir, int64_t steps) const {
    return With(Flags(dir, steps), "--max_to_keep=1");
  }

  JobResult RunOn(int ranks, std::vector<std::string> args, const std::string& name) {
    if (ranks == 0) return Run({}, std::move(args), name);
    return RunSharded(ranks, std::move(args), name);
  }
};

TEST_P(TrainSimWorldChangeTest, AKillAtEveryStepOfTheChangeLeavesAResumePointForBothSizes) {
  const Change change = GetParam();
  JobResult reference = Run({}, ChangeFlags(Path("reference"), 20), "reference");
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  JobResult saved = RunOn(change.from, ChangeFlags(dir_, 10), "saved");
  ASSERT_EQ(saved.exit_code, 0) << saved.err;

  JobResult killed = RunOn(
      change.to, With(ChangeFlags(dir_, 20), std::string("--kill_at=") + change.kill_at), "killed");
  ASSERT_NE(killed.exit_code, 0) << killed.err;
  ASSERT_NE(killed.err.find("killed before"), std::string::npos)
      << "the kill point was never reached\n"
      << killed.err;

  // The directory as the kill left it, resumed once on each world size.
  for (int ranks : {change.from, change.to}) {
    const std::string copy = Path("after-kill-" + std::to_string(ranks));
    fs::copy(dir_, copy, fs::copy_options::recursive);
    JobResult resumed = RunOn(ranks, ChangeFlags(copy, 20), "resumed" + std::to_string(ranks));
    ASSERT_EQ(resumed.exit_code, 0) << ranks << " ranks\n" << resumed.err;
    // Killed once the new set was whole, the job may have gone on past it before retention
    // reached the old one (retention keeps the newest pairs both sides list).
    const int64_t start = resumed.metrics.value("start_step", int64_t{-1});
    if (change.resumes_at > 10) {
      EXPECT_GE(start, change.resumes_at) << ranks << " ranks\n" << resumed.err;
    } else {
      EXPECT_EQ(start, change.resumes_at) << ranks << " ranks\n" << resumed.err;
    }
    EXPECT_EQ(Digest(resumed), Digest(reference)) << ranks << " ranks\n" << resumed.err;
  }
}

INSTANTIATE_TEST_SUITE_P(
    KillPoints, TrainSimWorldChangeTest,
    ::testing::Values(
        // Growing: a new rank dies as it commits its first input checkpoint.
        Change{"TwoToFourNewRankInputCommit", 2, 4, "3:rename:input_worker_3.ckpt-15", 10},
        Change{"OneToFourNewRankInputCommit", 1, 4, "2:rename:input_worker_2.ckpt-15", 10},
        // Shrinking: a kept rank dies as it commits its input, rank 0 as it commits the model.
        Change{"FourToTwoKeptRankInputCommit", 4, 2, "1:rename:input_worker_1.ckpt-15", 10},
        Change{"FourToTwoModelCommit", 4, 2, "0:rename:model.ckpt-15", 10},
        // The new set is whole: rank 0 dies as retention takes the old model checkpoint away.
        Change{"FourToOneOldModelRetired", 4, 1, "0:rename:model.ckpt-10.deleting", 15},
        // A plain process over a 4-rank job: as it commits the model, then its input.
        Change{"FourToPlainModelCommit", 4, 0, "0:rename:model.ckpt-15", 10},
        Change{"FourToPlainInputCommit", 4, 0, "0:rename:input.ckpt-15", 10}),
    [](const ::testing::TestParamInfo<Change>& info) { return std::string(info.param.name); });

// One compared option given another value on ranks 2 and 3 of 4.
struct Differing {
  const char* option;  // the flag as a message names it
  const char* flag;    // ranks 2 and 3's
};

class TrainSimDifferingOptionTest : public TrainSimMpiTest,
                                    public ::testing::WithParamInterface<Differing> {};

TEST_P(TrainSimDifferingOptionTest, FailsEveryRankAtOnceNamingTheOption) {
  std::vector<std::string> first = Flags(dir_, 10);
  first.push_back("--shard");
  std::string flag = GetParam().flag;
  if (flag == "--dataset=") flag += Path("elsewhere.bin");
  const auto start = std::chrono::steady_clock::now();
  JobResult run = Run(TwoAndTwo(first), With(first, flag), std::string("differ"));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s on ranks 2 and 3: exit %d after %.2f s\n", flag.c_str(),
              run.exit_code.value_or(-1), took);
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_LT(took, 3.0) << run.err;
  EXPECT_NE(run.err.find(GetParam().option), std::string::npos) << run.err;
  EXPECT_FALSE(fs::exists(dir_ + "/checkpoint")) << "nothing may be saved";
}

INSTANTIATE_TEST_SUITE_P(
    Options, TrainSimDifferingOptionTest,
    ::testing::Values(Differing{"--shuffle_buffer differs across ranks", "--shuffle_buffer=32"},
                      Differing{"--epochs differs across ranks", "--epochs=3"},
                      Differing{"--num_data_files differs across ranks", "--num_data_files=3"},
                      Differing{"--batch_size differs across ranks", "--batch_size=4"},
                      Differing{"--prefetch differs across ranks", "--prefetch=2"},
                      Differing{"--dataset_records differs across ranks", "--dataset_records=300"},
                      Differing{"--on_error differs across ranks", "--on_error=continue"},
                      Differing{"--dataset: rank 2: ", "--dataset="}),
    [](const ::testing::TestParamInfo<Differing>& info) {
      std::string name;
      for (const char* c = info.param.flag + 2; *c != '\0' && *c != '='; ++c) {
        if (*c != '_') name += *c;
      }
      return name;
    });

}  // namespace
}  // namespace asyncckpt
