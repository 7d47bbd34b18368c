// End-to-end tests of `asyncckpt train-sim --shard` under mpirun, which this test starts itself
// (label "mpi"; registered only in builds with ASYNCCKPT_MPI): the global state a job ends with
// does not depend on its number of ranks and equals a one-process run's; a job with one rank
// SIGKILLed resumes to the digest of an uninterrupted run; a job saved on 4 ranks restores on 1,
// 2, 3 and 4 ranks bit for bit, each rank reading only the chunks of its slices.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/reader.h"
#include "asyncckpt/state.h"
#include "tests/e2e/cli_support.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing_support::CliFixture;
using testing_support::CliProcess;
using testing_support::CommittedSteps;
using testing_support::ReadFile;
using testing_support::Temporaries;

// Longest one mpirun job may take before the test calls it hung: 4 ranks share 2 cores here.
constexpr auto kJobTimeout = std::chrono::seconds(180);

// mpirun: $ASYNCCKPT_MPIRUN, else the first `mpirun` on PATH; "" when there is none.
std::string MpirunPath() {
  if (const char* path = std::getenv("ASYNCCKPT_MPIRUN"); path != nullptr && *path != '\0') {
    return path;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t begin = 0; begin <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', begin), dirs.size());
    const fs::path candidate = fs::path(dirs.substr(begin, end - begin)) / "mpirun";
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
    begin = end + 1;
  }
  return "";
}

// mpirun for `ranks` processes on this one machine: more ranks than cores (--oversubscribe),
// no pinning (each rank's threads may use every core), root allowed (containers). Under
// AddressSanitizer the ranks skip the leak check: Open MPI's own allocations outlive
// MPI_Finalize (the *_mpi_test runs do the same through their ctest environment).
std::vector<std::string> Mpirun(int ranks) {
  const char* asan = std::getenv("ASAN_OPTIONS");
  const std::string rank_asan =
      std::string(asan != nullptr && *asan != '\0' ? std::string(asan) + ":" : "") +
      "detect_leaks=0";
  return {MpirunPath(),
          "--oversubscribe",
          "--allow-run-as-root",
          "--bind-to",
          "none",
          "-x",
          "ASAN_OPTIONS=" + rank_asan,
          "-np",
          std::to_string(ranks)};
}

struct JobResult {
  std::optional<int> exit_code;  // nullopt: hung, killed after kJobTimeout
  std::string out, err;
  Json metrics;
};

class TrainSimMpiTest : public CliFixture {
 protected:
  TrainSimMpiTest() : CliFixture("train_sim_mpi_") {}

  void SetUp() override {
    CliFixture::SetUp();
    if (MpirunPath().empty()) GTEST_SKIP() << "no mpirun (apt-get install openmpi-bin)";
    dir_ = Path("ckpt");
  }

  // The flags every run shares: a small Adam model whose tensors (3 x 3 of 21847 f32 elements)
  // split unevenly over 2, 3 and 4 ranks, several chunks per slice.
  std::vector<std::string> Flags(const std::string& dir, int64_t steps,
                                 const std::string& chunk_bytes = "16KiB") const {
    return {"train-sim",
            "--checkpoint_dir=" + dir,
            "--steps=" + std::to_string(steps),
            "--model_bytes=786492",  // 9 tensors x 21847 f32
            "--tensors=3",
            "--chunk_bytes=" + chunk_bytes,
            "--save_steps=5",
            "--max_to_keep=3",
            "--dataset_records=200",
            "--record_bytes=32",
            "--batch_size=8",
            "--shuffle_buffer=16",
            "--prefetch=4",
            "--quiet",
            "--memcpy_yardstick=false"};
  }

  JobResult Run(const std::vector<std::string>& launcher, std::vector<std::string> args,
                const std::string& name) {
    const std::string metrics = Path(name + ".json");
    args.push_back("--metrics_json=" + metrics);
    CliProcess process(launcher, args, Path(name + ".out"), Path(name + ".err"));
    JobResult result;
    EXPECT_TRUE(process.started()) << "spawn error " << process.spawn_error();
    result.exit_code = process.WaitFor(kJobTimeout);
    result.out = process.out();
    result.err = process.err();
    if (fs::exists(metrics)) result.metrics = Json::parse(ReadFile(metrics), nullptr, false);
    return result;
  }

  // A --shard job of `ranks` ranks, run to its end.
  JobResult RunSharded(int ranks, std::vector<std::string> args, const std::string& name) {
    args.push_back("--shard");
    return Run(Mpirun(ranks), std::move(args), name);
  }

