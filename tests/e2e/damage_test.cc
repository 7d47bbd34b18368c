// End-to-end tests of damage, as the asyncckpt binary meets it (issue 31): a bad data byte in the
// latest checkpoint falls back to the newest good one; `latest` names what a resume would use
// and says what it passed over; `gc` lists and removes the quarantined checkpoints and nothing
// else; a job refused by one of its locks changes nothing in the directory.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "tests/e2e/cli_support.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using testing_support::CliFixture;
using testing_support::CliRun;

constexpr auto kRunTimeout = std::chrono::seconds(90);

class DamageTest : public CliFixture {
 protected:
  DamageTest() : CliFixture("damage_test-") {}

  CliRun Run(const std::vector<std::string>& args) {
    const std::string tag = Path("run." + std::to_string(++runs_));
    CliRun run = testing_support::RunCli(args, tag + ".out", tag + ".err", kRunTimeout);
    EXPECT_TRUE(run.started);
    EXPECT_TRUE(run.exit_code.has_value()) << "hung: " << run.err;
    return run;
  }

  // train-sim to `steps` in `dir`, saving every 4 steps and keeping every checkpoint.
  CliRun Train(const std::string& dir, int steps) {
    return Run({"train-sim",          "--quiet",    "--steps",          std::to_string(steps),
                "--save_steps",       "4",          "--max_to_keep",    "0",
                "--model_bytes",      "256KiB",     "--tensors",        "2",
                "--chunk_bytes",      "16KiB",      "--compression",    "none",
                "--memcpy_yardstick", "false",      "--checkpoint_dir", dir,
                "--metrics_json",     dir + ".json"});
  }

  // Every entry below `dir`, relative: what a refused job must leave as it was.
  static std::set<std::string> Tree(const std::string& dir) {
    std::set<std::string> names;
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
      names.insert(fs::relative(entry.path(), dir).string());
    }
    return names;
  }

  static std::vector<std::string> QuarantinedIn(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.find(".corrupt-") != std::string::npos) names.push_back(name);
    }
    return names;
  }

  int runs_ = 0;
};

// Flips bytes in the first data file of `checkpoint`: the sizes start-up checks stay right.
void FlipDataBytes(const std::string& checkpoint) {
  const std::string data = checkpoint + "/data-00000-of-00002";
  std::vector<uint8_t> bytes = testing_support::ReadFileBytes(data);
  ASSERT_GT(bytes.size(), 4096u);
  for (size_t i = 0; i < bytes.size(); i += 509) bytes[i] ^= 0xa5;
  testing_support::WriteFile(data, bytes);
}

// D3: a flipped byte in the latest checkpoint made every restart exit 1 with a checksum error.
TEST_F(DamageTest, TrainSimResumesFromTheNewestGoodCheckpointPastABadByte) {
  const std::string dir = Path("job");
  CliRun first = Train(dir, 8);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  FlipDataBytes(dir + "/model.ckpt-8");
  for (int restart = 0; restart < 2; ++restart) {
    SCOPED_TRACE(restart);
    CliRun resumed = Train(dir, 12);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    const std::string metrics = testing_support::ReadFile(dir + ".json");
    if (restart == 0) {
      EXPECT_NE(metrics.find("\"start_step\":4"), std::string::npos) << metrics;
      EXPECT_NE(resumed.err.find(dir + "/model.ckpt-8/data-00000-of-00002: tensor"),
                std::string::npos)
          << resumed.err;
      EXPECT_NE(resumed.err.find("quarantined it as " + dir + "/model.ckpt-8.corrupt-"),
                std::string::npos)
          << resumed.err;
    } else {
      EXPECT_NE(metrics.find("\"start_step\":12"), std::string::npos) << metrics;
    }
    ASSERT_EQ(QuarantinedIn(dir).size(), 1u);
  }
}

