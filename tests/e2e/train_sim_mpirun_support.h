#pragma once

// The fixture of the tests that start `asyncckpt train-sim --shard` jobs under mpirun
// themselves (*_mpirun_test.cc, label "mpi"): where mpirun is, its command line for N ranks on
// this machine, a job run to its end with its stderr and --metrics_json, and the small model
// every such job shares.

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
#include <utility>
#include <vector>

#include "tests/e2e/cli_support.h"

namespace asyncckpt::testing_support {

namespace mpirun_fs = std::filesystem;
using MpirunJson = nlohmann::json;

// Longest one mpirun job may take before the test calls it hung: 4 ranks share 2 cores here.
inline constexpr auto kJobTimeout = std::chrono::seconds(180);

// mpirun: $ASYNCCKPT_MPIRUN, else the first `mpirun` on PATH; "" when there is none.
inline std::string MpirunPath() {
  if (const char* path = std::getenv("ASYNCCKPT_MPIRUN"); path != nullptr && *path != '\0') {
    return path;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t begin = 0; begin <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', begin), dirs.size());
    const mpirun_fs::path candidate = mpirun_fs::path(dirs.substr(begin, end - begin)) / "mpirun";
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
    begin = end + 1;
  }
  return "";
}

// mpirun for `ranks` processes on this one machine: more ranks than cores (--oversubscribe),
// no pinning (each rank's threads may use every core), root allowed (containers). Under
// AddressSanitizer the ranks skip the leak check: Open MPI's own allocations outlive
// MPI_Finalize (the *_mpi_test runs do the same through their ctest environment).
inline std::vector<std::string> Mpirun(int ranks) {
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
  MpirunJson metrics;
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
    if (mpirun_fs::exists(metrics))
      result.metrics = MpirunJson::parse(ReadFile(metrics), nullptr, false);
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

inline std::string Digest(const JobResult& run) {
  return run.metrics.is_object() ? run.metrics.value("final_state_digest", "") : "";
}

// "train-sim: rank R of N (pid P)" from a job's stderr.
inline std::optional<pid_t> RankPid(const std::string& err, int rank) {
  const std::regex line("rank " + std::to_string(rank) + " of [0-9]+ \\(pid ([0-9]+)\\)");
  std::smatch match;
  if (!std::regex_search(err, match, line)) return std::nullopt;
  return static_cast<pid_t>(std::stol(match[1]));
}

// `args` with the flag of `flag`'s name set to `flag` ("--name=value"), replaced or added.
inline std::vector<std::string> With(std::vector<std::string> args, const std::string& flag) {
  const std::string name = flag.substr(0, flag.find('=') + 1);
  for (std::string& arg : args) {
    if (arg.rfind(name, 0) == 0) {
      arg = flag;
      return args;
    }
  }
  args.push_back(flag);
  return args;
}

// The input checkpoint directories of worker `worker` in `dir`.
inline std::vector<std::string> WorkerInputs(const std::string& dir, int worker) {
  std::vector<std::string> names;
  const std::string prefix = "input_worker_" + std::to_string(worker) + ".ckpt-";
  for (const auto& entry : mpirun_fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

// mpirun running `first` on ranks 0 and 1 and `second` on ranks 2 and 3 (MPMD).
inline std::vector<std::string> TwoAndTwo(const std::vector<std::string>& first) {
  std::vector<std::string> launcher = Mpirun(2);
  launcher.push_back(testing_support::CliPath());
  launcher.insert(launcher.end(), first.begin(), first.end());
  for (const char* arg : {":", "-np", "2"}) launcher.push_back(arg);
  return launcher;
}

}  // namespace asyncckpt::testing_support
