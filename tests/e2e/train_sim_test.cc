// End-to-end tests of `asyncckpt train-sim`: the CLI trains the synthetic model on a dataset the
// test writes and checkpoints it; the test replays the same model on the same input in-process
// and checks every checkpoint bit for bit, then resumes (after a clean exit and after SIGKILL)
// and checks the job ends where a straight run ends.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/device.h"
#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/state.h"
#include "src/cli/sim_model.h"
#include "tests/e2e/cli_support.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using cli::Optimizer;
using cli::SimConfig;
using cli::SimModel;
using Json = nlohmann::json;
using testing_support::CliFixture;
using testing_support::CliProcess;
using testing_support::CliRun;
using testing_support::Hex;
using testing_support::ReadFile;
using testing_support::Temporaries;

// Small enough that a run takes a fraction of a second, with several chunks per tensor.
constexpr char kModelBytes[] = "2MiB";
constexpr int kTensors = 3;
constexpr char kChunkBytes[] = "96KiB";
// The input: 100 records of 32 bytes, 8 a step, so an epoch ends every 12.5 steps and the runs
// cross epochs (and resume across them).
constexpr uint64_t kRecords = 100;
constexpr uint32_t kRecordBytes = 32;
constexpr size_t kBatchSize = 8;
constexpr size_t kShuffleBuffer = 24;
constexpr size_t kPrefetch = 5;
constexpr uint64_t kSeed = 42;
// Longest a single CLI run may take before the test calls it hung (sanitizer builds included).
constexpr auto kRunTimeout = std::chrono::seconds(90);

// One finished run: exit code, output, and the --metrics_json document when it parsed.
struct RunResult {
  int exit_code = -1;
  std::string out, err;
  Json metrics;
};

// The model the CLI builds from the flags the tests pass.
SimConfig ModelConfig(const std::string& dtype, Optimizer optimizer) {
  SimConfig config;
  config.state_bytes = 2ull << 20;
  config.num_tensors = kTensors;
  config.dtype = *ParseDType(dtype);
  config.optimizer = optimizer;
  config.seed = kSeed;
  return config;
}

// The training job redone in-process: the model, fed the digest of each step's batch from the
// same dataset, shuffle and seed that train-sim uses. Failures are test failures.
class Replay {
 public:
  Replay(const SimConfig& config, const std::string& dataset) {
    auto model = SimModel::Create(config);
    EXPECT_TRUE(model.ok()) << model.status().ToString();
    if (model.ok()) model_ = std::move(model).value();
    RecordDatasetOptions options;
    options.path = dataset;
    options.shuffle_buffer = kShuffleBuffer;
    options.prefetch = kPrefetch;
    options.seed = config.seed;
    options.epochs = -1;
    auto input = RecordDatasetIterator::Open(options);
    EXPECT_TRUE(input.ok()) << input.status().ToString();
    if (input.ok()) input_ = std::move(input).value();
  }

  bool ok() const { return model_ != nullptr && input_ != nullptr; }
  const SimModel& model() const { return *model_; }
  int64_t step() const { return step_; }

  // Runs steps until the global step is `step`.
  void AdvanceTo(int64_t step) {
    std::vector<uint8_t> batch;
    while (ok() && step_ < step) {
      Status next = input_->next_batch(kBatchSize, &batch);
      ASSERT_TRUE(next.ok()) << next.ToString();
      model_->Step(++step_, XXH3_64bits(batch.data(), batch.size()));
    }
  }

 private:
  std::unique_ptr<SimModel> model_;
  std::unique_ptr<RecordDatasetIterator> input_;
  int64_t step_ = 0;
};

// Replays the job from step 0 to `last_step` and checks, on the way, that every checkpoint the
// state file of `dir` lists holds exactly the model's state at its step. Returns the digest of
// the state at `last_step` (0 after a fatal failure).
uint64_t ExpectListedCheckpointsMatchReplay(const std::string& dir, const SimConfig& config,
                                            const std::string& dataset, int64_t last_step) {
  Replay replay(config, dataset);
  if (!replay.ok()) return 0;
  auto state = GetCheckpointState(dir);
  EXPECT_TRUE(state.ok()) << state.status().ToString();
  if (!state.ok()) return 0;
  std::map<int64_t, std::unique_ptr<CheckpointReader>> by_step;
  for (const auto& name : state->all_model_checkpoint_paths) {
    auto reader = CheckpointReader::Open(dir + "/" + name);
    EXPECT_TRUE(reader.ok()) << reader.status().ToString();
    if (!reader.ok()) continue;
    const int64_t step = (*reader)->metadata().step;
    EXPECT_EQ(name, "model.ckpt-" + std::to_string(step)) << "in " << dir;
    EXPECT_EQ((*reader)->metadata().user.count("seed"), 1u) << name;
    by_step[step] = std::move(reader).value();
  }
  for (auto& [checkpoint_step, reader] : by_step) {
    EXPECT_LE(checkpoint_step, last_step) << reader->path();
    replay.AdvanceTo(checkpoint_step);
    const TensorRegistry& registry = replay.model().registry();
    EXPECT_EQ(reader->tensors().size(), registry.size()) << reader->path();
    std::string differing;
    for (const TensorRef& tensor : registry.tensors()) {
      const TensorInfo* info = reader->find(tensor.name);
      if (info == nullptr) {
        ADD_FAILURE() << reader->path() << " lacks tensor " << tensor.name;
        continue;
      }
      EXPECT_EQ(info->dtype, tensor.dtype) << tensor.name;
      EXPECT_EQ(info->shape, tensor.shape) << tensor.name;
      std::vector<char> bytes(tensor.bytes);
      Status read = reader->read(tensor.name, bytes.data(), bytes.size());
      EXPECT_TRUE(read.ok()) << read.ToString();
      const char* expected = static_cast<const char*>(tensor.data);
      auto mismatch = std::mismatch(bytes.begin(), bytes.end(), expected);
      if (mismatch.first != bytes.end()) {
        differing += " " + tensor.name + " (first at byte " +
                     std::to_string(mismatch.first - bytes.begin()) + ")";
      }
    }
    if (!differing.empty()) {
      // Later checkpoints follow from this one; one report says it all.
      ADD_FAILURE() << reader->path() << " differs from the replayed state at step "
                    << checkpoint_step << " in:" << differing;
      return 0;
    }
  }
  replay.AdvanceTo(last_step);
  return replay.ok() ? replay.model().Digest() : 0;
}