  // The one-process reference (no --shard), in a directory of its own.
  std::string ReferenceDigest(int64_t steps) {
    JobResult run = Run({}, Flags(Path("reference"), steps), "reference");
    EXPECT_EQ(run.exit_code, 0) << run.err;
    return run.metrics.is_object() ? run.metrics.value("final_state_digest", "") : "";
  }

  std::string dir_;
};

std::string Digest(const JobResult& run) {
  return run.metrics.is_object() ? run.metrics.value("final_state_digest", "") : "";
}

// "train-sim: rank R of N (pid P)" from a job's stderr.
std::optional<pid_t> RankPid(const std::string& err, int rank) {
  const std::regex line("rank " + std::to_string(rank) + " of [0-9]+ \\(pid ([0-9]+)\\)");
  std::smatch match;
  if (!std::regex_search(err, match, line)) return std::nullopt;
  return static_cast<pid_t>(std::stol(match[1]));
}

TEST_F(TrainSimMpiTest, GlobalDigestDoesNotDependOnWorldSizeAndEqualsOneProcess) {
  const std::string reference = ReferenceDigest(12);
  ASSERT_FALSE(reference.empty());
  for (int ranks : {2, 4}) {
    const std::string dir = dir_ + "-" + std::to_string(ranks);
    JobResult run = RunSharded(ranks, Flags(dir, 12), "np" + std::to_string(ranks));
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    EXPECT_EQ(Digest(run), reference) << ranks << " ranks\n" << run.err;
    ASSERT_TRUE(run.metrics.contains("ranks"));
    EXPECT_EQ(run.metrics["ranks"].size(), static_cast<size_t>(ranks));
    // Each rank keeps its own input position, TensorFlow's way.
    for (int r = 0; r < ranks; ++r) {
      EXPECT_TRUE(fs::exists(dir + "/checkpoint_input_worker_" + std::to_string(r))) << r;
    }
    // One sharded checkpoint per save, listed once, readable by the one-process reader.
    auto latest = LatestCheckpoint(dir);
    ASSERT_TRUE(latest.ok()) << latest.status().ToString();
    auto reader = CheckpointReader::Open(*latest);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    EXPECT_TRUE(reader.value()->verify().problems.empty());
    EXPECT_TRUE(Temporaries(dir).empty());
  }
}

// Whether a model save is in flight: its shared temporary directory exists.
bool SaveInFlight(const std::string& dir) {
  for (const std::string& name : Temporaries(dir)) {
    if (name.rfind("model.ckpt-", 0) == 0) return true;
  }
  return false;
}

// The ranks SIGKILLed: one of them (the others must not hang), rank 0 (the committer), or every
// rank at once (the whole job).
class TrainSimMpiKillTest : public TrainSimMpiTest,
                            public ::testing::WithParamInterface<std::vector<int>> {};