// D6: `latest` named a damaged latest that a resume skips, and an empty path unquoted.
TEST_F(DamageTest, LatestNamesTheCheckpointAResumeWouldUseAndWhatItPassedOver) {
  const std::string dir = Path("job");
  ASSERT_EQ(Train(dir, 8).exit_code, 0);
  fs::resize_file(dir + "/model.ckpt-8/data-00000-of-00002", 100);
  CliRun latest = Run({"latest", dir});
  ASSERT_EQ(latest.exit_code, 0) << latest.err;
  EXPECT_EQ(latest.out, dir + "/model.ckpt-4\n");
  EXPECT_NE(latest.err.find("asyncckpt: skipped " + dir + "/model.ckpt-8: "), std::string::npos)
      << latest.err;
  CliRun input = Run({"latest", dir, "--state_file", "checkpoint_input"});
  ASSERT_EQ(input.exit_code, 0) << input.err;
  EXPECT_EQ(input.out, dir + "/input.ckpt-8\n");

  CliRun empty = Run({"latest", ""});
  EXPECT_EQ(empty.exit_code, 1);
  EXPECT_NE(empty.err.find("checkpoint directory '' does not exist"), std::string::npos)
      << empty.err;
}

// D8: quarantined checkpoints piled up. `gc` lists them with their size, removes them when asked,
// and removes nothing else.
TEST_F(DamageTest, GcListsAndRemovesTheQuarantinedCheckpointsAndNothingElse) {
  const std::string dir = Path("job");
  ASSERT_EQ(Train(dir, 8).exit_code, 0);
  fs::resize_file(dir + "/model.ckpt-8/data-00000-of-00002", 100);
  ASSERT_EQ(Train(dir, 12).exit_code, 0);  // quarantines it, resumes at 4
  ASSERT_EQ(QuarantinedIn(dir).size(), 1u);
  const std::string quarantined = dir + "/" + QuarantinedIn(dir)[0];
  CliRun listed = Run({"gc", dir});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find(quarantined + "  "), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find("1 quarantined checkpoint, "), std::string::npos) << listed.out;
  EXPECT_TRUE(fs::exists(quarantined));

  std::set<std::string> others = Tree(dir);
  std::erase_if(
      others, [](const std::string& name) { return name.find(".corrupt-") != std::string::npos; });
  CliRun removed = Run({"gc", dir, "--remove-quarantined"});
  ASSERT_EQ(removed.exit_code, 0) << removed.err;
  EXPECT_NE(removed.out.find("removed " + quarantined), std::string::npos) << removed.out;
  EXPECT_FALSE(fs::exists(quarantined));
  EXPECT_EQ(Tree(dir), others);
  CliRun none = Run({"gc", dir});
  EXPECT_NE(none.out.find("0 quarantined checkpoints"), std::string::npos) << none.out;
}

// D7: a train-sim refused by the input pipeline's lock had already run the model side's
// start-up (a temporary removed, a damaged checkpoint quarantined).
TEST_F(DamageTest, ATrainSimRefusedByTheInputLockChangesNothing) {
  const std::string dir = Path("job");
  ASSERT_EQ(Train(dir, 8).exit_code, 0);
  fs::create_directory(dir + "/model.ckpt-9.tmp-0123456789abcdef");
  fs::resize_file(dir + "/model.ckpt-4/data-00000-of-00002", 100);
  auto posix = io::NewPosixFileSystem();
  std::unique_ptr<io::FileLock> other_job;
  ASSERT_TRUE(posix->lock_file(dir + "/checkpoint_input.lock", &other_job).ok());
  const std::set<std::string> before = Tree(dir);
  CliRun refused = Train(dir, 12);
  EXPECT_EQ(refused.exit_code, 1) << refused.err;
  EXPECT_NE(refused.err.find("checkpoint_input.lock is held by pid"), std::string::npos)
      << refused.err;
  EXPECT_EQ(Tree(dir), before);
}

TEST_F(DamageTest, AHexadecimalSaveSecsIsRefused) {
  CliRun r = Run({"train-sim", "--save_secs", "0x10", "--checkpoint_dir", Path("job")});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--save_secs"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(Path("job")));
}

}  // namespace
}  // namespace asyncckpt