// The highest step the state file of `dir` lists, or -1.
int64_t LatestListedStep(const std::string& dir) {
  auto state = GetCheckpointState(dir);
  if (!state.ok() || state->model_checkpoint_path.empty()) return -1;
  const std::string& name = state->model_checkpoint_path;
  return std::strtoll(name.c_str() + name.rfind('-') + 1, nullptr, 10);
}

class TrainSimTest : public CliFixture {
 protected:
  TrainSimTest() : CliFixture("train_sim_test.") {}

  void SetUp() override {
    CliFixture::SetUp();
    if (HasFatalFailure()) return;
    dataset_ = root_ + "/dataset.bin";
    Status written = WriteRecordDataset(dataset_, kRecords, kRecordBytes, /*seed=*/7);
    ASSERT_TRUE(written.ok()) << written.ToString();
  }

  // The flags every run shares, then `extra`.
  std::vector<std::string> Args(const std::string& dir, int64_t steps,
                                const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"train-sim", "--quiet"};
    auto flag = [&](const char* name, const std::string& value) {
      args.push_back(std::string("--") + name);
      args.push_back(value);
    };
    flag("model_bytes", kModelBytes);
    flag("tensors", std::to_string(kTensors));
    flag("chunk_bytes", kChunkBytes);
    flag("steps", std::to_string(steps));
    flag("save_steps", "4");
    flag("seed", std::to_string(kSeed));
    flag("dataset", dataset_);
    flag("batch_size", std::to_string(kBatchSize));
    flag("shuffle_buffer", std::to_string(kShuffleBuffer));
    flag("prefetch", std::to_string(kPrefetch));
    flag("checkpoint_dir", dir);
    flag("metrics_json", dir + ".metrics.json");
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  // Runs train-sim to completion.
  RunResult Train(const std::string& dir, int64_t steps,
                  const std::vector<std::string>& extra = {}) {
    const std::string tag = dir + "." + std::to_string(++runs_);
    const CliRun run =
        testing_support::RunCli(Args(dir, steps, extra), tag + ".out", tag + ".err", kRunTimeout);
    EXPECT_TRUE(run.started) << std::strerror(run.spawn_error);
    RunResult result;
    EXPECT_TRUE(run.exit_code.has_value())
        << "train-sim hung; killed after " << kRunTimeout.count() << " s: " << run.err;
    result.exit_code = run.exit_code.value_or(-1);
    result.out = run.out;
    result.err = run.err;
    if (result.exit_code == 0) {
      const std::string text = ReadFile(dir + ".metrics.json");
      result.metrics = Json::parse(text, nullptr, /*allow_exceptions=*/false);
      EXPECT_FALSE(result.metrics.is_discarded()) << "--metrics_json is not JSON: " << text;
    }
    return result;
  }

  std::string dataset_;
  int runs_ = 0;
};

// ---- every checkpoint equals the replayed state ------------------------------------------------

struct RoundTripCase {
  const char* saver;
  const char* dtype;
  Optimizer optimizer;
  const char* compression;
  const char* num_data_files;
};

void PrintTo(const RoundTripCase& c, std::ostream* os) {
  *os << "--saver " << c.saver << " --dtype " << c.dtype << " --optimizer "
      << (c.optimizer == Optimizer::kAdam ? "adam" : "sgd") << " --compression " << c.compression
      << " --num_data_files " << c.num_data_files;
}

class TrainSimRoundTripTest : public TrainSimTest,
                              public ::testing::WithParamInterface<RoundTripCase> {};

