// The crash harness (issue 8): `asyncckpt train-sim` killed with SIGKILL again and again, at
// seeded random moments, in one checkpoint directory per job. Short delays land in start-up
// (the lock, start-up garbage collection, the restore), longer ones in training, saves and
// retention (max_to_keep 2 and a save every step or two, so retention runs all the time).
//
// After every kill:
//  - `asyncckpt latest` resolves to a checkpoint directory once the job has listed one;
//  - `asyncckpt verify` passes on every checkpoint the model's and the input's state files list;
//  - the newest step with both a model and an input checkpoint never goes back;
//  - the next start of the job (train-sim --steps 0: start-up, restore, clean exit) succeeds
//    and leaves no debris: no `.tmp-`, no `.deleting-`, no unlisted `<basename>-<step>` that
//    fails to verify;
//  - the bytes under checkpoint_dir stay under a bound derived from one checkpoint pair's size.
// Every job ends with a run to completion whose final model and input state (the digests, and
// the final checkpoints' bytes) equal an uninterrupted run's.
//
// ASYNCCKPT_CRASH_KILLS sets the number of kills (20 when unset; CTest registers 20 in the
// default suite and 200 under the label "torture"); ASYNCCKPT_CRASH_SEED the seed (printed).

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/reader.h"
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

constexpr char kModel[] = "model.ckpt";
constexpr char kInput[] = "input.ckpt";
constexpr char kInputStateFile[] = "checkpoint_input";
constexpr int64_t kSteps = 24;  // steps of one job
constexpr int kMaxToKeep = 2;
constexpr int kKillsPerJob = 5;  // then the job runs to its end and the next one starts
// Delays below this land in start-up and restore (the process start alone takes longer).
constexpr int kEarlyMs = 60;
constexpr double kEarlyShare = 0.35;
constexpr uint64_t kDefaultSeed = 20261125;
constexpr int kDefaultKills = 20;
// Longest any one CLI run may take before the harness calls it hung (loaded machines included).
constexpr auto kRunTimeout = std::chrono::seconds(120);
// State files, lock files and index slack on top of the checkpoints themselves.
constexpr uint64_t kSmallFilesBytes = 64 << 10;

// A job's variant: how often it saves, and with which saver.
struct Variant {
  int save_steps;
  const char* saver;
};
constexpr Variant kVariants[] = {{1, "async"}, {2, "async"}, {1, "sync"}, {2, "sync"}};

// What the harness saw, over all kills.
struct Counts {
  int kills = 0;
  int survived = 0;        // kills after which every check passed
  int listed_lost = 0;     // listed checkpoints missing or failing verification; pairs lost
  int debris = 0;          // leftovers after the next start
  int failed_starts = 0;   // starts after a kill that did not exit 0
  int unlisted = 0;        // unlisted checkpoints that verify, after the next start
  int in_startup = 0;      // resuming runs killed before they had restored
  int in_save = 0;         // kills that left a `.tmp-` save behind
  int in_retention = 0;    // kills that left a deletion half done
  int finished_first = 0;  // runs that ended before their kill landed
  int jobs = 0;            // jobs run to their end
  int bit_exact = 0;       // of which ended in the uninterrupted run's state
  uint64_t max_disk_after_kill = 0;
  uint64_t max_disk_after_start = 0;
};

// The step of `name` when it is "<basename>-<digits>".
std::optional<int64_t> StepOf(const std::string& name, const std::string& basename) {
  const std::string prefix = basename + "-";
  if (name.size() <= prefix.size() || name.rfind(prefix, 0) != 0) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

// Bytes of the regular files under `dir` (apparent sizes); 0 when it does not exist.
uint64_t DirBytes(const std::string& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) bytes += it->file_size(size_ec);
  }
  return bytes;
}

// The names a state file of `dir` lists; empty when it is missing.
std::set<std::string> Listed(const std::string& dir, const std::string& state_file) {
  auto state = GetCheckpointState(dir, state_file);
  if (!state.ok()) return {};
  return {state->all_model_checkpoint_paths.begin(), state->all_model_checkpoint_paths.end()};
}

// True when the checkpoint at `path` opens and every chunk checks out.
bool VerifiesInProcess(const std::string& path) {
  auto reader = CheckpointReader::Open(path);
  return reader.ok() && (*reader)->verify().problems.empty();
}

