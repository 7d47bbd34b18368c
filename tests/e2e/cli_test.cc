// The asyncckpt command line as a user meets it: the binary named by $ASYNCCKPT_CLI is run on
// checkpoints this test writes in-process, and on bad flags, values and paths. Every error must
// be one clear line on stderr that names what is wrong, with a non-zero exit.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "asyncckpt/reader.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/session.h"
#include "asyncckpt/state.h"
#include "src/cli/sim_model.h"
#include "src/format/format.h"
#include "tests/e2e/cli_support.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing_support::CliFixture;
using testing_support::CliRun;
using testing_support::ReadFile;

// Longest one CLI command may take before the test calls it hung.
constexpr auto kRunTimeout = std::chrono::seconds(60);

// The CLI's exit statuses (README, "The command-line tool").
constexpr int kOk = 0;
constexpr int kFailed = 1;  // the operation failed
constexpr int kUsage = 2;   // bad usage

// The lines of `text`, without their newlines.
std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// What one command did.
struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

std::ostream& operator<<(std::ostream& os, const CliResult& r) {
  return os << "exit " << r.exit_code << "\n--- stdout:\n" << r.out << "--- stderr:\n" << r.err;
}

class CliTest : public CliFixture {
 protected:
  CliTest() : CliFixture("cli_test.") {}

  // Runs the CLI with `args` (stdin empty) and waits for it; a hang is a failure.
  CliResult Run(const std::vector<std::string>& args) {
    const CliRun run = testing_support::RunCli(args, Path("cli.out"), Path("cli.err"), kRunTimeout);
    CliResult result;
    if (!run.started) {
      ADD_FAILURE() << "cannot run " << testing_support::CliPath() << ": "
                    << std::strerror(run.spawn_error);
      return result;
    }
    if (!run.exit_code.has_value()) {
      ADD_FAILURE() << "asyncckpt " << ::testing::PrintToString(args) << " hung; killed";
      return result;
    }
    result.exit_code = *run.exit_code;
    result.out = run.out;
    result.err = run.err;
    return result;
  }

  // Checks that `r` is a failure with `exit_code` (kUsage or kFailed) reported as exactly one
  // stderr line holding every `needle`.
  static void ExpectOneLineError(const CliResult& r, int exit_code,
                                 const std::vector<std::string>& needles) {
    EXPECT_EQ(r.exit_code, exit_code) << r;
    EXPECT_TRUE(r.out.empty()) << r;
    const std::vector<std::string> lines = Lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r;
    for (const auto& needle : needles) EXPECT_NE(lines[0].find(needle), std::string::npos) << r;
  }

  // Trains the synthetic model in-process for 8 steps, saving at steps 0, 4 and 8 into
  // Path("ckpt") with small chunks, so each tensor spans several chunks and both data files.
  // Returns the model, whose registry names what the checkpoints hold.
  std::unique_ptr<cli::SimModel> WriteCheckpoints() {
    cli::SimConfig config;
    config.state_bytes = 1ull << 20;
    config.num_tensors = 2;
    auto model = cli::SimModel::Create(config);
    EXPECT_TRUE(model.ok()) << model.status().ToString();
    if (!model.ok()) return nullptr;
    SaverOptions options;
    options.checkpoint_dir = Path("ckpt");
    options.save_steps = 4;
    options.max_to_keep = 0;
    options.chunk_bytes = 32 << 10;
    options.num_data_files = 2;
    options.user_metadata["job"] = "cli_test";
    auto hook = CheckpointSaverHook::Create(options, &(*model)->registry());
    EXPECT_TRUE(hook.ok()) << hook.status().ToString();
    if (!hook.ok()) return nullptr;
    auto session = SingularMonitoredSession::Create({hook->get()});
    EXPECT_TRUE(session.ok()) << session.status().ToString();
    if (!session.ok()) return nullptr;
    Status run = (*session)->run_until(8, [&](StepContext& ctx) {
      (*model)->Step(ctx.step(), 0);
      return Status::OK();
    });
    EXPECT_TRUE(run.ok()) << run.ToString();
    return std::move(model).value();
  }

  // A copy of checkpoint `name` of Path("ckpt") at Path(copy), to damage.
  std::string CopyCheckpoint(const std::string& name, const std::string& copy) {
    fs::copy(Path("ckpt/" + name), Path(copy), fs::copy_options::recursive);
    return Path(copy);
  }
};

// ---- flags -------------------------------------------------------------------------------------