TEST_P(TrainSimRoundTripTest, EveryListedCheckpointEqualsTheReplayedStateBitForBit) {
  const RoundTripCase& c = GetParam();
  const std::string dir = Path("ckpt");
  const char* optimizer = c.optimizer == Optimizer::kAdam ? "adam" : "sgd";
  RunResult run = Train(
      dir, 12,
      {"--saver", c.saver, "--dtype", c.dtype, "--optimizer", optimizer, "--compression",
       c.compression, "--num_data_files", c.num_data_files, "--max_to_keep", "0", "--verify"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_TRUE(run.metrics.is_object());
  EXPECT_EQ(run.metrics["saver"], c.saver);
  EXPECT_EQ(run.metrics["start_step"], 0);
  EXPECT_EQ(run.metrics["final_step"], 12);
  EXPECT_EQ(run.metrics["checkpoints_committed"], 4);  // steps 0, 4, 8, 12
  EXPECT_EQ(run.metrics["saves_failed"], 0);
  EXPECT_EQ(run.metrics["verified_checkpoints"], 4);
  for (const Json& save : run.metrics["saves"]) EXPECT_EQ(save["ok"], true) << save.dump();

  auto state = GetCheckpointState(dir);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_EQ(
      state->all_model_checkpoint_paths,
      (std::vector<std::string>{"model.ckpt-0", "model.ckpt-4", "model.ckpt-8", "model.ckpt-12"}));
  EXPECT_EQ(state->model_checkpoint_path, "model.ckpt-12");

  EXPECT_EQ(run.metrics["records_consumed"], 12 * kBatchSize);
  const uint64_t digest = ExpectListedCheckpointsMatchReplay(dir, ModelConfig(c.dtype, c.optimizer),
                                                             dataset_, /*last_step=*/12);
  EXPECT_EQ(run.metrics["final_state_digest"], Hex(digest));
  EXPECT_NE(run.out.find("final_state_digest " + Hex(digest)), std::string::npos) << run.out;
}

INSTANTIATE_TEST_SUITE_P(
    SaversDtypesOptimizers, TrainSimRoundTripTest,
    ::testing::Values(RoundTripCase{"sync", "f32", Optimizer::kAdam, "shuffle+zstd", "2"},
                      RoundTripCase{"async", "f32", Optimizer::kAdam, "shuffle+zstd", "2"},
                      RoundTripCase{"sync", "f64", Optimizer::kSgd, "zstd", "3"},
                      RoundTripCase{"async", "f64", Optimizer::kAdam, "none", "1"},
                      RoundTripCase{"sync", "bf16", Optimizer::kAdam, "none", "2"},
                      RoundTripCase{"async", "bf16", Optimizer::kSgd, "shuffle+zstd", "3"}),
    [](const ::testing::TestParamInfo<RoundTripCase>& info) {
      std::string name = std::string(info.param.saver) + "_" + info.param.dtype + "_" +
                         (info.param.optimizer == Optimizer::kAdam ? "adam" : "sgd");
      return name;
    });

// ---- the memcpy yardstick ----------------------------------------------------------------------

TEST_F(TrainSimTest, EverySaveIsHeldAgainstTheMemcpyTakenJustBeforeIt) {
  const std::string dir = Path("yardstick");
  RunResult run = Train(dir, 12);  // saves at 0, 4, 8, 12
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.metrics["saves"].size(), 4u) << run.metrics.dump();
  ASSERT_EQ(run.metrics["state_memcpy_runs"].size(), 4u) << run.metrics.dump();
  double max_ratio = 0;
  for (const Json& save : run.metrics["saves"]) {
    SCOPED_TRACE(save.dump());
    ASSERT_TRUE(save.contains("state_memcpy_seconds"));
    const double memcpy_seconds = save["state_memcpy_seconds"].get<double>();
    EXPECT_GT(memcpy_seconds, 0.0);
    const double ratio = save["blocked_over_memcpy"].get<double>();
    EXPECT_NEAR(ratio, save["blocked_seconds"].get<double>() / memcpy_seconds, 1e-9);
    max_ratio = std::max(max_ratio, ratio);
  }
  EXPECT_DOUBLE_EQ(run.metrics["blocked_over_memcpy_max"].get<double>(), max_ratio);
  EXPECT_NE(run.out.find("blocked/memcpy     each save against the memcpy just before it"),
            std::string::npos)
      << run.out;
}

TEST_F(TrainSimTest, SaveSecsKeepsModelInputAndYardstickOnTheSameSteps) {
  // Three hooks each run a save_secs timer; they must fire at the same steps, or model and input
  // checkpoints stop pairing up for resume and saves lose their yardstick.
  const std::string dir = Path("save_secs");
  // Drift needs a trigger to fall inside a jitter of the copy times, so this run is a regression
  // guard that catches it now and then, not every time.
  std::vector<std::string> args = Args(dir, 30, {"--step_ms", "10", "--max_to_keep", "0"});
  const auto steps_flag = std::find(args.begin(), args.end(), "--save_steps");
  ASSERT_NE(steps_flag, args.end());
  *steps_flag = "--save_secs";
  *(steps_flag + 1) = "0.03";
  const CliRun run = testing_support::RunCli(args, dir + ".out", dir + ".err", kRunTimeout);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  auto model = GetCheckpointState(dir);
  auto input = GetCheckpointState(dir, "checkpoint_input");
  ASSERT_TRUE(model.ok() && input.ok());
  std::vector<std::string> input_as_model;
  for (const std::string& name : input->all_model_checkpoint_paths) {
    input_as_model.push_back("model" + name.substr(std::string("input").size()));
  }
  EXPECT_GT(model->all_model_checkpoint_paths.size(), 3u);
  EXPECT_EQ(model->all_model_checkpoint_paths, input_as_model);
  const Json metrics = Json::parse(ReadFile(dir + ".metrics.json"));
  for (const Json& save : metrics["saves"]) {
    EXPECT_TRUE(save.contains("blocked_over_memcpy")) << save.dump();
  }
}

TEST_F(TrainSimTest, YardstickOffAndBufferedWritesStillSaveEveryStep) {
  const std::string dir = Path("no_yardstick");
  RunResult run = Train(dir, 8, {"--memcpy_yardstick", "false", "--o_direct", "false", "--verify"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.metrics["checkpoints_committed"], 3);  // steps 0, 4, 8
  EXPECT_EQ(run.metrics["verified_checkpoints"], 3);
  EXPECT_TRUE(run.metrics["state_memcpy_runs"].empty()) << run.metrics.dump();
  for (const Json& save : run.metrics["saves"]) {
    EXPECT_FALSE(save.contains("blocked_over_memcpy")) << save.dump();
  }
  EXPECT_NE(run.out.find("state memcpy       not measured"), std::string::npos) << run.out;
}

// ---- the benchmark's baselines and figures ------------------------------------------------------

TEST_F(TrainSimTest, NoneSavesNothingAndReportsEveryStepAndPeakRss) {
  const std::string dir = Path("saver_none");
  RunResult run = Train(dir, 8, {"--saver", "none", "--step_series", "--verify"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.metrics["checkpoints_committed"], 0);
  EXPECT_EQ(run.metrics["saves_in_loop"], 0);
  EXPECT_EQ(run.metrics["verified_checkpoints"], -1);
  EXPECT_TRUE(run.metrics["state_memcpy_runs"].empty()) << run.metrics.dump();
  EXPECT_GE(run.metrics["peak_rss_bytes"].get<uint64_t>(),
            run.metrics["state_bytes"].get<uint64_t>());
  EXPECT_EQ(run.metrics["step_series"]["step"], Json({1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(run.metrics["step_series"]["ms"].size(), 8u);
  for (const Json& saved : run.metrics["step_series"]["saved"]) EXPECT_EQ(saved, false);
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename(), "train-sim-dataset.bin") << "none wrote " << entry.path();
  }
}

TEST_F(TrainSimTest, NaiveWritesOneFilePerTensorAndMarksItsSaveSteps) {
  const std::string dir = Path("saver_naive");
  RunResult run = Train(dir, 8, {"--saver", "naive", "--step_series"});  // saves 0, 4, 8
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.metrics["checkpoints_committed"], 3);
  EXPECT_EQ(run.metrics["saves_in_loop"], 2);
  const Json& saved = run.metrics["step_series"]["saved"];
  EXPECT_EQ(saved, Json({false, false, false, true, false, false, false, true}));
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir + "/naive-8")) {
    files += entry.is_regular_file();
  }
  EXPECT_EQ(files, static_cast<size_t>(run.metrics["tensors"].get<int64_t>()));
  for (const Json& save : run.metrics["saves"]) {
    EXPECT_EQ(save["blocked_seconds"], save["seconds_to_durable"]) << save.dump();
  }
}

// ---- sizes train-sim refuses before allocating -------------------------------------------------

// What train-sim said when run with exactly `args` (after "train-sim"): a bad value is refused
// before anything is allocated or written, with exit 2 and one line naming it.
struct Refusal {
  int exit_code = -1;
  std::string err;
};

class TrainSimRefusesTest : public TrainSimTest {
 protected:
  Refusal Run(const std::vector<std::string>& args) {
    std::vector<std::string> all = {"train-sim", "--quiet", "--checkpoint_dir", Path("job")};
    all.insert(all.end(), args.begin(), args.end());
    const std::string tag = Path("refused." + std::to_string(++runs_));
    const CliRun run = testing_support::RunCli(all, tag + ".out", tag + ".err", kRunTimeout);
    EXPECT_TRUE(run.exit_code.has_value())
        << "train-sim " << ::testing::PrintToString(args) << " hung; killed: " << run.err;
    return {run.exit_code.value_or(-1), run.err};
  }

  // Exit 2, one line on stderr holding every needle, and nothing created.
  void ExpectRefused(const std::vector<std::string>& args,
                     const std::vector<std::string>& needles) {
    SCOPED_TRACE(::testing::PrintToString(args));
    const Refusal r = Run(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    for (const std::string& needle : needles) {
      EXPECT_NE(r.err.find(needle), std::string::npos) << "no '" << needle << "' in: " << r.err;
    }
    EXPECT_FALSE(fs::exists(Path("job"))) << "train-sim started before refusing";
  }
};

TEST_F(TrainSimRefusesTest, AModelLargerThanTheMachinesMemory) {
  // Aborted with an uncaught std::bad_alloc before.
  ExpectRefused({"--model_bytes", "1TiB"},
                {"not enough memory for --model_bytes 1TiB", "needs 3.0 TiB", "available"});
}

TEST_F(TrainSimRefusesTest, SixteenGiBOnATwentyTwoGiBMachineSayingWhatWouldFit) {
  // --max_memory stands in for a 24 GiB machine, whatever this one has.
  ExpectRefused({"--model_bytes", "16GiB", "--max_memory", "22GiB"},
                {"--model_bytes 16GiB", "needs 48.0 GiB", "state 16.0 GiB",
                 "pinned staging of one snapshot 16.0 GiB", "memcpy yardstick copy 16.0 GiB",
                 "--max_memory 22GiB says 22.0 GiB are available",
                 "--memcpy_yardstick false and --staging_bytes"});
  ExpectRefused({"--model_bytes", "16GiB", "--max_memory", "22GiB", "--memcpy_yardstick", "false"},
                {"needs 32.0 GiB", "; --staging_bytes"});
  ExpectRefused({"--model_bytes", "8GiB", "--max_memory", "22GiB"},
                {"needs 24.0 GiB", "; --memcpy_yardstick false would make it fit"});
}

TEST_F(TrainSimRefusesTest, ShuffleBufferOrPrefetchAtTheirMaximumWithLargeRecords) {
  // One record in the generated dataset: the old code wrote it, then aborted reserving 16 TiB.
  const std::vector<std::string> small = {"--model_bytes",     "64KiB", "--tensors", "1",
                                          "--dataset_records", "1"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), small.begin(), small.end());
    return more;
  };
  ExpectRefused(with({"--shuffle_buffer", "16777216", "--record_bytes", "1048576"}),
                {"not enough memory for --shuffle_buffer 16777216 and --prefetch 64 with "
                 "--record_bytes 1048576",
                 "input buffers 48.0 TiB"});
  ExpectRefused(with({"--prefetch", "1048576", "--record_bytes", "1048576"}),
                {"--prefetch 1048576 with --record_bytes 1048576", "input buffers 3.0 TiB"});
  // An existing dataset sets the record size, not --record_bytes.
  const std::string big_records = Path("big_records.bin");
  ASSERT_TRUE(WriteRecordDataset(big_records, 2, 1 << 20, 1).ok());
  ExpectRefused(with({"--dataset", big_records, "--shuffle_buffer", "16777216"}),
                {"with records of 1048576 bytes in " + big_records});
}