// "" when the checkpoints at `a` and `b` hold the same tensors, byte for byte; else what differs.
std::string CheckpointDifference(const std::string& a, const std::string& b) {
  auto left = CheckpointReader::Open(a);
  auto right = CheckpointReader::Open(b);
  if (!left.ok()) return left.status().ToString();
  if (!right.ok()) return right.status().ToString();
  if ((*left)->tensors().size() != (*right)->tensors().size()) return "tensor counts differ";
  for (const TensorInfo& info : (*left)->tensors()) {
    const TensorInfo* other = (*right)->find(info.name);
    if (other == nullptr || other->bytes != info.bytes) return info.name + " differs in size";
    std::vector<char> x(info.bytes), y(info.bytes);
    if (!(*left)->read(info.name, x.data(), x.size()).ok() ||
        !(*right)->read(info.name, y.data(), y.size()).ok()) {
      return info.name + " cannot be read";
    }
    if (x != y) return info.name + " differs";
  }
  return "";
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class CrashHarnessTest : public CliFixture {
 protected:
  CrashHarnessTest() : CliFixture("crash_harness_test.") {}

  // One job: a checkpoint directory that runs are killed in, resumed in, and finished in.
  struct Job {
    int index = 0;
    Variant variant{1, "async"};
    std::string dir;
    int kills = 0;
    int64_t newest_pair = -1;  // the newest step with both checkpoints seen so far
    bool ever_listed = false;  // whether the model's state file has listed a checkpoint
  };

  void SetUp() override {
    CliFixture::SetUp();
    if (HasFatalFailure()) return;
    dataset_ = Path("dataset.bin");
    Status written = WriteRecordDataset(dataset_, 200, 32, /*seed=*/7);
    ASSERT_TRUE(written.ok()) << written.ToString();
  }

  static int KillsWanted() {
    const char* text = std::getenv("ASYNCCKPT_CRASH_KILLS");
    return text != nullptr && *text != '\0' ? std::atoi(text) : kDefaultKills;
  }
  static uint64_t Seed() {
    const char* text = std::getenv("ASYNCCKPT_CRASH_SEED");
    return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 10) : kDefaultSeed;
  }

  // The flags of a run of `job` up to `steps`.
  std::vector<std::string> Args(const Job& job, int64_t steps, const std::string& metrics) const {
    std::vector<std::string> args = {"train-sim", "--quiet", "--memcpy_yardstick", "false"};
    const std::pair<const char*, std::string> flags[] = {
        {"--checkpoint_dir", job.dir},
        {"--steps", std::to_string(steps)},
        {"--save_steps", std::to_string(job.variant.save_steps)},
        {"--saver", job.variant.saver},
        {"--max_to_keep", std::to_string(kMaxToKeep)},
        {"--model_bytes", "2MiB"},
        {"--tensors", "2"},
        {"--chunk_bytes", "256KiB"},
        {"--compression", "none"},
        {"--step_ms", "10"},
        {"--dataset", dataset_},
        {"--batch_size", "8"},
        {"--shuffle_buffer", "32"},
        {"--prefetch", "8"},
    };
    for (const auto& [flag, value] : flags) args.insert(args.end(), {flag, value});
    if (!metrics.empty()) args.insert(args.end(), {"--metrics_json", metrics});
    return args;
  }

  std::string Tag(const std::string& what) { return Path("log-" + std::to_string(++runs_) + what); }

  // The --metrics_json of a run that ended with exit 0; null otherwise.
  static Json Metrics(const std::string& path) {
    Json parsed = Json::parse(ReadFile(path), nullptr, /*allow_exceptions=*/false);
    return parsed.is_discarded() ? Json() : parsed;
  }

  // The uninterrupted run every job must end like.
  void RunStraight() {
    Job straight;
    straight.dir = Path("straight");
    const std::string metrics = Path("straight.json");
    const auto start = std::chrono::steady_clock::now();
    const CliRun run = testing_support::RunCli(Args(straight, kSteps, metrics), Tag(".out"),
                                               Tag(".err"), kRunTimeout);
    full_run_ms_ =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    ASSERT_EQ(run.exit_code.value_or(-1), 0) << run.err;
    straight_ = Metrics(metrics);
    ASSERT_FALSE(straight_.is_null());
    ASSERT_EQ(straight_["final_step"], kSteps);
    straight_dir_ = straight.dir;
    pair_bytes_ = DirBytes(straight.dir + "/" + kModel + "-" + std::to_string(kSteps)) +
                  DirBytes(straight.dir + "/" + kInput + "-" + std::to_string(kSteps));
    ASSERT_GT(pair_bytes_, 0u);
  }

  // Checks a finished run of `job` against the uninterrupted one.
  void ExpectBitExact(const Job& job, const Json& metrics, Counts& counts) {
    SCOPED_TRACE("job " + std::to_string(job.index) + " in " + job.dir);
    ++counts.jobs;
    ASSERT_FALSE(metrics.is_null());
    EXPECT_EQ(metrics["final_step"], kSteps);
    std::string step = "-";  // appended: GCC 12 -O3 -Wrestrict false positive on "-" + string&&
    step += std::to_string(kSteps);
    const std::string model =
        CheckpointDifference(job.dir + "/" + kModel + step, straight_dir_ + "/" + kModel + step);
    const std::string input =
        CheckpointDifference(job.dir + "/" + kInput + step, straight_dir_ + "/" + kInput + step);
    EXPECT_EQ(model, "");
    EXPECT_EQ(input, "");
    const bool same = metrics["final_state_digest"] == straight_["final_state_digest"] &&
                      metrics["input_state_digest"] == straight_["input_state_digest"] &&
                      metrics["records_consumed"] == straight_["records_consumed"] &&
                      model.empty() && input.empty();
    EXPECT_TRUE(same) << "resumed: " << metrics.dump() << "\nstraight: " << straight_.dump();
    if (same) ++counts.bit_exact;
  }

  // Runs `job` to its end (and verifies what it lists) and checks the result.
  void FinishJob(const Job& job, Counts& counts) {
    const std::string metrics = Tag(".json");
    std::vector<std::string> args = Args(job, kSteps, metrics);
    args.push_back("--verify");
    const CliRun run = testing_support::RunCli(args, Tag(".out"), Tag(".err"), kRunTimeout);
    EXPECT_EQ(run.exit_code.value_or(-1), 0) << "job " << job.index << ": " << run.err;
    if (run.exit_code.value_or(-1) != 0) {
      ++counts.jobs;  // ended, not bit-exact
      return;
    }
    ExpectBitExact(job, Metrics(metrics), counts);
  }

  // `asyncckpt latest` and `asyncckpt verify` on what the state files list; true when all pass.
  bool CheckListed(Job& job, Counts& counts, std::string* said) {
    bool ok = true;
    const bool has_state_file = fs::exists(job.dir + "/checkpoint");
    if (has_state_file || job.ever_listed) {
      const CliRun latest =
          testing_support::RunCli({"latest", job.dir}, Tag(".out"), Tag(".err"), kRunTimeout);
      std::string path = latest.out;
      while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
      if (latest.exit_code.value_or(-1) != 0 || !fs::is_directory(path)) {
        ++counts.listed_lost;
        ok = false;
        *said += " latest failed (" + latest.err + path + ")";
      } else {
        job.ever_listed = true;
      }
    }
    for (const char* state_file : {"checkpoint", kInputStateFile}) {
      for (const std::string& name : Listed(job.dir, state_file)) {
        const CliRun verify = testing_support::RunCli({"verify", job.dir + "/" + name}, Tag(".out"),
                                                      Tag(".err"), kRunTimeout);
        if (verify.exit_code.value_or(-1) != 0) {
          ++counts.listed_lost;
          ok = false;
          *said += " listed " + name + " fails verify (" + verify.err + ")";
        }
      }
    }
    return CheckNewestPair(job, counts, said) && ok;
  }

  // The newest step with both checkpoints never goes back.
  bool CheckNewestPair(Job& job, Counts& counts, std::string* said) {
    auto complete = NewestCompleteStep(job.dir, kModel, kInput);
    const int64_t now = complete.ok() ? complete->value_or(-1) : -2;
    if (now < job.newest_pair) {
      ++counts.listed_lost;
      *said += " newest pair went back from " + std::to_string(job.newest_pair) + " to " +
               std::to_string(now);
      return false;
    }
    job.newest_pair = now;
    return true;
  }

  // What a kill left that tells where it landed: a save half written, a deletion half done.
  void Classify(const Job& job, Counts& counts, std::string* said) {
    bool save = false, retention = false;
    const std::set<std::string> model = Listed(job.dir, "checkpoint");
    const std::set<std::string> input = Listed(job.dir, kInputStateFile);
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(job.dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (Contains(name, ".tmp-")) save = true;
      if (Contains(name, ".deleting-")) retention = true;
      // Older than what the state file lists, dropped from it, not yet renamed away: retention
      // was between the two. (A newer unlisted one was committed, its state file not yet
      // rewritten: a save.)
      for (const auto& [basename, listed] : {std::pair{kModel, &model}, {kInput, &input}}) {
        const std::optional<int64_t> step = StepOf(name, basename);
        if (!step || listed->empty() || listed->count(name)) continue;
        bool older = false;
        for (const std::string& kept : *listed) older |= StepOf(kept, basename) > step;
        (older ? retention : save) = true;
      }
    }
    if (save) {
      ++counts.in_save;
      *said += " save";
    }
    if (retention) {
      ++counts.in_retention;
      *said += " retention";
    }
  }

  // The next start (start-up garbage collection, restore, a clean exit at once), then no debris.
  bool StartAgainAndCheck(Job& job, Counts& counts, std::string* said) {
    const CliRun start =
        testing_support::RunCli(Args(job, 0, ""), Tag(".out"), Tag(".err"), kRunTimeout);
    if (start.exit_code.value_or(-1) != 0) {
      ++counts.failed_starts;
      *said += " the next start failed (exit " + std::to_string(start.exit_code.value_or(-1)) +
               "): " + start.err;
      return false;
    }
    bool ok = true;
    const std::set<std::string> model = Listed(job.dir, "checkpoint");
    const std::set<std::string> input = Listed(job.dir, kInputStateFile);
    for (const auto& entry : fs::directory_iterator(job.dir)) {
      const std::string name = entry.path().filename().string();
      const bool committed_looking = StepOf(name, kModel) || StepOf(name, kInput);
      if (Contains(name, ".tmp-") || Contains(name, ".deleting-")) {
        ++counts.debris;
        ok = false;
        *said += " debris " + name;
      } else if (committed_looking && !model.count(name) && !input.count(name)) {
        if (VerifiesInProcess(entry.path().string())) {
          ++counts.unlisted;
          *said += " unlisted " + name;
        } else {
          ++counts.debris;
          ok = false;
          *said += " debris " + name;
        }
      } else if (committed_looking && !VerifiesInProcess(entry.path().string())) {
        ++counts.listed_lost;
        ok = false;
        *said += " listed " + name + " fails verification after the start";
      }
    }
    const uint64_t bytes = DirBytes(job.dir);
    counts.max_disk_after_start = std::max(counts.max_disk_after_start, bytes);
    if (bytes > BoundAfterStart()) {
      ok = false;
      *said += " " + std::to_string(bytes) + " bytes after the start";
    }
    return CheckNewestPair(job, counts, said) && ok;
  }

  // After a clean start: max_to_keep listed per side, one more on a side whose partner lags a
  // save, and one re-saved or relisted step.
  uint64_t BoundAfterStart() const { return (kMaxToKeep + 2) * pair_bytes_ + kSmallFilesBytes; }
  // After a kill, also a deletion half done and the engine's two saves in flight
  // (EngineOptions::max_saves_in_flight).
  uint64_t BoundAfterKill() const { return (kMaxToKeep + 4) * pair_bytes_ + kSmallFilesBytes; }

  // Starts a run of `job`, kills it after a seeded delay, and checks what it left. Returns false
  // when the run ended before the kill (the job is then finished).
  bool KillOnce(Job& job, std::mt19937_64& rng, Counts& counts) {
    const bool resuming = job.newest_pair >= 0;
    const bool early = std::bernoulli_distribution(kEarlyShare)(rng);
    // A late kill lands anywhere in what is left of the job (a resumed run has fewer steps).
    const double left = double(kSteps - std::max<int64_t>(job.newest_pair, 0)) / kSteps;
    const int max_ms = early ? kEarlyMs : std::max(kEarlyMs, static_cast<int>(full_run_ms_ * left));
    const int delay_ms = std::uniform_int_distribution<int>(0, max_ms)(rng);
    const std::string metrics = Tag(".json");
    CliProcess run(Args(job, kSteps, metrics), Tag(".out"), Tag(".err"));
    EXPECT_TRUE(run.started()) << std::strerror(run.spawn_error());
    const auto launched = std::chrono::steady_clock::now();
    const auto kill_at = launched + std::chrono::milliseconds(delay_ms);
    while (run.Running() && std::chrono::steady_clock::now() < kill_at) {
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    run.Kill();
    const int code = run.Wait();
    if (code == 0) {
      ++counts.finished_first;
      // The machine got faster than when the straight run was timed: aim the late kills at
      // what a run takes now.
      const double took =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - launched)
              .count();
      full_run_ms_ = std::min(full_run_ms_, 0.9 * took / left);
      ExpectBitExact(job, Metrics(metrics), counts);
      return false;
    }
    if (code != 128 + SIGKILL) {
      ++counts.failed_starts;
      ADD_FAILURE() << "job " << job.index << ": a run after " << job.kills
                    << " kills failed (exit " << code << "): " << run.err();
      return false;
    }
    ++counts.kills;
    ++job.kills;
    std::string said =
        "kill " + std::to_string(counts.kills) + ": job " + std::to_string(job.index) +
        " (save_steps " + std::to_string(job.variant.save_steps) + ", " + job.variant.saver +
        ") after " + std::to_string(delay_ms) + " ms" + (early ? " (early)" : "") + ", in:";
    if (resuming && !Contains(run.err(), "resuming at step")) {
      ++counts.in_startup;
      said += " startup";
    }
    Classify(job, counts, &said);
    const uint64_t bytes = DirBytes(job.dir);
    counts.max_disk_after_kill = std::max(counts.max_disk_after_kill, bytes);
    bool ok = bytes <= BoundAfterKill();
    if (!ok) said += " " + std::to_string(bytes) + " bytes after the kill";
    const int64_t pair_before = job.newest_pair;
    ok = CheckListed(job, counts, &said) && ok;
    ok = StartAgainAndCheck(job, counts, &said) && ok;
    said +=
        "; newest pair " + std::to_string(pair_before) + " -> " + std::to_string(job.newest_pair);
    std::cout << said << std::endl;
    if (ok) {
      ++counts.survived;
    } else {
      ADD_FAILURE() << said;
    }
    return true;
  }

  // A finished job's directory goes, unless something failed there (200 kills would leave a
  // gigabyte behind otherwise).
  void RemoveJob(const Job& job) {
    std::error_code ec;
    if (!HasFailure()) fs::remove_all(job.dir, ec);
  }

  Job NewJob() {
    Job job;
    job.index = next_job_++;
    job.variant = kVariants[job.index % std::size(kVariants)];
    job.dir = Path("job-" + std::to_string(job.index));
    return job;
  }

  std::string dataset_;
  std::string straight_dir_;
  Json straight_;
  double full_run_ms_ = 0;
  uint64_t pair_bytes_ = 0;
  int runs_ = 0;
  int next_job_ = 0;
};

