#pragma once

// The fixture of the kill-and-resume tests (input_resume_test.cc and its soak variant).

// The input pipeline's acceptance test: `asyncckpt train-sim` killed with SIGKILL at seeded
// points and run again to completion ends with the model state AND the input iterator state of
// an uninterrupted run (final_state_digest, input_state_digest), leaving no temporaries behind.
// Each step's model update depends on its batch, so a record seen twice or skipped on resume
// changes the model digest, and a shuffle buffer or generator restored wrongly changes both.
//
// Kill points come from a seeded RNG (seed printed; ASYNCCKPT_INPUT_RESUME_SEED overrides it).

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/state.h"
#include "tests/e2e/cli_support.h"

namespace asyncckpt {
namespace {

using Json = nlohmann::json;
using testing_support::CliFixture;
using testing_support::CliProcess;
using testing_support::CliRun;
using testing_support::NewestCommittedPair;
using testing_support::ReadFile;
using testing_support::Temporaries;

constexpr int64_t kSteps = 40;
constexpr int64_t kSaveSteps = 5;
// A step of the slow run; the whole slow run would take kSteps * this.
constexpr char kSlowStepMs[] = "40";
// Longest any one CLI run may take before the test calls it hung (sanitizer builds included).
constexpr auto kRunTimeout = std::chrono::seconds(120);
constexpr uint64_t kDefaultSeed = 20240611;

// One job configuration of train-sim; `args` are the flags every run of it shares.
struct JobConfig {
  std::string name;
  std::vector<std::string> args;
  // Fewest 4 KiB chunks the shuffle buffer of an input checkpoint must span.
  uint64_t min_shuffle_chunks = 1;
};

JobConfig Config(const std::string& name, const std::string& shuffle_buffer,
                 uint64_t min_shuffle_chunks) {
  JobConfig config;
  config.name = name;
  config.min_shuffle_chunks = min_shuffle_chunks;
  config.args = {"train-sim", "--model_bytes", "1MiB", "--tensors", "2", "--quiet"};
  const std::pair<const char*, std::string> flags[] = {
      {"--steps", std::to_string(kSteps)},
      {"--save_steps", std::to_string(kSaveSteps)},
      {"--batch_size", "16"},
      {"--shuffle_buffer", shuffle_buffer},
      {"--record_bytes", "64"},
      {"--chunk_bytes", "4KiB"},
      {"--dataset_records", "500"},
  };
  for (const auto& [flag, value] : flags) config.args.insert(config.args.end(), {flag, value});
  return config;
}

// The newest model checkpoint step the state file of `dir` names, or -1.
int64_t LatestModelStep(const std::string& dir) {
  auto state = GetCheckpointState(dir);
  if (!state.ok()) return -1;
  const std::string prefix = "model.ckpt-";
  const std::string& latest = state->model_checkpoint_path;
  if (latest.rfind(prefix, 0) != 0) return -1;
  try {
    return std::stoll(latest.substr(prefix.size()));
  } catch (...) {
    return -1;
  }
}

class InputResumeTest : public CliFixture {
 protected:
  InputResumeTest() : CliFixture("input_resume_test-") {}

  static uint64_t Seed() {
    const char* text = std::getenv("ASYNCCKPT_INPUT_RESUME_SEED");
    return text != nullptr ? std::strtoull(text, nullptr, 10) : kDefaultSeed;
  }

