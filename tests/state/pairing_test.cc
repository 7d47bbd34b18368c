// Tests of src/state/pairing.cc: retention and start-up of paired managers (the model and the input
// pipeline).

#include "src/state/pairing.h"

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

// ---- pairing ------------------------------------------------------------------------------------

constexpr char kInputBasename[] = "input.ckpt";

std::string InputName(int step) { return std::string(kInputBasename) + "-" + std::to_string(step); }

class PairedRetentionTest : public StateDirTest {
 protected:
  void MakeManagers(int max_to_keep) {
    model_ = std::make_unique<CheckpointManager>(
        faulty_.get(),
        CheckpointManagerOptions{.checkpoint_dir = dir_,
                                 .basename = kBasename,
                                 .max_to_keep = max_to_keep,
                                 .partner = {kInputBasename, "checkpoint_input"}},
        [] { return 0.0; });
    input_ = std::make_unique<CheckpointManager>(
        faulty_.get(),
        CheckpointManagerOptions{.checkpoint_dir = dir_,
                                 .basename = kInputBasename,
                                 .state_file_name = "checkpoint_input",
                                 .max_to_keep = max_to_keep,
                                 .partner = {kBasename, "checkpoint"}},
        [] { return 0.0; });
  }
  void CommitModel(int step) { Commit(*model_, step, step); }
  void CommitInput(int step) {
    MakeCheckpointDir(InputName(step));
    const Status status = input_->RecordCommitted(InputName(step), step);
    ASSERT_TRUE(status.ok()) << status.ToString();
  }
  std::set<int> OnDisk(const std::string& basename) const {
    std::set<int> steps;
    for (const std::string& name : Entries()) {
      if (auto step = CheckpointStep(name, basename)) steps.insert(static_cast<int>(*step));
    }
    return steps;
  }
  std::set<int> Pairs() const {
    std::set<int> pairs;
    const std::set<int> input = OnDisk(kInputBasename);
    for (int step : OnDisk(kBasename)) {
      if (input.contains(step)) pairs.insert(step);
    }
    return pairs;
  }

  std::unique_ptr<CheckpointManager> model_;
  std::unique_ptr<CheckpointManager> input_;
};

// Finding 6b: with on_error=continue on a full disk the input checkpoints kept committing, and
// retention deleted the input partners of the only good model checkpoints.
TEST_F(PairedRetentionTest, KeepsInputPartnersWhileTheModelFails) {
  MakeManagers(2);
  for (int step = 1; step <= 3; ++step) {
    CommitModel(step);
    CommitInput(step);
  }
  // The model committed 3 before the input did, so it still holds 1 (its pass saw no input 3).
  ASSERT_EQ(OnDisk(kBasename), (std::set<int>{1, 2, 3}));
  for (int step = 4; step <= 12; ++step) CommitInput(step);  // the model's saves fail
  EXPECT_EQ(OnDisk(kInputBasename), (std::set<int>{2, 3, 11, 12}));
  EXPECT_EQ(input_->retained().size(), 4u);
  EXPECT_EQ(Pairs(), (std::set<int>{2, 3}));
  // Once the model saves again, the old pairs go.
  for (int step = 13; step <= 15; ++step) {
    CommitModel(step);
    CommitInput(step);
  }
  EXPECT_EQ(OnDisk(kBasename), (std::set<int>{13, 14, 15}));
  EXPECT_EQ(OnDisk(kInputBasename), (std::set<int>{14, 15}));
}

TEST_F(PairedRetentionTest, KeepsModelPartnersWhileTheInputFails) {
  MakeManagers(2);
  for (int step = 1; step <= 3; ++step) {
    CommitInput(step);
    CommitModel(step);
  }
  for (int step = 4; step <= 12; ++step) CommitModel(step);
  EXPECT_EQ(OnDisk(kBasename), (std::set<int>{2, 3, 11, 12}));
  EXPECT_EQ(OnDisk(kInputBasename), (std::set<int>{1, 2, 3}));
  EXPECT_EQ(Pairs(), (std::set<int>{2, 3}));
}