TEST_P(TrainSimMpiKillTest, KilledAndResumedJobEndsWithTheUninterruptedDigest) {
  constexpr int64_t kSteps = 60;
  const std::string reference = ReferenceDigest(kSteps);
  ASSERT_FALSE(reference.empty());
  std::vector<std::string> args = Flags(dir_, kSteps);
  args.push_back("--step_ms=25");
  args.push_back("--shard");
  CliProcess job(Mpirun(4), args, Path("killed.out"), Path("killed.err"));
  ASSERT_TRUE(job.started());
  // Once a checkpoint past step 10 is committed, wait (up to 2 s) for the next save to be in
  // flight, then kill.
  const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
  std::optional<std::chrono::steady_clock::time_point> armed;
  bool killed = false, mid_save = false;
  while (job.Running() && std::chrono::steady_clock::now() < deadline) {
    std::vector<pid_t> victims;
    for (int rank : GetParam()) {
      if (auto pid = RankPid(job.err(), rank)) victims.push_back(*pid);
    }
    const std::vector<int64_t> steps = CommittedSteps(dir_, "model.ckpt");
    if (!armed && victims.size() == GetParam().size() && !steps.empty() &&
        *std::max_element(steps.begin(), steps.end()) >= 10) {
      armed = std::chrono::steady_clock::now();
    }
    if (armed) {
      mid_save = SaveInFlight(dir_);
      if (mid_save || std::chrono::steady_clock::now() - *armed > std::chrono::seconds(2)) {
        for (pid_t pid : victims) ASSERT_EQ(::kill(pid, SIGKILL), 0);
        killed = true;
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(killed) << "the job ended before a checkpoint past step 10\n" << job.err();
  // The survivors do not hang: mpirun ends the job.
  const std::optional<int> code = job.WaitFor(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value()) << "the job hung after the kill\n" << job.err();
  EXPECT_NE(*code, 0);
  // The latest listed checkpoint is whole.
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  auto reader = CheckpointReader::Open(*latest);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_TRUE(reader.value()->verify().problems.empty());
  const int64_t killed_at = reader.value()->metadata().step;
  EXPECT_LT(killed_at, kSteps);
  std::printf("killed %s a save, latest committed step %lld\n", mid_save ? "during" : "between",
              static_cast<long long>(killed_at));

  JobResult resumed = RunSharded(4, Flags(dir_, kSteps), "resumed");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_GT(resumed.metrics.value("start_step", int64_t{0}), 0) << resumed.err;
  EXPECT_EQ(resumed.metrics.value("final_step", int64_t{0}), kSteps);
  EXPECT_EQ(Digest(resumed), reference) << "killed after step " << killed_at << "\n" << resumed.err;
  EXPECT_TRUE(Temporaries(dir_).empty()) << "the next start removes the killed save's debris";
}

INSTANTIATE_TEST_SUITE_P(Victims, TrainSimMpiKillTest,
                         ::testing::Values(std::vector<int>{2}, std::vector<int>{0},
                                           std::vector<int>{0, 1, 2, 3}),
                         [](const ::testing::TestParamInfo<std::vector<int>>& info) {
                           if (info.param.size() == 4) return std::string("WholeJob");
                           return "Rank" + std::to_string(info.param[0]);
                         });

TEST_F(TrainSimMpiTest, ResumingTrainingOnMoreRanksThanSavedIsAClearError) {
  JobResult saved = RunSharded(2, Flags(dir_, 10), "saved");
  ASSERT_EQ(saved.exit_code, 0) << saved.out << saved.err;
  JobResult more = RunSharded(4, Flags(dir_, 20), "more");
  EXPECT_NE(more.exit_code, 0);
  EXPECT_NE(more.err.find("cannot resume training on more"), std::string::npos) << more.err;
  // Nothing saved is lost: the 2-rank job's checkpoints are all still there.
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_NE(latest->find("model.ckpt-10"), std::string::npos) << *latest;
}

TEST_F(TrainSimMpiTest, SavedOnFourRanksRestoresOnOneToFourRanksBitForBit) {
  // 4 KiB chunks: a rank's boundary chunks, read for a neighbour's rows too, stay small.
  const std::vector<std::string> flags = Flags(dir_, 20, "4KiB");
  JobResult saved = RunSharded(4, flags, "saved");
  ASSERT_EQ(saved.exit_code, 0) << saved.out << saved.err;
  const std::string digest = Digest(saved);
  ASSERT_FALSE(digest.empty());
  auto reader = CheckpointReader::OpenLatest(dir_);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  uint64_t stored = 0;
  for (const TensorInfo& tensor : reader.value()->tensors()) stored += tensor.stored_bytes;
  for (int ranks = 1; ranks <= 4; ++ranks) {
    // --saver none: restore and stop (the job is at its last step), no input needed.
    std::vector<std::string> args = flags;
    args.push_back("--saver=none");
    JobResult restored = RunSharded(ranks, args, "restore" + std::to_string(ranks));
    ASSERT_EQ(restored.exit_code, 0) << restored.out << restored.err;
    EXPECT_EQ(restored.metrics.value("start_step", int64_t{0}), 20);
    EXPECT_EQ(Digest(restored), digest) << ranks << " ranks";
    ASSERT_TRUE(restored.metrics.contains("ranks"));
    ASSERT_EQ(restored.metrics["ranks"].size(), static_cast<size_t>(ranks));
    // Every chunk is read by some rank; each rank reads its share plus, per tensor, at most
    // the two chunks at its slice's ends (O_DIRECT alignment included).
    const uint64_t bound = stored / static_cast<uint64_t>(ranks) + 9 * 2 * (8 << 10);
    uint64_t total = 0;
    std::string per_rank;
    for (const Json& rank : restored.metrics["ranks"]) {
      const uint64_t read = rank.value("restore_bytes_read", uint64_t{0});
      EXPECT_LE(read, bound) << ranks << " ranks: " << rank.dump();
      total += read;
      per_rank += ' ';  // two appends: GCC 12 -O3 -Wrestrict misreads " " + to_string()
      per_rank += std::to_string(read);
    }
    EXPECT_GE(total, stored) << ranks << " ranks read less than the checkpoint's chunks";
    std::printf("restore on %d ranks, bytes read per rank:%s (chunks stored: %llu bytes)\n", ranks,
                per_rank.c_str(), static_cast<unsigned long long>(stored));
  }
}

}  // namespace
}  // namespace asyncckpt
