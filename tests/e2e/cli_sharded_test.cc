// `asyncckpt inspect` and `verify` on sharded checkpoints: a checkpoint written as 3 ranks
// would (tests/support's WriteShardedCheckpointFiles) is listed with its global shapes, boxes,
// writer ranks and world size, verified, and refused by name when its slices do not tile.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "src/format/format.h"
#include "tests/e2e/cli_support.h"
#include "tests/support/checkpoint_files.h"

namespace asyncckpt {
namespace {

using Json = nlohmann::json;
using testing_support::HostSlice;
using testing_support::ReadFile;

constexpr auto kRunTimeout = std::chrono::seconds(60);

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

std::ostream& operator<<(std::ostream& os, const CliResult& r) {
  return os << "exit " << r.exit_code << "\n--- stdout:\n" << r.out << "--- stderr:\n" << r.err;
}

class CliShardedTest : public testing_support::CliFixture {
 protected:
  CliShardedTest() : CliFixture("cli_sharded_test.") {}

  CliResult Run(const std::vector<std::string>& args) {
    const testing_support::CliRun run =
        testing_support::RunCli(args, Path("cli.out"), Path("cli.err"), kRunTimeout);
    CliResult result;
    if (!run.started || !run.exit_code.has_value()) {
      ADD_FAILURE() << "asyncckpt " << ::testing::PrintToString(args) << " did not run or hung";
      return result;
    }
    result.exit_code = *run.exit_code;
    result.out = run.out;
    result.err = run.err;
    return result;
  }

  HostSlice Slice(const std::string& name, DType dtype, std::vector<int64_t> global,
                  std::vector<int64_t> first, std::vector<int64_t> extent) {
    const size_t bytes = static_cast<size_t>(NumElements(extent)) * DTypeSize(dtype);
    std::vector<uint8_t>& data = buffers_.emplace_back(bytes);
    for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(i * 7 + first[0]);
    return HostSlice{format::HostTensor{name, dtype, std::move(extent), data.data(), bytes},
                     std::move(global), std::move(first)};
  }

  // Three ranks: "w" f32 [10, 4] cut 5/2/3 rows, "e" bf16 [6] cut 4/2 by ranks 0 and 2, and
  // "step" whole, written by rank 0. Returns the checkpoint's path.
  std::string WriteSharded() {
    const std::string dir = Path("model.ckpt-42");
    std::filesystem::create_directory(dir);
    std::vector<std::vector<HostSlice>> ranks(3);
    ranks[0].push_back(Slice("w", DType::kF32, {10, 4}, {0, 0}, {5, 4}));
    ranks[1].push_back(Slice("w", DType::kF32, {10, 4}, {5, 0}, {2, 4}));
    ranks[2].push_back(Slice("w", DType::kF32, {10, 4}, {7, 0}, {3, 4}));
    ranks[0].push_back(Slice("e", DType::kBF16, {6}, {0}, {4}));
    ranks[2].push_back(Slice("e", DType::kBF16, {6}, {4}, {2}));
    ranks[0].push_back(Slice("step", DType::kI64, {1}, {0}, {1}));
    testing_support::WriterOptions options;
    options.chunk_bytes = 16;
    options.num_data_files = 1;
    auto fs = io::NewPosixFileSystem();
    Result<format::Index> index = testing_support::WriteShardedCheckpointFiles(
        *fs, dir, ranks, CheckpointMetadata{42, 1.0, {}}, options);
    EXPECT_TRUE(index.ok()) << index.status().ToString();
    if (index.ok()) index_ = *index;
    return dir;
  }