TEST_F(PairedRetentionTest, StaysAtMaxToKeepWhenBothSidesSaveTheSameSteps) {
  MakeManagers(3);
  for (int step = 1; step <= 20; ++step) {
    CommitModel(step);
    EXPECT_LE(model_->retained().size(), 4u) << step;
    CommitInput(step);
    EXPECT_LE(input_->retained().size(), 3u) << step;
  }
  EXPECT_EQ(OnDisk(kInputBasename), (std::set<int>{18, 19, 20}));
  EXPECT_EQ(OnDisk(kBasename), (std::set<int>{17, 18, 19, 20}));
}

TEST_F(PairedRetentionTest, NeverLosesTheNewestPairAndStaysBoundedUnderAnyFailurePattern) {
  constexpr int kKeep = 2;
  MakeManagers(kKeep);
  uint64_t seed = 12345;
  const auto next = [&seed] {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>(seed >> 33);
  };
  int newest_pair = -1;
  for (int step = 0; step < 300; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const uint32_t r = next();
    const bool model_ok = (r % 10) < 7;  // each side fails 30% of the time
    const bool input_ok = ((r >> 8) % 10) < 7;
    const bool model_first = (r >> 16) & 1;
    if (model_first && model_ok) CommitModel(step);
    if (input_ok) CommitInput(step);
    if (!model_first && model_ok) CommitModel(step);
    EXPECT_LE(model_->retained().size(), static_cast<size_t>(2 * kKeep));
    EXPECT_LE(input_->retained().size(), static_cast<size_t>(2 * kKeep));
    const std::set<int> pairs = Pairs();
    if (newest_pair >= 0) {
      ASSERT_FALSE(pairs.empty());
      EXPECT_GE(*pairs.rbegin(), newest_pair);
    }
    if (!pairs.empty()) newest_pair = *pairs.rbegin();
  }
  EXPECT_GT(newest_pair, 250);
}

// The input commits the step the model committed one save before, at the same moment as the
// model commits the next: each pass reads the other's state file just as the other rewrites
// it. Unserialized, the model could drop the step the input is pairing while the input drops
// the old pair the model keeps, leaving no complete pair at all.
TEST_F(PairedRetentionTest, ConcurrentPassesNeverLoseTheNewestPair) {
  MakeManagers(1);
  CommitModel(0);
  CommitInput(0);
  CommitModel(1);
  int newest_pair = 0;
  for (int round = 1; round <= 100; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    MakeCheckpointDir(Name(round + 1));
    MakeCheckpointDir(InputName(round));
    std::atomic<int> ready{0};
    auto commit = [&](CheckpointManager& manager, const std::string& name, int step) {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      EXPECT_TRUE(manager.RecordCommitted(name, step).ok());
    };
    std::thread model(commit, std::ref(*model_), Name(round + 1), round + 1);
    std::thread input(commit, std::ref(*input_), InputName(round), round);
    model.join();
    input.join();
    const std::set<int> pairs = Pairs();
    ASSERT_FALSE(pairs.empty());
    EXPECT_GE(*pairs.rbegin(), newest_pair);
    newest_pair = *pairs.rbegin();
  }
}

TEST_F(PairedRetentionTest, StartRelistsAnUnlistedPartnerInsteadOfRemovingIt) {
  MakeManagers(2);
  for (int step = 1; step <= 3; ++step) {
    CommitModel(step);
    CommitInput(step);
  }
  for (int step = 4; step <= 6; ++step) CommitInput(step);
  fs::remove(Path("checkpoint_input"));  // lost: the input side rebuilds from the directory
  ASSERT_EQ(OnDisk(kInputBasename), (std::set<int>{2, 3, 5, 6}));
  MakeManagers(2);
  Result<StartupReport> report = input_->Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_THAT(input_->retained(),
              ElementsAre(InputName(2), InputName(3), InputName(5), InputName(6)));
  EXPECT_TRUE(report->removed.empty());
}

}  // namespace
}  // namespace asyncckpt