TEST_F(CrashHarnessTest, KilledAtRandomMomentsListsOnlySoundCheckpointsAndEndsBitExact) {
  const int wanted = KillsWanted();
  const uint64_t seed = Seed();
  std::cout << "crash harness: seed " << seed << " (ASYNCCKPT_CRASH_SEED), " << wanted
            << " kills (ASYNCCKPT_CRASH_KILLS)" << std::endl;
  RecordProperty("seed", std::to_string(seed));
  ASSERT_NO_FATAL_FAILURE(RunStraight());
  std::cout << "crash harness: an uninterrupted run takes " << static_cast<int>(full_run_ms_)
            << " ms; a checkpoint pair is " << pair_bytes_ << " bytes" << std::endl;
  std::mt19937_64 rng(seed);
  Counts counts;
  Job job = NewJob();
  while (counts.kills < wanted && !HasFatalFailure()) {
    if (counts.failed_starts > 0 || counts.kills + counts.finished_first > 4 * wanted + 10) break;
    if (!KillOnce(job, rng, counts)) {
      RemoveJob(job);
      job = NewJob();
      continue;
    }
    if (job.kills >= kKillsPerJob) {
      FinishJob(job, counts);
      RemoveJob(job);
      job = NewJob();
    }
  }
  if (job.kills > 0) FinishJob(job, counts);

  std::cout << "crash harness: kills=" << counts.kills << " survived=" << counts.survived
            << " listed_lost=" << counts.listed_lost << " debris=" << counts.debris
            << " max_disk_bytes="
            << std::max(counts.max_disk_after_kill, counts.max_disk_after_start)
            << " (after a kill " << counts.max_disk_after_kill << " <= " << BoundAfterKill()
            << ", after the next start " << counts.max_disk_after_start
            << " <= " << BoundAfterStart() << ")"
            << " failed_starts=" << counts.failed_starts << " unlisted=" << counts.unlisted
            << " in_startup=" << counts.in_startup << " in_save=" << counts.in_save
            << " in_retention=" << counts.in_retention
            << " finished_before_kill=" << counts.finished_first << " jobs=" << counts.jobs
            << " bit_exact=" << counts.bit_exact << std::endl;
  EXPECT_EQ(counts.kills, wanted);
  EXPECT_EQ(counts.survived, counts.kills);
  EXPECT_EQ(counts.listed_lost, 0);
  EXPECT_EQ(counts.debris, 0);
  EXPECT_EQ(counts.failed_starts, 0);
  EXPECT_LE(counts.max_disk_after_kill, BoundAfterKill());
  EXPECT_LE(counts.max_disk_after_start, BoundAfterStart());
  EXPECT_EQ(counts.bit_exact, counts.jobs);
}

}  // namespace
}  // namespace asyncckpt