  std::list<std::vector<uint8_t>> buffers_;
  format::Index index_;
};

TEST_F(CliShardedTest, InspectJsonShowsGlobalShapesBoxesRanksAndWorldSize) {
  const std::string path = WriteSharded();
  const CliResult r = Run({"inspect", "--json", path});
  ASSERT_EQ(r.exit_code, 0) << r;
  const Json json = Json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(json.is_object()) << r.out;
  EXPECT_EQ(json["sharded"], true);
  EXPECT_EQ(json["world_size"], 3);
  EXPECT_EQ(json["num_data_files"], 3);
  ASSERT_EQ(json["tensors"].size(), 3u);  // one per global tensor
  const Json& w = json["tensors"][2];
  EXPECT_EQ(w["name"], "w");
  EXPECT_EQ(w["shape"], Json({10, 4}));
  EXPECT_EQ(w["bytes"], 160);
  ASSERT_EQ(w["slices"].size(), 3u);
  EXPECT_EQ(w["slices"][1]["offset"], Json({5, 0}));
  EXPECT_EQ(w["slices"][1]["shape"], Json({2, 4}));
  EXPECT_EQ(w["slices"][1]["writer_rank"], 1);
  EXPECT_EQ(w["slices"][1]["bytes"], 32);
  ASSERT_EQ(json["ranks"].size(), 3u);
  EXPECT_EQ(json["ranks"][0]["slices"], 3);  // w, e and step
  EXPECT_EQ(json["ranks"][1]["slices"], 1);
  EXPECT_EQ(json["ranks"][2]["slices"], 2);
  EXPECT_EQ(json["ranks"][2]["bytes"], 3 * 4 * 4 + 2 * 2);
}

TEST_F(CliShardedTest, InspectListsEverySliceUnderItsGlobalTensor) {
  const std::string path = WriteSharded();
  const CliResult r = Run({"inspect", path});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("sharded: 6 slices written by 3 ranks"), std::string::npos) << r;
  EXPECT_NE(r.out.find("rank 2: 2 slices"), std::string::npos) << r;
  bool global = false, box = false;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    global |= line.find("  w ") == 0 && line.find("[10,4]") != std::string::npos;
    box |= line.find("slice [7:10,0:4]") != std::string::npos &&
           line.find("rank 2") != std::string::npos;
  }
  EXPECT_TRUE(global) << r;
  EXPECT_TRUE(box) << r;
}

TEST_F(CliShardedTest, VerifyReportsTheTilingAndWorldSize) {
  const std::string path = WriteSharded();
  const CliResult r = Run({"verify", path});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("OK (sharded over 3 ranks: 6 slices tile 3 tensors"), std::string::npos)
      << r;
}

TEST_F(CliShardedTest, VerifyRefusesSlicesThatDoNotTileNamingTheTensor) {
  const std::string path = WriteSharded();
  // Drop rank 1's slice of "w": rows 5 and 6 are then in no slice.
  format::Index gap = index_;
  std::erase_if(gap.tensors,
                [](const format::TensorEntry& t) { return t.name == "w" && t.writer_rank == 1; });
  const std::vector<uint8_t> bytes = format::EncodeIndex(gap);
  testing_support::WriteFile(path + "/index", bytes);
  const CliResult r = Run({"verify", path});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_NE(r.err.find("tensor 'w': its 2 slices cover 32 of the 40 elements"), std::string::npos)
      << r;
  EXPECT_NE(r.err.find(path + "/index"), std::string::npos) << r;
  // Overlapping slices: rank 2's box moved up a row.
  format::Index overlap = index_;
  for (format::TensorEntry& t : overlap.tensors) {
    if (t.name == "w" && t.writer_rank == 2) t.box_offset = {6, 0};
  }
  testing_support::WriteFile(path + "/index", format::EncodeIndex(overlap));
  const CliResult o = Run({"inspect", path});
  EXPECT_EQ(o.exit_code, 1) << o;
  EXPECT_NE(
      o.err.find(
          "tensor 'w' slice 1 (box [5:7, 0:4] by rank 1) and slice 2 (box [6:9, 0:4]) overlap"),
      std::string::npos)
      << o;
}

}  // namespace
}  // namespace asyncckpt