TEST_F(CliTest, UnknownFlagIsOneLineNamingIt) {
  for (const std::string command : {"train-sim", "inspect", "verify", "latest", "restore-bench"}) {
    SCOPED_TRACE(command);
    ExpectOneLineError(Run({command, "--no_such_flag", Path("x")}), kUsage, {"--no_such_flag"});
  }
}

TEST_F(CliTest, AnEmptyPathIsShownAsTwoQuotes) {
  const CliResult r = Run({"inspect", ""});
  ExpectOneLineError(r, kFailed, {"no checkpoint at ''"});
}

TEST_F(CliTest, MissingFlagValueIsOneLineNamingTheFlag) {
  ExpectOneLineError(Run({"train-sim", "--steps"}), kUsage, {"--steps"});
}

TEST_F(CliTest, BadFlagValueIsOneLineNamingTheFlagAndTheValue) {
  // `says` is what the line must hold besides the flag's name: the value, or the rule it breaks.
  struct Case {
    std::string flag, value, says;
  };
  const std::vector<Case> cases = {
      {"steps", "abc", "abc"},
      {"model_bytes", "5XB", "5XB"},
      {"saver", "foo", "foo"},
      {"compression", "bar", "bar"},
      {"steps", "-1", ">= 0, got '-1'"},
      {"dtype", "f17", "f17"},
      {"optimizer", "lion", "lion"},
      {"save_steps", "0", ">= 1, got '0'"},
      {"chunk_bytes", "4QB", "4QB"},
      {"on_busy", "maybe", "maybe"},
      {"io", "floppy", "floppy"},
      {"step_ms", "fast", "fast"},
      {"o_direct", "perhaps", "true or false"},
      {"memcpy_yardstick", "on", "on"},
      {"preempt_at_steps", "3,x", "'x' in '3,x'"},
      {"preempt_at_steps", "0", "steps >= 1"},
      {"preempt_at_steps", "5,,6", "'5,,6'"},
      // Out of range: the message quotes the value as given, never a clamped one.
      {"tensors", "99999999999", "'99999999999'"},
      {"tensors", "0", "'0'"},
      {"max_to_keep", "99999999999", "'99999999999'"},
      {"max_to_keep", "-1", "'-1'"},
      {"compression_level", "1000", "'1000'"},
      {"num_data_files", "99999999999", "'99999999999'"},
      {"num_data_files", "0", "'0'"},
      {"background_threads", "99999999999", "'99999999999'"},
      {"dataset_records", "0", "'0'"},
      {"shuffle_buffer", "99999999999", "'99999999999'"},
      {"keep_checkpoint_every_n_hours", "-2", "'-2'"},
      {"save_secs", "0", "'0'"},
      {"staging_bytes", "1", "'1'"},
      {"model_bytes", "4", "'4'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("--" + c.flag + " " + c.value);
    // Everything else small and pointing into the test's directory, in case the value were
    // accepted and a job ran.
    std::map<std::string, std::string> flags = {{"steps", "1"},
                                                {"model_bytes", "64KiB"},
                                                {"tensors", "1"},
                                                {"checkpoint_dir", Path("job")}};
    flags[c.flag] = c.value;
    std::vector<std::string> args = {"train-sim", "--quiet"};
    for (const auto& [name, value] : flags) {
      args.push_back("--" + name);
      args.push_back(value);
    }
    ExpectOneLineError(Run(args), kUsage, {"--" + c.flag, c.says});
  }
}

TEST_F(CliTest, UnknownCommandIsOneLineNamingIt) {
  ExpectOneLineError(Run({"frobnicate"}), kUsage, {"frobnicate"});
}

TEST_F(CliTest, NoCommandPrintsUsageAndFails) {
  const CliResult r = Run({});
  EXPECT_NE(r.exit_code, 0) << r;
  EXPECT_NE(r.err.find("usage: asyncckpt"), std::string::npos) << r;
}

TEST_F(CliTest, WrongNumberOfArgumentsShowsTheUsage) {
  ExpectOneLineError(Run({"latest"}), kUsage, {"usage: asyncckpt latest DIR"});
  ExpectOneLineError(Run({"verify", Path("a"), Path("b")}), kUsage,
                     {"usage: asyncckpt verify PATH"});
  ExpectOneLineError(Run({"train-sim", "stray"}), kUsage, {"stray"});
}

// One convention for every command (README): 0 success, 1 the operation failed, 2 bad usage.
TEST_F(CliTest, EveryCommandExitsZeroOnSuccessOneOnFailureTwoOnBadUsage) {
  ASSERT_NE(WriteCheckpoints(), nullptr);
  const std::string good = Path("ckpt/model.ckpt-8");
  fs::create_directory(Path("empty"));
  testing_support::WriteFile(Path("a_file"), "not a directory");
  struct Case {
    std::vector<std::string> args;
    int exit_code;
  };
  const std::vector<Case> cases = {
      {{"inspect", good}, kOk},
      {{"inspect", Path("empty")}, kFailed},
      {{"inspect"}, kUsage},
      {{"inspect", good, "--jsn"}, kUsage},
      {{"verify", good}, kOk},
      {{"verify", Path("missing")}, kFailed},
      {{"verify", good, good}, kUsage},
      {{"latest", Path("ckpt")}, kOk},
      {{"latest", Path("empty")}, kFailed},
      {{"latest", "--dir", Path("ckpt")}, kUsage},
      {{"restore-bench", good}, kOk},
      {{"restore-bench", Path("missing")}, kFailed},
      {{"restore-bench", good, "--queue_depth", "0"}, kUsage},
      {{"train-sim", "--quiet", "--steps", "2", "--model_bytes", "64KiB", "--tensors", "1",
        "--checkpoint_dir", Path("job")},
       kOk},
      // Its checkpoint_dir is a file: the job cannot start.
      {{"train-sim", "--quiet", "--steps", "2", "--model_bytes", "64KiB", "--tensors", "1",
        "--checkpoint_dir", Path("a_file")},
       kFailed},
      {{"train-sim", "--steps", "two"}, kUsage},
      {{"train-sim", "--step_ms", "1e15"}, kUsage},
      {{"frobnicate"}, kUsage},
      {{}, kUsage},
      {{"--help"}, kOk},
  };
  for (const Case& c : cases) {
    const CliResult r = Run(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << ::testing::PrintToString(c.args) << "\n" << r;
  }
}

TEST_F(CliTest, HelpExitsZeroForEveryCommand) {
  const CliResult top = Run({"--help"});
  EXPECT_EQ(top.exit_code, 0) << top;
  for (const std::string command : {"train-sim", "inspect", "verify", "latest", "restore-bench"}) {
    EXPECT_NE(top.out.find(command), std::string::npos) << top;
    const CliResult r = Run({command, "--help"});
    EXPECT_EQ(r.exit_code, 0) << r;
    EXPECT_TRUE(r.err.empty()) << r;
    EXPECT_EQ(r.out.rfind("usage: asyncckpt " + command, 0), 0u) << r;
  }
  const CliResult train = Run({"train-sim", "--help"});
  for (const std::string flag : {"--steps", "--model_bytes", "--saver", "--compression",
                                 "--save_steps", "--checkpoint_dir", "--metrics_json"}) {
    EXPECT_NE(train.out.find(flag), std::string::npos) << flag << "\n" << train;
  }
  EXPECT_NE(Run({"inspect", "--help"}).out.find("--json"), std::string::npos);
}

// ---- restore-bench -----------------------------------------------------------------------------

TEST_F(CliTest, RestoreBenchReportsEveryRepeatAsJson) {
  ASSERT_NE(WriteCheckpoints(), nullptr);
  const std::string path = Path("ckpt/model.ckpt-8");
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  uint64_t stored = 0, raw = 0;
  for (const TensorInfo& t : (*reader)->tensors()) {
    stored += t.stored_bytes;
    raw += t.bytes;
  }
  for (const std::string o_direct : {"0", "1"}) {
    const CliResult r = Run({"restore-bench", path, "--json", "--repeat", "3", "--queue_depth", "4",
                             "--o_direct", o_direct, "--drop_cache"});
    ASSERT_EQ(r.exit_code, 0) << r;
    const nlohmann::json report = nlohmann::json::parse(r.out);
    EXPECT_EQ(report["bytes_stored"].get<uint64_t>(), stored);
    EXPECT_EQ(report["bytes_raw"].get<uint64_t>(), raw);
    EXPECT_EQ(report["queue_depth"].get<uint64_t>(), 4u);
    EXPECT_EQ(report["o_direct"].get<bool>(), o_direct == "1");
    ASSERT_EQ(report["repeats"].size(), 3u) << r;
    for (const auto& repeat : report["repeats"]) {
      EXPECT_GT(repeat["seconds"].get<double>(), 0.0);
      EXPECT_GT(repeat["read_bytes_per_second"].get<double>(), 0.0);
      EXPECT_GT(repeat["raw_bytes_per_second"].get<double>(), 0.0);
      EXPECT_TRUE(repeat.contains("cache_dropped"));
    }
  }
}

TEST_F(CliTest, RestoreBenchPrintsOneLinePerRepeat) {
  ASSERT_NE(WriteCheckpoints(), nullptr);
  const CliResult r = Run({"restore-bench", Path("ckpt/model.ckpt-8"), "--repeat", "2"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("repeat 1:"), std::string::npos) << r;
  EXPECT_NE(r.out.find("repeat 2:"), std::string::npos) << r;
  EXPECT_NE(r.out.find("read "), std::string::npos) << r;
  EXPECT_NE(r.out.find("decoded "), std::string::npos) << r;
}

TEST_F(CliTest, RestoreBenchNamesTheDamagedChunk) {
  ASSERT_NE(WriteCheckpoints(), nullptr);
  const std::string path = CopyCheckpoint("model.ckpt-8", "damaged");
  const std::string index_bytes = ReadFile(path + "/index");
  auto index = format::ParseIndex(
      std::span(reinterpret_cast<const uint8_t*>(index_bytes.data()), index_bytes.size()),
      path + "/index");
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  const format::TensorEntry& tensor = index->tensors.front();
  const format::ChunkEntry& chunk = tensor.chunks.at(1);
  const std::string data = path + "/" + format::DataFileName(chunk.file_index, 2);
  std::string bytes = ReadFile(data);
  bytes.at(chunk.file_offset + chunk.stored_bytes / 2) ^= 0x20;
  testing_support::WriteFile(data, bytes);
  ExpectOneLineError(Run({"restore-bench", path}), kFailed,
                     {data, "tensor '" + tensor.name + "' chunk 1"});
}

// ---- verify ------------------------------------------------------------------------------------

TEST_F(CliTest, VerifyAcceptsASoundCheckpoint) {
  ASSERT_NE(WriteCheckpoints(), nullptr);
  const std::string path = Path("ckpt/model.ckpt-8");
  const CliResult r = Run({"verify", path});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(r.err.empty()) << r;
  EXPECT_NE(r.out.find(path), std::string::npos) << r;
  EXPECT_NE(r.out.find("OK"), std::string::npos) << r;
}

TEST_F(CliTest, VerifyNamesTheDataFileTensorAndChunkOfAFlippedBit) {
  ASSERT_NE(WriteCheckpoints(), nullptr);
  const std::string path = CopyCheckpoint("model.ckpt-8", "flipped");
  const std::string index_bytes = ReadFile(path + "/index");
  auto index = format::ParseIndex(
      std::span(reinterpret_cast<const uint8_t*>(index_bytes.data()), index_bytes.size()),
      path + "/index");
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  // A chunk in the middle of the last tensor, so neither the first tensor nor chunk 0.
  const format::TensorEntry& tensor = index->tensors.back();
  ASSERT_GE(tensor.chunks.size(), 3u) << tensor.name;
  const size_t chunk_number = tensor.chunks.size() / 2;
  const format::ChunkEntry& chunk = tensor.chunks[chunk_number];
  const std::string data_file = format::DataFileName(chunk.file_index, index->num_data_files);
  {
    std::fstream file(path + "/" + data_file, std::ios::in | std::ios::out | std::ios::binary);
    const auto offset = static_cast<std::streamoff>(chunk.file_offset + chunk.stored_bytes / 2);
    file.seekg(offset);
    char byte = 0;
    file.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    file.seekp(offset);
    file.write(&byte, 1);
    ASSERT_TRUE(file.good());
  }

  const CliResult r = Run({"verify", path});
  EXPECT_NE(r.exit_code, 0) << r;
  EXPECT_TRUE(r.out.empty()) << r;
  bool named = false;
  for (const std::string& line : Lines(r.err)) {
    named |= line.find(data_file) != std::string::npos &&
             line.find("'" + tensor.name + "'") != std::string::npos &&
             line.find("chunk " + std::to_string(chunk_number)) != std::string::npos;
  }
  EXPECT_TRUE(named) << "no line names " << data_file << ", tensor '" << tensor.name
                     << "' and chunk " << chunk_number << "\n"
                     << r;
  // Only that chunk is damaged: one problem line, then the verdict.
  EXPECT_EQ(Lines(r.err).size(), 2u) << r;
}

TEST_F(CliTest, VerifyNamesATruncatedIndex) {
  ASSERT_NE(WriteCheckpoints(), nullptr);
  const std::string path = CopyCheckpoint("model.ckpt-4", "truncated");
  fs::resize_file(path + "/index", fs::file_size(path + "/index") / 2);
  ExpectOneLineError(Run({"verify", path}), kFailed, {path + "/index"});
  ExpectOneLineError(Run({"inspect", path}), kFailed, {path + "/index"});
}

TEST_F(CliTest, VerifyNamesAMissingPath) {
  const std::string path = Path("no_such_checkpoint");
  ExpectOneLineError(Run({"verify", path}), kFailed, {path});
  ExpectOneLineError(Run({"inspect", path}), kFailed, {path});
}

// ---- inspect -----------------------------------------------------------------------------------

TEST_F(CliTest, InspectJsonDescribesEveryTensor) {
  auto model = WriteCheckpoints();
  ASSERT_NE(model, nullptr);
  const std::string path = Path("ckpt/model.ckpt-4");
  const CliResult r = Run({"inspect", "--json", path});
  ASSERT_EQ(r.exit_code, 0) << r;
  const Json json = Json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(json.is_object()) << "not a JSON object:\n" << r.out;
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();

  EXPECT_EQ(json["path"], path);
  EXPECT_EQ(json["step"], 4);
  // Exactly, not to nine digits: a wall time in seconds since the epoch needs all of them.
  EXPECT_EQ(json["wall_time"].get<double>(), (*reader)->metadata().wall_time);
  EXPECT_EQ(json["user_metadata"]["job"], "cli_test");
  EXPECT_EQ(json["num_data_files"], 2);

  const TensorRegistry& registry = model->registry();
  ASSERT_TRUE(json["tensors"].is_array());
  ASSERT_EQ(json["tensors"].size(), registry.size());
  uint64_t chunks = 0;
  std::map<std::string, uint64_t> by_codec;
  for (size_t i = 0; i < registry.size(); ++i) {
    const TensorRef& expected = registry.tensors()[i];
    const Json& tensor = json["tensors"][i];
    EXPECT_EQ(tensor["name"], expected.name);
    EXPECT_EQ(tensor["dtype"], "f32");
    EXPECT_EQ(tensor["shape"], Json(expected.shape));
    EXPECT_EQ(tensor["bytes"], expected.bytes);
    uint64_t tensor_chunks = 0;
    for (const auto& [codec, n] : tensor["chunks_by_codec"].items()) {
      tensor_chunks += n.get<uint64_t>();
      by_codec[codec] += n.get<uint64_t>();
    }
    EXPECT_EQ(tensor["chunks"], tensor_chunks) << expected.name;
    EXPECT_GT(tensor_chunks, 1u) << expected.name;
    chunks += tensor_chunks;
  }
  EXPECT_EQ(json["chunks"], chunks);
  EXPECT_EQ(json["chunks_by_codec"], Json(by_codec));
  EXPECT_EQ(json["bytes_raw"], registry.total_bytes());
}

TEST_F(CliTest, InspectListsEveryTensor) {
  auto model = WriteCheckpoints();
  ASSERT_NE(model, nullptr);
  const std::string path = Path("ckpt/model.ckpt-8");
  const CliResult r = Run({"inspect", path});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("step 8"), std::string::npos) << r;
  EXPECT_NE(r.out.find("job = cli_test"), std::string::npos) << r;
  for (const TensorRef& tensor : model->registry().tensors()) {
    // Appended piece by piece: for `"[" + std::string&&` GCC 12 at -O3 reports an overlapping
    // memcpy of 2^63 bytes (-Wrestrict, a known false positive), which fails the Release build.
    std::string shape = "[";
    shape += std::to_string(tensor.shape[0]);
    shape += "]";
    bool listed = false;
    for (const std::string& line : Lines(r.out)) {
      listed |= line.find(tensor.name + " ") != std::string::npos &&
                line.find(shape) != std::string::npos;
    }
    EXPECT_TRUE(listed) << tensor.name << " with its shape is not listed\n" << r;
  }
}

// ---- latest ------------------------------------------------------------------------------------

TEST_F(CliTest, LatestPrintsTheLatestCheckpointPath) {
  ASSERT_NE(WriteCheckpoints(), nullptr);
  const CliResult r = Run({"latest", Path("ckpt")});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, Path("ckpt/model.ckpt-8") + "\n");
  auto latest = LatestCheckpoint(Path("ckpt"));
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(r.out, *latest + "\n");
}

TEST_F(CliTest, LatestOnAnEmptyDirectoryFailsNamingIt) {
  fs::create_directory(Path("empty"));
  ExpectOneLineError(Run({"latest", Path("empty")}), kFailed, {Path("empty")});
  ExpectOneLineError(Run({"latest", Path("missing")}), kFailed, {Path("missing")});
}

}  // namespace
}  // namespace asyncckpt