TEST_F(TrainSimRefusesTest, AStepLongerThanAnHourQuotingTheValue) {
  // Slept for 30 million years before.
  ExpectRefused({"--step_ms", "1e15"}, {"--step_ms", "'1e15'", "3600000", "one hour"});
  ExpectRefused({"--step_ms", "3600000.5"}, {"'3600000.5'"});
}

TEST_F(TrainSimRefusesTest, ChunksBelow4KiBSayingWhy) {
  // Padded every element to 4 KiB before: a 64 KiB state made a 66 MB checkpoint.
  ExpectRefused({"--chunk_bytes", "1"},
                {"--chunk_bytes must be at least 4KiB, got '1'", "padded to 4 KiB"});
  ExpectRefused({"--chunk_bytes", "4095"}, {"got '4095'"});
}

TEST_F(TrainSimTest, FourKiBChunksKeepTheCheckpointNearTheStatesSize) {
  const std::string dir = Path("small_chunks");
  std::vector<std::string> args = Args(dir, 4, {"--compression", "none"});
  const auto chunk_flag = std::find(args.begin(), args.end(), "--chunk_bytes");
  ASSERT_NE(chunk_flag, args.end());
  *(chunk_flag + 1) = "4KiB";
  const CliRun run = testing_support::RunCli(args, dir + ".out", dir + ".err", kRunTimeout);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  uint64_t on_disk = 0;
  for (const auto& entry : fs::directory_iterator(dir + "/model.ckpt-4")) {
    on_disk += entry.file_size();
  }
  const uint64_t state = 2ull << 20;  // kModelBytes
  EXPECT_LE(on_disk, state + state / 10);
}

