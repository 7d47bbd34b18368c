// Tests of ExportSafetensors and ImportSafetensors (src/interop/safetensors.cc): what a
// checkpoint holds comes back bit for bit through safetensors files, split as Hugging Face
// lays them out, and bad input or a name clash writes nothing.

#include "asyncckpt/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "asyncckpt/checkpointer.h"
#include "asyncckpt/file_system.h"
#include "asyncckpt/reader.h"
#include "src/format/format.h"
#include "src/format/index_file.h"
#include "tests/support/checkpoint_files.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/safetensors_test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
  }
  void TearDown() override { fs::remove_all(root_); }

  // Saves `tensors` (name -> dtype, shape) as step 1 in root_/ckpt, each byte a function of
  // the tensor and its offset; returns the checkpoint's path.
  std::string Save(const std::vector<std::tuple<std::string, DType, std::vector<int64_t>>>& specs) {
    TensorRegistry registry;
    for (const auto& [name, dtype, shape] : specs) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<uint8_t>& bytes = data_[name];
      bytes.resize(size_t(n) * DTypeSize(dtype));
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 31 + name.size() * 7);
      if (dtype == DType::kBool) {
        for (uint8_t& b : bytes) b &= 1;
      }
      EXPECT_TRUE(
          registry.add({name, dtype, shape, bytes.data(), bytes.size(), nullptr, {}, {}}).ok());
    }
    SaverOptions options;
    options.checkpoint_dir = root_ + "/ckpt";
    options.save_steps = 1;
    options.chunk_bytes = 4096;
    auto checkpointer = Checkpointer::Create(options, SaveMode::kSynchronous);
    EXPECT_TRUE(checkpointer.ok());
    EXPECT_TRUE((*checkpointer)->save(1, registry).ok());
    EXPECT_TRUE((*checkpointer)->close().ok());
    return options.checkpoint_dir + "/model.ckpt-1";
  }

  void ExpectHolds(const std::string& checkpoint, const std::string& name,
                   const std::vector<uint8_t>& want) {
    auto reader = CheckpointReader::Open(checkpoint);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    std::vector<uint8_t> got(want.size());
    ASSERT_TRUE((*reader)->read(name, got.data(), got.size()).ok()) << name;
    EXPECT_TRUE(got == want) << name;
  }

  std::set<std::string> Files(const std::string& dir) {
    std::set<std::string> names;
    if (!fs::exists(dir)) return names;
    for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename());
    return names;
  }

  std::string root_;
  std::map<std::string, std::vector<uint8_t>> data_;
};

