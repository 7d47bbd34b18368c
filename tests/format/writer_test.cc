#include "src/format/writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <list>
#include <numeric>
#include <random>

#include "asyncckpt/file_system.h"
#include "io/fault_injection_file_system.h"
#include "tests/support/files.h"

namespace asyncckpt::format {
namespace {

using ::testing::HasSubstr;
using testing_support::ReadFileBytes;

class WriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/writer_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    fs_ = io::NewPosixFileSystem();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A float tensor of `count` smooth values (compressible by shuffle + zstd).
  HostTensor Floats(const std::string& name, size_t count) {
    auto& storage = buffers_.emplace_back(count * sizeof(float));
    for (size_t i = 0; i < count; ++i) {
      const float v = 1.0f + 0.1f * std::sin(static_cast<float>(i) * 0.01f);
      std::memcpy(storage.data() + i * sizeof(float), &v, sizeof(v));
    }
    return HostTensor{
        name, DType::kF32, {static_cast<int64_t>(count)}, storage.data(), storage.size()};
  }
  HostTensor Noise(const std::string& name, size_t bytes) {
    auto& storage = buffers_.emplace_back(bytes);
    std::mt19937 rng(static_cast<uint32_t>(bytes));
    for (auto& b : storage) b = static_cast<uint8_t>(rng());
    return HostTensor{name, DType::kU8, {static_cast<int64_t>(bytes)}, storage.data(), bytes};
  }

  std::string dir_;
  std::unique_ptr<io::FileSystem> fs_;
  std::list<std::vector<uint8_t>> buffers_;
};

TEST_F(WriterTest, ChunkBytesRoundDownToWholeElementsAndAtLeastOne) {
  EXPECT_EQ(ChunkBytesFor(10, DType::kF32), 8u);
  EXPECT_EQ(ChunkBytesFor(3, DType::kF64), 8u);
  EXPECT_EQ(ChunkBytesFor(3, DType::kU8), 3u);
  EXPECT_EQ(ChunkBytesFor(4 << 20, DType::kBF16), 4u << 20);
}

TEST_F(WriterTest, PlanCoversEveryTensorInOrderAndBalancesFiles) {
  std::vector<HostTensor> tensors = {Floats("a", 25), Floats("empty", 0), Noise("b", 7),
                                     Floats("c", 3)};
  const std::vector<ChunkJob> jobs = PlanChunks(tensors, 40, 2);
  // a: 100 bytes in chunks of 40, 40, 20; empty: none; b: 7; c: 12.
  ASSERT_EQ(jobs.size(), 5u);
  const uint64_t expected_offsets[] = {0, 40, 80, 0, 0};
  const uint64_t expected_lengths[] = {40, 40, 20, 7, 12};
  const uint32_t expected_tensors[] = {0, 0, 0, 2, 3};
  const uint32_t expected_chunks[] = {0, 1, 2, 0, 0};
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(jobs[i].offset, expected_offsets[i]) << i;
    EXPECT_EQ(jobs[i].length, expected_lengths[i]) << i;
    EXPECT_EQ(jobs[i].tensor, expected_tensors[i]) << i;
    EXPECT_EQ(jobs[i].chunk, expected_chunks[i]) << i;
  }
  // Least-loaded file first: 40 -> f0, 40 -> f1, 20 -> f0 (40 vs 40, lowest), 7 -> f1 (60 vs
  // 40), 12 -> f1 (60 vs 47).
  const uint32_t expected_files[] = {0, 1, 0, 1, 1};
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(jobs[i].file_index, expected_files[i]) << i;
}