// The memory check reads what the machine has, not an address-space limit: under `ulimit -v`
// an allocation fails mid-start-up, and that is one clear line and exit 1, not an abort.
TEST_F(TrainSimTest, AnAllocationFailureIsAClearErrorAndExitOneNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizer runtimes cannot start under an address-space limit";
#endif
  const std::string command =
      "ulimit -v 1048576 && exec '" + testing_support::CliPath() +
      "' train-sim --quiet --steps 1 --model_bytes 2GiB --memcpy_yardstick false "
      "--staging_bytes 64MiB --checkpoint_dir '" +
      Path("job") + "' >'" + Path("ulimit.out") + "' 2>'" + Path("ulimit.err") + "'";
  const int status = std::system(command.c_str());
  const std::string err = ReadFile(Path("ulimit.err"));
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << ": " << err;
  EXPECT_EQ(WEXITSTATUS(status), 1) << err;
  EXPECT_NE(err.find("asyncckpt train-sim: out of memory"), std::string::npos) << err;
  EXPECT_EQ(err.find("terminate called"), std::string::npos) << err;
}

// ---- resume ------------------------------------------------------------------------------------

// The step a resumed run in `dir` must start from for the job to go on exactly: the newest step
// with both a committed model and a committed input checkpoint, listed or not (the next start
// lists a commit that a kill cut off before its state-file update); nullopt when there is none.
std::optional<int64_t> CompleteResumeStep(const std::string& dir) {
  return testing_support::NewestCommittedPair(dir);
}

// True when `err` announces a resume at `step` from the model checkpoint of that step.
bool SaysResumedAt(const std::string& err, const std::string& dir, int64_t step) {
  const std::string checkpoint = dir + "/model.ckpt-" + std::to_string(step);
  const std::string at = "step " + std::to_string(step);
  for (size_t begin = 0; begin < err.size();) {
    size_t end = err.find('\n', begin);
    if (end == std::string::npos) end = err.size();
    const std::string line = err.substr(begin, end - begin);
    if (line.find("resuming") != std::string::npos && line.find(checkpoint) != std::string::npos &&
        line.find(at) != std::string::npos) {
      return true;
    }
    begin = end + 1;
  }
  return false;
}