TEST_F(SafetensorsTest, EveryDTypeRoundTripsBitExactThroughExportAndImport) {
  std::vector<std::tuple<std::string, DType, std::vector<int64_t>>> specs;
  for (DType dtype : kAllDTypes) {
    specs.emplace_back("model/" + std::string(DTypeName(dtype)), dtype,
                       std::vector<int64_t>{37, 5});
  }
  specs.emplace_back("scalar", DType::kF64, std::vector<int64_t>{});
  specs.emplace_back("empty", DType::kF32, std::vector<int64_t>{0, 3});
  const std::string checkpoint = Save(specs);
  auto exported = ExportSafetensors(root_ + "/ckpt", root_ + "/out");  // the latest of the dir
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_EQ(exported->files, std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(exported->tensors, specs.size());
  SafetensorsImportOptions options;
  options.step = 7;
  auto imported = ImportSafetensors(root_ + "/out", root_ + "/again", options);
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  EXPECT_EQ(*imported, root_ + "/again/model.ckpt-7");
  for (DType dtype : kAllDTypes) {
    const std::string name = "model/" + std::string(DTypeName(dtype));
    ExpectHolds(*imported, "model." + std::string(DTypeName(dtype)), data_[name]);
  }
  ExpectHolds(*imported, "scalar", data_["scalar"]);
  auto reader = CheckpointReader::Open(*imported);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->find("empty")->shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ((*reader)->find("model.bf16")->dtype, DType::kBF16);
}

TEST_F(SafetensorsTest, ASmallBufferExportsBitExactThroughManySlabsAndTheDataStartsOnAPage) {
  std::vector<std::tuple<std::string, DType, std::vector<int64_t>>> specs = {
      {"big", DType::kF32, {300, 257}},   // 301 KiB: larger than a slab, rows of 1028 bytes
      {"wide", DType::kF32, {2, 4000}}};  // a row of 16000 bytes: larger than a slab
  for (int i = 0; i < 50; ++i) {
    specs.emplace_back("tiny" + std::to_string(i), DType::kU8, std::vector<int64_t>{5});
  }
  Save(specs);
  SafetensorsExportOptions options;
  options.buffer_bytes = 3 * (8 << 10);  // three slabs of 8 KiB
  auto exported = ExportSafetensors(root_ + "/ckpt", root_ + "/out", options);
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  std::ifstream file(root_ + "/out/model.safetensors", std::ios::binary);
  uint64_t header_bytes = 0;
  file.read(reinterpret_cast<char*>(&header_bytes), 8);
  EXPECT_EQ((8 + header_bytes) % 4096, 0u);
  auto imported = ImportSafetensors(root_ + "/out", root_ + "/again");
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  for (const auto& [name, dtype, shape] : specs) ExpectHolds(*imported, name, data_[name]);
}

TEST_F(SafetensorsTest, ADamagedChunkFailsTheExportNamingTheTensorAndLeavesNoFile) {
  const std::string checkpoint =
      Save({{"a", DType::kF32, {64, 256}}, {"b", DType::kF32, {64, 256}}});
  ASSERT_TRUE(testing_support::DamageChunk(*io::NewPosixFileSystem(), checkpoint, "b", 9).ok());
  SafetensorsExportOptions options;
  options.buffer_bytes = 3 * (8 << 10);  // b's chunk 9 is read well after a's first writes
  auto exported = ExportSafetensors(checkpoint, root_ + "/out", options);
  ASSERT_FALSE(exported.ok());
  EXPECT_EQ(exported.status().code(), StatusCode::kCorruption) << exported.status().ToString();
  EXPECT_THAT(exported.status().message(), HasSubstr("tensor \"b\" box [32:40, 0:256]"));
  EXPECT_THAT(exported.status().message(), HasSubstr("data-0000"));
  EXPECT_THAT(exported.status().message(), HasSubstr("exporting " + checkpoint));
  EXPECT_TRUE(Files(root_ + "/out").empty());
}

TEST_F(SafetensorsTest, MaxShardBytesSplitsTheFilesAndWritesTheIndexAsHuggingFaceDoes) {
  Save({{"a", DType::kF32, {1000}}, {"b", DType::kF32, {1000}}, {"c", DType::kF32, {3000}}});
  SafetensorsExportOptions options;
  options.max_shard_bytes = 8000;
  auto exported = ExportSafetensors(root_ + "/ckpt/model.ckpt-1", root_ + "/out", options);
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_EQ(exported->files, (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                       "model-00002-of-00002.safetensors",
                                                       "model.safetensors.index.json"}));
  EXPECT_EQ(Files(root_ + "/out"),
            std::set<std::string>(exported->files.begin(), exported->files.end()));
  std::ifstream index(root_ + "/out/model.safetensors.index.json");
  const std::string json((std::istreambuf_iterator<char>(index)), std::istreambuf_iterator<char>());
  EXPECT_THAT(json, HasSubstr("\"total_size\": 20000"));
  EXPECT_THAT(json, HasSubstr("\"c\": \"model-00002-of-00002.safetensors\""));
  auto imported = ImportSafetensors(root_ + "/out", root_ + "/again");
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  ExpectHolds(*imported, "c", data_["c"]);
}

TEST_F(SafetensorsTest, NamesAreJoinedWithDotsUnlessKeptAndKeyEscapesAreUndone) {
  Save({{"model/fc.weight", DType::kF32, {4}}, {"opt/a~1b/m~0", DType::kF32, {4}}});
  auto dotted = ExportSafetensors(root_ + "/ckpt", root_ + "/dotted");
  ASSERT_TRUE(dotted.ok());
  auto back = ImportSafetensors(root_ + "/dotted/model.safetensors", root_ + "/d");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectHolds(*back, "model.fc.weight", data_["model/fc.weight"]);
  ExpectHolds(*back, "opt.a/b.m~", data_["opt/a~1b/m~0"]);
  SafetensorsExportOptions keep;
  keep.keep_names = true;
  ASSERT_TRUE(ExportSafetensors(root_ + "/ckpt", root_ + "/kept", keep).ok());
  SafetensorsImportOptions prefixed;
  prefixed.prefix = "imported/";
  auto kept = ImportSafetensors(root_ + "/kept", root_ + "/k", prefixed);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  ExpectHolds(*kept, "imported/model/fc.weight", data_["model/fc.weight"]);
}