TEST_F(WriterTest, BadTensorsAreInvalidArgumentNamingTheTensor) {
  auto expect_rejected = [&](std::vector<HostTensor> tensors, const std::string& fragment) {
    Status status = ValidateTensors(tensors);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << fragment;
    EXPECT_THAT(status.message(), HasSubstr(fragment));
  };
  HostTensor a = Floats("a", 4);
  expect_rejected({a, a}, "tensor 'a' appears twice");
  HostTensor unnamed = a;
  unnamed.name = "";
  expect_rejected({unnamed}, "empty name");
  HostTensor wrong_size = a;
  wrong_size.bytes = 15;
  expect_rejected({wrong_size}, "tensor 'a' holds 15 bytes but its shape and dtype need 16");
  HostTensor no_data = a;
  no_data.data = nullptr;
  expect_rejected({no_data}, "tensor 'a' has no data");
  HostTensor deep = a;
  deep.shape = std::vector<int64_t>(kMaxRank + 1, 1);
  deep.shape[0] = 4;
  expect_rejected({deep}, "rank 65");
  HostTensor long_name = a;
  long_name.name = std::string(kMaxNameBytes + 1, 'x');
  expect_rejected({long_name}, "65537 bytes long");
  HostTensor negative = a;
  negative.shape = {-4};
  expect_rejected({negative}, "negative or overflowing shape");
}

TEST_F(WriterTest, OversizedMetadataIsInvalidArgument) {
  CheckpointMetadata metadata;
  metadata.user["big"] = std::string(kMaxMetadataValueBytes + 1, 'v');
  Status status = ValidateMetadata(metadata);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'big'"));
}

TEST_F(WriterTest, AssembleIndexRejectsEntriesThatDoNotMatchTheirJobs) {
  std::vector<HostTensor> tensors = {Floats("a", 10)};
  const std::vector<ChunkJob> jobs = PlanChunks(tensors, 16, 1);
  ASSERT_EQ(jobs.size(), 3u);
  std::vector<ChunkEntry> entries;
  for (const ChunkJob& job : jobs) {
    entries.push_back(ChunkEntry{job.offset, job.file_index, job.offset, job.length, job.length,
                                 codec::Codec::kRaw, 0});
  }
  Result<Index> index = AssembleIndex(tensors, {}, 1, jobs, entries);
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(index->tensors[0].chunks, entries);
  entries[1].raw_bytes = 1;
  EXPECT_EQ(AssembleIndex(tensors, {}, 1, jobs, entries).status().code(), StatusCode::kInternal);
  entries[1].raw_bytes = jobs[1].length;
  entries[1].stored_bytes = jobs[1].length - 1;  // raw chunks store exactly their raw bytes
  EXPECT_EQ(AssembleIndex(tensors, {}, 1, jobs, entries).status().code(), StatusCode::kInternal);
  entries.pop_back();
  EXPECT_EQ(AssembleIndex(tensors, {}, 1, jobs, entries).status().code(), StatusCode::kInternal);
}

TEST_F(WriterTest, AssembleIndexRefusesWhatNoReaderWouldAccept) {
  // The engine plans from tensors without data pointers: that alone is fine.
  HostTensor spec{"a", DType::kF32, {4}, nullptr, 16};
  std::vector<HostTensor> tensors = {spec};
  const std::vector<ChunkJob> jobs = PlanChunks(tensors, 16, 1);
  const std::vector<ChunkEntry> entries = {ChunkEntry{0, 0, 0, 16, 16, codec::Codec::kRaw, 0}};
  EXPECT_TRUE(AssembleIndex(tensors, {}, 1, jobs, entries).ok());
  EXPECT_EQ(AssembleIndex(tensors, {}, 0, jobs, entries).status().code(),
            StatusCode::kInvalidArgument);
  tensors[0].shape = std::vector<int64_t>(kMaxRank + 1, 1);
  tensors[0].shape[0] = 4;
  Status status = AssembleIndex(tensors, {}, 1, jobs, entries).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("rank 65"));
  CheckpointMetadata metadata;
  metadata.user[std::string(kMaxMetadataKeyBytes + 1, 'k')] = "v";
  tensors[0] = spec;
  EXPECT_EQ(AssembleIndex(tensors, metadata, 1, jobs, entries).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace asyncckpt::format