TEST_F(TrainSimTest, ResumedRunEndsInTheStateOfAStraightRun) {
  const std::string dir = Path("resumed");
  RunResult first = Train(dir, 12);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(first.err.find("resuming"), std::string::npos) << first.err;

  RunResult second = Train(dir, 20);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_TRUE(SaysResumedAt(second.err, dir, 12)) << second.err;
  EXPECT_EQ(second.metrics["start_step"], 12);
  EXPECT_EQ(second.metrics["final_step"], 20);
  EXPECT_EQ(second.metrics["steps_run"], 8);

  RunResult straight = Train(Path("straight"), 20, {"--saver", "sync"});
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  EXPECT_EQ(second.metrics["final_state_digest"], straight.metrics["final_state_digest"]);
  EXPECT_EQ(second.metrics["input_state_digest"], straight.metrics["input_state_digest"]);
  EXPECT_EQ(second.metrics["records_consumed"], straight.metrics["records_consumed"]);

  const uint64_t digest = ExpectListedCheckpointsMatchReplay(
      dir, ModelConfig("f32", Optimizer::kAdam), dataset_, /*last_step=*/20);
  EXPECT_EQ(second.metrics["final_state_digest"], Hex(digest));
  EXPECT_EQ(LatestListedStep(dir), 20);
}