TEST_F(SafetensorsTest, ASelectionMatchingNothingIsRefusedAndWritesNothing) {
  Save({{"model/w", DType::kF32, {4}}, {"optimizer/m", DType::kF32, {4}}});
  SafetensorsExportOptions options;
  options.select = "decoder.*";
  auto exported = ExportSafetensors(root_ + "/ckpt", root_ + "/out", options);
  ASSERT_FALSE(exported.ok());
  EXPECT_EQ(exported.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(exported.status().message(), HasSubstr("select 'decoder.*' matches none of the 2"));
  EXPECT_TRUE(Files(root_ + "/out").empty());
  options.select = "model.*";
  exported = ExportSafetensors(root_ + "/ckpt", root_ + "/out", options);
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_EQ(exported->tensors, 1u);
  options.select = "optim";  // a prefix
  exported = ExportSafetensors(root_ + "/ckpt", root_ + "/out2", options);
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ(exported->tensors, 1u);
}

TEST_F(SafetensorsTest, AnExportNeverReplacesAFileAndANameClashIsRefused) {
  Save({{"a/b", DType::kF32, {4}}, {"a.b", DType::kF32, {4}}});
  auto clash = ExportSafetensors(root_ + "/ckpt", root_ + "/out");
  ASSERT_FALSE(clash.ok());
  EXPECT_THAT(clash.status().message(), HasSubstr("would both be named \"a.b\""));
  SafetensorsExportOptions keep;
  keep.keep_names = true;
  ASSERT_TRUE(ExportSafetensors(root_ + "/ckpt", root_ + "/out", keep).ok());
  auto again = ExportSafetensors(root_ + "/ckpt", root_ + "/out", keep);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Files(root_ + "/out"), std::set<std::string>{"model.safetensors"});
}

TEST_F(SafetensorsTest, AShardedCheckpointExportsWholeGlobalTensors) {
  // Two ranks, each holding half of the rows of one global 6 x 4 f32 tensor.
  std::vector<float> global(24);
  std::iota(global.begin(), global.end(), 0.5f);
  std::vector<std::vector<testing_support::HostSlice>> ranks(2);
  for (int r = 0; r < 2; ++r) {
    testing_support::HostSlice slice;
    slice.tensor = {"w", DType::kF32, {3, 4}, global.data() + r * 12, 12 * sizeof(float)};
    slice.global_shape = {6, 4};
    slice.box_offset = {3 * r, 0};
    ranks[size_t(r)].push_back(slice);
  }
  const std::string dir = root_ + "/sharded";
  fs::create_directories(dir);
  std::unique_ptr<io::FileSystem> posix = io::NewPosixFileSystem();
  testing_support::WriterOptions writer;
  ASSERT_TRUE(testing_support::WriteShardedCheckpointFiles(*posix, dir, ranks,
                                                           CheckpointMetadata{5, 1.0, {}}, writer)
                  .ok());
  auto exported = ExportSafetensors(dir, root_ + "/out");
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  auto back = ImportSafetensors(root_ + "/out", root_ + "/again");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  std::vector<uint8_t> want(global.size() * sizeof(float));
  std::memcpy(want.data(), global.data(), want.size());
  ExpectHolds(*back, "w", want);
}

TEST_F(SafetensorsTest, AnImportOfBadInputOrOfAStepAlreadyThereWritesNothing) {
  // A header whose two tensors overlap.
  const std::string header =
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
      "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}";
  {
    std::ofstream out(root_ + "/bad.safetensors", std::ios::binary);
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << "abcdef";
  }
  auto imported = ImportSafetensors(root_ + "/bad.safetensors", root_ + "/ckpt");
  ASSERT_FALSE(imported.ok());
  EXPECT_THAT(imported.status().message(), HasSubstr("\"a\" and \"b\" overlap"));
  EXPECT_THAT(imported.status().message(), HasSubstr("bad.safetensors"));
  EXPECT_TRUE(Files(root_ + "/ckpt").empty());
  Save({{"w", DType::kF32, {4}}});
  ASSERT_TRUE(ExportSafetensors(root_ + "/ckpt", root_ + "/out").ok());
  SafetensorsImportOptions step1;
  step1.step = 1;
  auto again = ImportSafetensors(root_ + "/out", root_ + "/ckpt", step1);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace asyncckpt