  // Runs `config` in `dir` to completion; returns its --metrics_json (null on failure).
  Json RunToEnd(const JobConfig& config, const std::string& dir, const std::string& tag,
                const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = config.args;
    const std::string metrics = Path(tag + ".json");
    args.insert(args.end(), {"--checkpoint_dir", dir, "--metrics_json", metrics});
    args.insert(args.end(), extra.begin(), extra.end());
    const CliRun run =
        testing_support::RunCli(args, Path(tag + ".out"), Path(tag + ".err"), kRunTimeout);
    EXPECT_TRUE(run.started) << std::strerror(run.spawn_error);
    const std::optional<int> code = run.exit_code;
    EXPECT_TRUE(code.has_value()) << tag << " ran past the time limit: " << run.err;
    EXPECT_EQ(code.value_or(-1), 0) << tag << ": " << run.err;
    if (code.value_or(-1) != 0) return Json();
    Json parsed = Json::parse(ReadFile(metrics), nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(parsed.is_discarded()) << tag << ": unparsable " << metrics;
    return parsed.is_discarded() ? Json() : parsed;
  }

  // Starts `config` slowly in `dir`, SIGKILLs it once the model's state file names a checkpoint
  // at or past `kill_step`; returns the step it named then (-1 when it could not be killed).
  int64_t RunAndKill(const JobConfig& config, const std::string& dir, int64_t kill_step,
                     const std::string& tag) {
    std::vector<std::string> args = config.args;
    args.insert(args.end(), {"--checkpoint_dir", dir, "--step_ms", kSlowStepMs});
    CliProcess child(args, Path(tag + ".out"), Path(tag + ".err"));
    EXPECT_TRUE(child.started()) << std::strerror(child.spawn_error());
    const auto deadline = std::chrono::steady_clock::now() + kRunTimeout;
    int64_t listed = -1;
    while (child.Running() && std::chrono::steady_clock::now() < deadline) {
      listed = LatestModelStep(dir);
      if (listed >= kill_step) {
        child.Kill();
        const int code = child.Wait();
        EXPECT_EQ(code, 128 + SIGKILL) << tag << ": " << child.err();
        return code == 128 + SIGKILL ? listed : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ADD_FAILURE() << tag << ": train-sim " << (child.Running() ? "hung" : "ended")
                  << " before checkpoint " << kill_step << " was listed (latest " << listed
                  << "): " << child.err();
    return -1;
  }

  // The uninterrupted run, then one killed-and-resumed run per kill point, each in a fresh dir.
  void ExpectResumesMatchTheStraightRun(const JobConfig& config, int kill_points) {
    const uint64_t seed = Seed();
    // One kill point drawn from each of `kill_points` equal slices of [kSaveSteps, kSteps -
    // kSaveSteps], so that early, middle and late kills are all covered whatever the seed.
    uint64_t mixed = seed;  // each configuration draws its own points (FNV-1a of its name)
    for (char c : config.name) mixed = (mixed ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
    std::mt19937_64 rng(mixed);
    const int64_t lo = kSaveSteps, span = kSteps - 2 * kSaveSteps + 1;
    std::vector<int64_t> kills;
    for (int i = 0; i < kill_points; ++i) {
      const int64_t first = lo + span * i / kill_points;
      const int64_t last = std::max(first, lo + span * (i + 1) / kill_points - 1);
      kills.push_back(std::uniform_int_distribution<int64_t>(first, last)(rng));
    }
    std::ostringstream said;
    said << config.name << ": seed " << seed << " (ASYNCCKPT_INPUT_RESUME_SEED), kill points";
    for (int64_t kill : kills) said << " " << kill;
    std::cout << said.str() << std::endl;
    RecordProperty(config.name + "_seed", std::to_string(seed));

    const Json straight = RunToEnd(config, Path(config.name + "-straight"), config.name + "-d1");
    ASSERT_FALSE(straight.is_null());
    ASSERT_EQ(straight["final_step"], kSteps);
    ASSERT_EQ(straight["start_step"], 0);
    ASSERT_EQ(straight["records_consumed"], kSteps * 16);
    // The input checkpoints are written with --chunk_bytes too: the shuffle buffer spans chunks.
    const std::string last_input =
        Path(config.name + "-straight") + "/input.ckpt-" + std::to_string(kSteps);
    auto reader = CheckpointReader::Open(last_input);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    const TensorInfo* shuffle = (*reader)->find("shuffle_buffer");
    ASSERT_NE(shuffle, nullptr) << last_input;
    EXPECT_GE(shuffle->num_chunks, config.min_shuffle_chunks)
        << "the shuffle buffer of " << last_input << " (" << shuffle->bytes
        << " bytes) should span chunks of --chunk_bytes 4KiB";

    int64_t newest_start = 0;
    for (size_t i = 0; i < kills.size(); ++i) {
      SCOPED_TRACE(said.str() + "; kill point " + std::to_string(kills[i]));
      const std::string dir = Path(config.name + "-killed-" + std::to_string(i));
      const std::string tag = config.name + "-k" + std::to_string(i);
      const int64_t listed = RunAndKill(config, dir, kills[i], tag);
      ASSERT_GE(listed, kills[i]);
      ASSERT_LT(listed, kSteps) << "the slow run finished before it was killed";
      const std::optional<int64_t> complete = NewestCommittedPair(dir);

      std::vector<std::string> extra;
      if (!complete.has_value()) {
        // No step has both checkpoints yet (under load even input.ckpt-0 can lag): a resume
        // refuses to train over the model's checkpoints, and --allow_fresh_start starts afresh.
        std::vector<std::string> args = config.args;
        args.insert(args.end(), {"--checkpoint_dir", dir});
        const CliRun refused = testing_support::RunCli(args, Path(tag + "-refused.out"),
                                                       Path(tag + "-refused.err"), kRunTimeout);
        EXPECT_EQ(refused.exit_code.value_or(-1), 1) << refused.err;
        EXPECT_NE(refused.err.find("allow_fresh_start"), std::string::npos) << refused.err;
        extra = {"--allow_fresh_start"};
      }
      const Json resumed = RunToEnd(config, dir, tag + "-resume", extra);
      ASSERT_FALSE(resumed.is_null());
      // It resumed from the newest step with both a model and an input checkpoint, or started
      // afresh from step 0 when told to.
      EXPECT_EQ(resumed["start_step"], complete.value_or(0));
      newest_start = std::max(newest_start, resumed["start_step"].get<int64_t>());
      EXPECT_EQ(resumed["final_step"], kSteps);
      EXPECT_EQ(resumed["final_state_digest"], straight["final_state_digest"]);
      EXPECT_EQ(resumed["input_state_digest"], straight["input_state_digest"]);
      EXPECT_EQ(resumed["records_consumed"], straight["records_consumed"]);
      EXPECT_TRUE(Temporaries(dir).empty()) << ::testing::PrintToString(Temporaries(dir));
    }
    EXPECT_GT(newest_start, 0) << "no kill point resumed past step 0: nothing was restored";
  }
};

// A shuffle buffer of 300 records (299 held after a step: 19 KiB, 5 chunks of 4 KiB).
}  // namespace
}  // namespace asyncckpt