TEST_F(TrainSimTest, RunKilledMidwayResumesToTheStateOfAnUninterruptedRun) {
  const std::string dir = Path("killed");
  constexpr int64_t kSteps = 40;
  {
    // 50 ms a step: checkpoint 4 lands after ~0.2 s, the run would end after ~2 s.
    CliProcess slow(Args(dir, kSteps, {"--step_ms", "50", "--max_to_keep", "0"}), Path("slow.out"),
                    Path("slow.err"));
    ASSERT_TRUE(slow.started()) << std::strerror(slow.spawn_error());
    // Kill it once a checkpoint after the first is listed, preferably while a later save is
    // still being written (a temporary exists), at the latest once step 12 is listed.
    const auto deadline = std::chrono::steady_clock::now() + kRunTimeout;
    bool killed = false;
    while (!killed && slow.Running() && std::chrono::steady_clock::now() < deadline) {
      const int64_t listed = LatestListedStep(dir);
      const bool saving = fs::exists(dir) && !Temporaries(dir).empty();
      if ((listed >= 4 && saving) || listed >= 12) {
        slow.Kill();
        killed = true;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    const int code = slow.Wait();
    ASSERT_TRUE(killed) << "train-sim ended (exit " << code
                        << ") before its checkpoints could be awaited: " << slow.err();
    ASSERT_EQ(code, 128 + SIGKILL) << slow.err();
  }

  // What the killed run committed is sound and holds the model's state at its step.
  const int64_t latest = LatestListedStep(dir);
  ASSERT_GE(latest, 4);
  ASSERT_LT(latest, kSteps);
  ExpectListedCheckpointsMatchReplay(dir, ModelConfig("f32", Optimizer::kAdam), dataset_, latest);
  const std::optional<int64_t> resume_step = CompleteResumeStep(dir);
  const std::string killed_at =
      "killed with model checkpoints up to step " + std::to_string(latest) + " listed and " +
      (resume_step ? "step " + std::to_string(*resume_step) : std::string("no step")) +
      " with both a model and an input checkpoint";

  // Leftovers of a save and of a state-file rewrite that a crash interrupted, for certain.
  const std::string stale = dir + "/model.ckpt-9999.tmp-0123456789abcdef";
  fs::create_directory(stale);
  std::ofstream(stale + "/data-00000-of-00002") << "partial";
  std::ofstream(dir + "/checkpoint.tmp-0123456789abcdef") << "partial";

  RunResult resumed = Train(dir, kSteps, {"--max_to_keep", "0"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  if (resume_step) {
    EXPECT_TRUE(SaysResumedAt(resumed.err, dir, *resume_step)) << killed_at << "\n" << resumed.err;
    EXPECT_EQ(resumed.metrics["start_step"], *resume_step) << killed_at;
  }
  EXPECT_EQ(resumed.metrics["final_step"], kSteps);
  EXPECT_TRUE(Temporaries(dir).empty()) << ::testing::PrintToString(Temporaries(dir));

  RunResult straight = Train(Path("straight"), kSteps);
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  EXPECT_EQ(resumed.metrics["final_state_digest"], straight.metrics["final_state_digest"])
      << killed_at << "; the resumed run said:\n"
      << resumed.err;
  EXPECT_EQ(resumed.metrics["input_state_digest"], straight.metrics["input_state_digest"])
      << killed_at;
  const uint64_t digest = ExpectListedCheckpointsMatchReplay(
      dir, ModelConfig("f32", Optimizer::kAdam), dataset_, kSteps);
  EXPECT_EQ(resumed.metrics["final_state_digest"], Hex(digest)) << killed_at;
}

// ---- pre-emption and broken state files ---------------------------------------------------------

// The number of lines of `err` that hold `text`.
size_t CountLines(const std::string& err, const std::string& text) {
  size_t count = 0;
  for (size_t at = err.find(text); at != std::string::npos; at = err.find(text, at + 1)) ++count;
  return count;
}

TEST_F(TrainSimTest, PreemptedRunRecoversAndEndsInTheStateOfAStraightRun) {
  RunResult straight = Train(Path("straight"), 40);
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  EXPECT_EQ(straight.metrics["recoveries"], 0);
  for (const char* saver : {"async", "sync"}) {
    SCOPED_TRACE(std::string("--saver ") + saver);
    const std::string dir = Path(std::string("preempted-") + saver);
    RunResult run = Train(dir, 40, {"--saver", saver, "--preempt_at_steps", "13,27"});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_EQ(run.metrics["recoveries"], 2);
    EXPECT_EQ(CountLines(run.err, "simulated pre-emption at step"), 2u) << run.err;
    EXPECT_EQ(CountLines(run.err, "recovered; the session goes on from step"), 2u) << run.err;
    // Saves every 4 steps: the saves of steps 12 and 24 were still in flight when steps 13 and
    // 27 were pre-empted, and each recovery waits for them before it restores.
    EXPECT_EQ(CountLines(run.err, "the session goes on from step 12\n"), 1u) << run.err;
    EXPECT_EQ(CountLines(run.err, "the session goes on from step 24\n"), 1u) << run.err;
    EXPECT_NE(run.out.find("recoveries         2"), std::string::npos) << run.out;
    EXPECT_EQ(run.metrics["start_step"], 0);
    EXPECT_EQ(run.metrics["final_step"], 40);
    EXPECT_EQ(run.metrics["final_state_digest"], straight.metrics["final_state_digest"]);
    EXPECT_EQ(run.metrics["input_state_digest"], straight.metrics["input_state_digest"]);
    EXPECT_EQ(run.metrics["records_consumed"], straight.metrics["records_consumed"]);
    const uint64_t digest = ExpectListedCheckpointsMatchReplay(
        dir, ModelConfig("f32", Optimizer::kAdam), dataset_, /*last_step=*/40);
    EXPECT_EQ(run.metrics["final_state_digest"], Hex(digest));
  }
}

TEST_F(TrainSimTest, PreemptionBeforeTheFirstCheckpointsCommitStartsAgainFromStepZero) {
  // At step 1 the saves of step 0 may still be in flight: the session comes back at step 0,
  // restored or reset, and the model and input start over together.
  RunResult straight = Train(Path("straight"), 10);
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  RunResult run = Train(Path("early"), 10, {"--preempt_at_steps", "1,2"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.metrics["recoveries"], 2);
  EXPECT_EQ(run.metrics["final_state_digest"], straight.metrics["final_state_digest"]);
  EXPECT_EQ(run.metrics["input_state_digest"], straight.metrics["input_state_digest"]);
}

// Finding 6a: the state file emptied, naming a missing checkpoint, or naming one that was
// deleted. The resume either restores a model and input pair of one step (where the state file
// is read with a fallback to the directory) or fails saying why, and loses nothing; it never
// starts from step 0 beside a restored input.
TEST_F(TrainSimTest, ABrokenStateFileNeverStartsFromStepZeroBesideARestoredInput) {
  const std::string original = Path("original");
  RunResult first = Train(original, 12, {"--max_to_keep", "0"});  // saves 0, 4, 8, 12
  ASSERT_EQ(first.exit_code, 0) << first.err;
  RunResult straight = Train(Path("straight"), 20);
  ASSERT_EQ(straight.exit_code, 0) << straight.err;

  struct Case {
    std::string name;
    std::function<void(const std::string&)> break_it;
    int64_t newest_pair;  // the newest step with both checkpoints left on disk
  };
  const std::vector<Case> cases = {
      {"empty", [](const std::string& dir) { testing_support::WriteFile(dir + "/checkpoint", ""); },
       12},
      {"missing",
       [](const std::string& dir) {
         testing_support::WriteFile(dir + "/checkpoint",
                                    "model_checkpoint_path: \"model.ckpt-999\"\n"
                                    "all_model_checkpoint_paths: \"model.ckpt-999\"\n");
       },
       12},
      {"deleted", [](const std::string& dir) { fs::remove_all(dir + "/model.ckpt-12"); }, 8},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = Path(c.name);
    fs::copy(original, dir, fs::copy_options::recursive);
    c.break_it(dir);
    std::vector<std::string> before;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_directory()) before.push_back(entry.path().filename().string());
    }
    RunResult resumed = Train(dir, 20, {"--max_to_keep", "0"});
    const std::string restored_input = "restored the input pipeline from " + dir + "/input.ckpt-";
    if (resumed.exit_code == 0) {
      EXPECT_NE(resumed.err.find(restored_input + std::to_string(c.newest_pair) + "\n"),
                std::string::npos)
          << resumed.err;
    } else {
      EXPECT_EQ(resumed.err.find(restored_input), std::string::npos) << resumed.err;
    }
    if (resumed.exit_code == 0) {
      EXPECT_EQ(resumed.metrics["start_step"], c.newest_pair) << resumed.err;
      EXPECT_EQ(resumed.metrics["final_state_digest"], straight.metrics["final_state_digest"]);
      EXPECT_EQ(resumed.metrics["input_state_digest"], straight.metrics["input_state_digest"]);
    } else {
      EXPECT_EQ(resumed.exit_code, 1) << resumed.err;
      EXPECT_NE(resumed.err.find("model.ckpt-"), std::string::npos) << resumed.err;
      EXPECT_EQ(resumed.err.find("resuming at step 0"), std::string::npos) << resumed.err;
      // Nothing that was there is gone.
      for (const std::string& name : before)
        EXPECT_TRUE(fs::is_directory(dir + "/" + name)) << name;
    }
  }
}

TEST_F(TrainSimTest, ModelCheckpointsWithoutInputPartnersNeedAllowFreshStart) {
  const std::string dir = Path("no_input");
  RunResult first = Train(dir, 8, {"--max_to_keep", "0"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("input.ckpt-", 0) == 0) fs::remove_all(entry);
  }
  fs::remove(dir + "/checkpoint_input");

  RunResult refused = Train(dir, 12, {"--max_to_keep", "0"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("model.ckpt-8"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("allow_fresh_start"), std::string::npos) << refused.err;
  EXPECT_TRUE(fs::is_directory(dir + "/model.ckpt-8"));

  RunResult fresh = Train(dir, 12, {"--max_to_keep", "0", "--allow_fresh_start"});
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  EXPECT_EQ(fresh.metrics["start_step"], 0);
  RunResult straight = Train(Path("straight"), 12);
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  EXPECT_EQ(fresh.metrics["final_state_digest"], straight.metrics["final_state_digest"]);
  EXPECT_EQ(fresh.metrics["input_state_digest"], straight.metrics["input_state_digest"]);
}

// ---- --device cuda
// -------------------------------------------------------------------------------

TEST_F(TrainSimTest, DeviceCudaWithoutAGpuFailsSayingSoAndWritesNothing) {
  if (CudaAvailable()) GTEST_SKIP() << "a GPU is visible";
  const std::string dir = Path("no-gpu");
  RunResult run = Train(dir, 4, {"--device", "cuda"});
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_NE(run.err.find("--device cuda"), std::string::npos) << run.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/checkpoint")) << "no run may start";
}

// The GPU job in each saving mode: it resumes into the state a straight run ends in, and its
// newest checkpoint restores into GPU memory bit for bit.
TEST_F(TrainSimTest, DeviceCudaResumesBitExactInEveryMode) {
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA GPU is visible";
  const std::vector<std::vector<std::string>> modes = {
      {"--saver", "sync"}, {"--saver", "async"}, {"--saver", "async", "--stream_ordered"}};
  std::string straight_digest;
  for (const auto& mode : modes) {
    SCOPED_TRACE(mode.back());
    std::vector<std::string> flags = {"--device", "cuda"};
    flags.insert(flags.end(), mode.begin(), mode.end());
    const std::string dir = Path("gpu-" + std::to_string(runs_));
    RunResult first = Train(dir, 12, flags);
    ASSERT_EQ(first.exit_code, 0) << first.err;
    RunResult second = Train(dir, 20, flags);
    ASSERT_EQ(second.exit_code, 0) << second.err;
    EXPECT_TRUE(SaysResumedAt(second.err, dir, 12)) << second.err;
    EXPECT_EQ(second.metrics["gpu_restore_bit_exact"], 1) << second.metrics.dump();
    if (straight_digest.empty()) {
      RunResult straight = Train(Path("gpu-straight"), 20, flags);
      ASSERT_EQ(straight.exit_code, 0) << straight.err;
      straight_digest = straight.metrics["final_state_digest"].get<std::string>();
    }
    EXPECT_EQ(second.metrics["final_state_digest"], straight_digest);
  }
}

TEST_F(TrainSimTest, ATruncatedOnlyCheckpointIsQuarantinedAndNeverASilentFreshStart) {
  const std::string dir = Path("truncated");
  RunResult first = Train(dir, 8, {"--max_to_keep", "1"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string model = dir + "/model.ckpt-8";
  ASSERT_TRUE(fs::is_directory(model));
  const fs::path data = fs::path(model) / "data-00000-of-00002";
  ASSERT_TRUE(fs::exists(data));
  const uintmax_t truncated_size = fs::file_size(data) / 2;
  fs::resize_file(data, truncated_size);  // a bad disk, a partial copy

  auto quarantined = [&] {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("model.ckpt-8.corrupt-", 0) == 0) names.push_back(name);
    }
    return names;
  };
  for (int attempt = 0; attempt < 2; ++attempt) {
    SCOPED_TRACE("restart " + std::to_string(attempt));
    RunResult refused = Train(dir, 12, {"--max_to_keep", "1"});
    EXPECT_NE(refused.exit_code, 0) << refused.out;
    ASSERT_EQ(quarantined().size(), 1u) << "the damaged checkpoint is kept, renamed";
    EXPECT_NE(refused.err.find(dir + "/" + quarantined()[0]), std::string::npos) << refused.err;
    EXPECT_EQ(refused.err.find("starting from step 0"), std::string::npos) << refused.err;
    EXPECT_FALSE(fs::exists(model));
    EXPECT_EQ(fs::file_size(fs::path(dir) / quarantined()[0] / "data-00000-of-00002"),
              truncated_size);
  }
  RunResult fresh = Train(dir, 12, {"--max_to_keep", "1", "--allow_fresh_start"});
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  EXPECT_EQ(fresh.metrics["start_step"], 0);
  EXPECT_EQ(quarantined().size(), 1u) << "a fresh start leaves it for a person to delete";
}

}  // namespace
}  // namespace asyncckpt
