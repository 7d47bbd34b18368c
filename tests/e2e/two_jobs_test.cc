// Two train-sim jobs on one --checkpoint_dir: the second is refused with the first's PID, and
// the first, untouched, finishes with checkpoints that verify and that are all its own (model
// and input checkpoint of each step from the same job).

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/state.h"
#include "tests/e2e/cli_support.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing_support::CliFixture;
using testing_support::CliProcess;
using testing_support::CliRun;
using testing_support::ReadFile;

// Longest one run may take before the test calls it hung (not a timing assertion).
constexpr auto kRunTimeout = std::chrono::seconds(120);

// True when every thread of process `pid` is stopped (state 'T'), so that none of them can
// still change a file.
bool AllThreadsStopped(pid_t pid) {
  std::error_code ec;
  bool any = false;
  for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    const std::string stat = ReadFile(task.path().string() + "/stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size()) continue;  // thread gone
    if (stat[paren + 2] != 'T') return false;
    any = true;
  }
  return any;
}

// Every entry below `dir` with its size.
std::map<std::string, uintmax_t> Snapshot(const std::string& dir) {
  std::map<std::string, uintmax_t> entries;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    entries[fs::relative(entry.path(), dir).string()] =
        entry.is_regular_file() ? entry.file_size() : 0;
  }
  return entries;
}

class TwoJobsTest : public CliFixture {
 protected:
  TwoJobsTest() : CliFixture("two_jobs_test.") {}

  void SetUp() override {
    CliFixture::SetUp();
    if (HasFatalFailure()) return;
    // One dataset for every run, so that only the seed tells the jobs apart.
    dataset_ = Path("dataset.bin");
    ASSERT_TRUE(WriteRecordDataset(dataset_, 512, 32, /*seed=*/7).ok());
  }

  std::vector<std::string> Args(const std::string& dir, int steps, int seed,
                                const std::string& metrics,
                                const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args = {
        "train-sim",      "--quiet", "--checkpoint_dir", dir,
        "--dataset",      dataset_,  "--model_bytes",    "256KiB",
        "--tensors",      "2",       "--steps",          std::to_string(steps),
        "--save_steps",   "4",       "--max_to_keep",    "0",
        "--batch_size",   "4",       "--seed",           std::to_string(seed),
        "--metrics_json", metrics};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  CliRun Run(const std::vector<std::string>& args) {
    const std::string tag = Path("run" + std::to_string(++runs_));
    CliRun run = testing_support::RunCli(args, tag + ".out", tag + ".err", kRunTimeout);
    EXPECT_TRUE(run.started) << std::strerror(run.spawn_error);
    EXPECT_TRUE(run.exit_code.has_value()) << "hung; killed: " << run.err;
    return run;
  }

  static Json Metrics(const std::string& path) {
    return Json::parse(ReadFile(path), nullptr, /*allow_exceptions=*/false);
  }

  std::string dataset_;
  int runs_ = 0;
};

TEST_F(TwoJobsTest, SecondJobIsRefusedNamingTheFirstsPidAndTheFirstFinishesUntouched) {
  const std::string dir = Path("shared");
  constexpr int kSteps = 40;
  // POSIX I/O: every write comes from a thread of its own, which SIGSTOP freezes (io_uring's
  // kernel workers would go on writing).
  CliProcess first(Args(dir, kSteps, /*seed=*/1, Path("first.json"),
                        {"--step_ms", "20", "--verify", "--io", "posix"}),
                   Path("first.out"), Path("first.err"));
  ASSERT_TRUE(first.started()) << std::strerror(first.spawn_error());
  const pid_t first_pid = first.pid();
  const std::string holder = "pid=" + std::to_string(first_pid) + " ";

  // Caught once it has committed its first checkpoint: by then every hook's begin() ran, and
  // both its locks are held.
  const auto deadline = std::chrono::steady_clock::now() + kRunTimeout;
  while (!fs::exists(dir + "/checkpoint")) {
    ASSERT_TRUE(first.Running()) << "the first job ended before its first checkpoint: "
                                 << first.err();
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no checkpoint yet";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(::kill(first_pid, SIGSTOP), 0) << std::strerror(errno);
  while (!AllThreadsStopped(first_pid)) {
    ASSERT_TRUE(first.Running()) << "the first job ended before it stopped: " << first.err();
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "did not stop";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // A holder empties its lock file before releasing it, so a stopped process whose files
  // still name it holds both locks for as long as it stays stopped.
  auto holds = [&](const char* lock) { return ReadFile(dir + "/" + lock).rfind(holder, 0) == 0; };
  EXPECT_TRUE(holds("checkpoint.lock")) << ReadFile(dir + "/checkpoint.lock");
  EXPECT_TRUE(holds("checkpoint_input.lock")) << ReadFile(dir + "/checkpoint_input.lock");
  const auto before = Snapshot(dir);

  const CliRun second = Run(Args(dir, kSteps, /*seed=*/2, Path("second.json")));
  const auto after = Snapshot(dir);
  ::kill(first_pid, SIGCONT);
  ASSERT_TRUE(second.exit_code.has_value());
  EXPECT_NE(*second.exit_code, 0) << second.err;
  // The input's saver begins first (its commit precedes the model's): its lock refuses.
  EXPECT_NE(second.err.find("checkpoint_dir " + dir + " is in use by another job: " + dir +
                            "/checkpoint_input.lock is held by pid " + std::to_string(first_pid) +
                            " on host "),
            std::string::npos)
      << second.err;
  EXPECT_EQ(after, before) << "the refused job changed the directory";

  ASSERT_EQ(first.Wait(), 0) << first.err();
  const Json first_metrics = Metrics(Path("first.json"));
  EXPECT_EQ(first_metrics["final_step"], kSteps);
  EXPECT_EQ(first_metrics["saves_failed"], 0);
  // --verify: every checkpoint the state file lists verifies.
  EXPECT_GE(first_metrics["verified_checkpoints"].get<int>(), kSteps / 4);
  const CliRun latest = Run({"latest", dir});
  EXPECT_EQ(latest.exit_code, 0) << latest.err;
  EXPECT_EQ(latest.out, dir + "/model.ckpt-" + std::to_string(kSteps) + "\n");
  EXPECT_EQ(ReadFile(dir + "/checkpoint.lock"), "") << "the first job's end() released it";

  // Model and input checkpoints are the first job's: resuming them with its seed ends where an
  // uninterrupted run of that job ends.
  const CliRun resumed = Run(Args(dir, kSteps + 8, /*seed=*/1, Path("resumed.json")));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const CliRun straight =
      Run(Args(Path("straight"), kSteps + 8, /*seed=*/1, Path("straight.json")));
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  const Json resumed_metrics = Metrics(Path("resumed.json"));
  const Json straight_metrics = Metrics(Path("straight.json"));
  EXPECT_EQ(resumed_metrics["start_step"], kSteps);
  EXPECT_EQ(resumed_metrics["final_state_digest"], straight_metrics["final_state_digest"]);
  EXPECT_EQ(resumed_metrics["input_state_digest"], straight_metrics["input_state_digest"]);
}

}  // namespace
}  // namespace asyncckpt
