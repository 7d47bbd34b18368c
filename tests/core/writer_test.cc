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

  std::vector<uint64_t> DataFileSizes(uint32_t n) {
    std::vector<uint64_t> sizes;
    for (uint32_t i = 0; i < n; ++i) {
      sizes.push_back(std::filesystem::file_size(dir_ + "/" + DataFileName(i, n)));
    }
    return sizes;
  }

  Result<Index> ReadIndex(uint32_t n) {
    const std::vector<uint8_t> bytes = ReadFileBytes(dir_ + "/index");
    return DecodeIndex(bytes, dir_ + "/index", DataFileSizes(n));
  }

  size_t FilesInDir() {
    return static_cast<size_t>(std::distance(std::filesystem::directory_iterator(dir_),
                                             std::filesystem::directory_iterator()));
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

TEST_F(WriterTest, BadOptionsAreInvalidArgumentAndWriteNothing) {
  std::vector<HostTensor> tensors = {Floats("a", 10)};
  auto expect_rejected = [&](WriterOptions options, const std::string& fragment) {
    Result<WriteStats> stats = WriteCheckpointFiles(*fs_, dir_, tensors, {}, options);
    EXPECT_EQ(stats.status().code(), StatusCode::kInvalidArgument) << fragment;
    EXPECT_THAT(stats.status().message(), HasSubstr(fragment));
    EXPECT_EQ(FilesInDir(), 0u);
  };
  WriterOptions options;
  options.chunk_bytes = 0;
  expect_rejected(options, "chunk_bytes");
  options = {};
  options.chunk_bytes = kMaxChunkBytes + 1;
  expect_rejected(options, "chunk_bytes");
  options = {};
  options.num_data_files = 0;
  expect_rejected(options, "num_data_files");
  options = {};
  options.num_data_files = kMaxDataFiles + 1;
  expect_rejected(options, "num_data_files");
  options = {};
  options.compression.level = 99;
  expect_rejected(options, "level");
}

TEST_F(WriterTest, BadTensorsAreInvalidArgumentNamingTheTensor) {
  auto expect_rejected = [&](std::vector<HostTensor> tensors, const std::string& fragment) {
    Result<WriteStats> stats = WriteCheckpointFiles(*fs_, dir_, tensors, {}, {});
    EXPECT_EQ(stats.status().code(), StatusCode::kInvalidArgument) << fragment;
    EXPECT_THAT(stats.status().message(), HasSubstr(fragment));
    EXPECT_EQ(FilesInDir(), 0u);
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
  Result<WriteStats> stats = WriteCheckpointFiles(*fs_, dir_, {}, metadata, {});
  EXPECT_EQ(stats.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(stats.status().message(), HasSubstr("'big'"));
}

TEST_F(WriterTest, WritesDataFilesAndAnIndexThatDecodes) {
  std::vector<HostTensor> tensors = {Floats("weights", 10000), Noise("noise", 5000),
                                     Floats("empty", 0), Floats("scalar", 1)};
  tensors[3].shape = {};
  CheckpointMetadata metadata{42, 1.25, {{"run", "test"}}};
  WriterOptions options;
  options.chunk_bytes = 4096;
  options.num_data_files = 3;
  Result<WriteStats> stats = WriteCheckpointFiles(*fs_, dir_, tensors, metadata, options);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(FilesInDir(), 4u);

  Result<Index> index = ReadIndex(3);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->metadata.step, 42);
  EXPECT_EQ(index->metadata.wall_time, 1.25);
  EXPECT_EQ(index->metadata.user.at("run"), "test");
  ASSERT_EQ(index->tensors.size(), 4u);
  EXPECT_EQ(index->tensors[0].name, "weights");
  EXPECT_EQ(index->tensors[0].chunks.size(), 10u);  // 40000 bytes in 4096-byte chunks
  EXPECT_EQ(index->tensors[2].chunks.size(), 0u);
  EXPECT_EQ(index->tensors[3].shape, std::vector<int64_t>{});
  EXPECT_EQ(index->tensors[3].chunks.size(), 1u);

  // The stats agree with the files and the index.
  EXPECT_EQ(stats->bytes_raw, 40000u + 5000u + 0u + 4u);
  const std::vector<uint64_t> sizes = DataFileSizes(3);
  EXPECT_EQ(stats->bytes_stored, std::accumulate(sizes.begin(), sizes.end(), uint64_t{0}));
  uint64_t chunks = 0;
  for (const auto& tensor : index->tensors) chunks += tensor.chunks.size();
  EXPECT_EQ(stats->chunks, chunks);
  uint64_t by_codec = 0;
  for (const auto& [name, count] : stats->chunks_by_codec) by_codec += count;
  EXPECT_EQ(by_codec, chunks);
  // Smooth floats shrink (shuffled); noise is kept raw.
  EXPECT_GT(stats->chunks_by_codec["shuffle+zstd"], 0u);
  EXPECT_GT(stats->chunks_by_codec["raw"], 0u);
  EXPECT_LT(stats->bytes_stored, stats->bytes_raw);
  for (const auto& chunk : index->tensors[1].chunks) EXPECT_EQ(chunk.codec, codec::Codec::kRaw);
  // Every data file got a share.
  for (uint64_t size : sizes) EXPECT_GT(size, 0u);
}

TEST_F(WriterTest, RawChunksHoldTheTensorBytesAtTheirOffsets) {
  std::vector<HostTensor> tensors = {Noise("n", 10000)};
  WriterOptions options;
  options.chunk_bytes = 1000;
  options.num_data_files = 2;
  options.compression.kind = CompressionKind::kNone;
  ASSERT_TRUE(WriteCheckpointFiles(*fs_, dir_, tensors, {}, options).ok());
  Result<Index> index = ReadIndex(2);
  ASSERT_TRUE(index.ok());
  const std::vector<uint8_t> files[] = {ReadFileBytes(dir_ + "/" + DataFileName(0, 2)),
                                        ReadFileBytes(dir_ + "/" + DataFileName(1, 2))};
  const auto* raw = static_cast<const uint8_t*>(tensors[0].data);
  for (const ChunkEntry& c : index->tensors[0].chunks) {
    ASSERT_EQ(c.codec, codec::Codec::kRaw);
    ASSERT_LE(c.file_offset + c.stored_bytes, files[c.file_index].size());
    EXPECT_EQ(
        std::memcmp(files[c.file_index].data() + c.file_offset, raw + c.tensor_offset, c.raw_bytes),
        0);
    EXPECT_EQ(c.xxh3, codec::Checksum({raw + c.tensor_offset, c.raw_bytes}));
  }
  EXPECT_EQ(files[0].size() + files[1].size(), 10000u);
}

TEST_F(WriterTest, NoTensorsStillWritesEveryFile) {
  WriterOptions options;
  options.num_data_files = 2;
  Result<WriteStats> stats = WriteCheckpointFiles(*fs_, dir_, {}, {}, options);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->chunks, 0u);
  EXPECT_EQ(FilesInDir(), 3u);
  Result<Index> index = ReadIndex(2);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_TRUE(index->tensors.empty());
}

TEST_F(WriterTest, ODirectFilesHoldExactlyTheirChunks) {
  std::vector<HostTensor> tensors = {Noise("n", 3 * (1 << 20) + 12345), Floats("f", 777)};
  WriterOptions options;
  options.chunk_bytes = 300000;
  options.num_data_files = 2;
  options.use_o_direct = true;
  Result<WriteStats> stats = WriteCheckpointFiles(*fs_, dir_, tensors, {}, options);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  Result<Index> index = ReadIndex(2);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  const std::vector<uint64_t> sizes = DataFileSizes(2);
  EXPECT_EQ(sizes[0] + sizes[1], stats->bytes_stored);  // padding trimmed
  const std::vector<uint8_t> file0 = ReadFileBytes(dir_ + "/" + DataFileName(0, 2));
  const auto* raw = static_cast<const uint8_t*>(tensors[0].data);
  for (const ChunkEntry& c : index->tensors[0].chunks) {
    if (c.file_index != 0) continue;
    EXPECT_EQ(std::memcmp(file0.data() + c.file_offset, raw + c.tensor_offset, c.raw_bytes), 0);
  }
}

TEST_F(WriterTest, DataFileAppenderHandsOutBackToBackOffsets) {
  for (bool direct : {false, true}) {
    const std::string path = dir_ + "/appender-" + std::to_string(direct);
    Result<std::unique_ptr<DataFileAppender>> file = DataFileAppender::Open(*fs_, path, direct);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    std::vector<uint8_t> expected;
    std::mt19937 rng(1);
    for (size_t n : {1u, 4095u, 4097u, 0u, 1u << 20, 3u, (1u << 20) + 17}) {
      std::vector<uint8_t> bytes(n);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      uint64_t offset = 0;
      ASSERT_TRUE((*file)->append(bytes, &offset).ok());
      EXPECT_EQ(offset, expected.size());
      expected.insert(expected.end(), bytes.begin(), bytes.end());
    }
    ASSERT_TRUE((*file)->finish().ok());
    EXPECT_EQ((*file)->size(), expected.size());
    EXPECT_EQ(ReadFileBytes(path), expected)
        << "direct " << direct << " (is_direct " << (*file)->is_direct() << ")";
  }
}

TEST_F(WriterTest, WriteFailureIsIOErrorNamingFileTensorAndChunk) {
  io::FaultInjectionFileSystem faulty(fs_.get());
  faulty.fail_ops_matching("data-00001-of-00002", ENOSPC, io::FaultOp::kWrite);
  std::vector<HostTensor> tensors = {Noise("n", 10000)};
  WriterOptions options;
  options.chunk_bytes = 1000;
  Result<WriteStats> stats = WriteCheckpointFiles(faulty, dir_, tensors, {}, options);
  EXPECT_EQ(stats.status().code(), StatusCode::kIOError);
  EXPECT_THAT(stats.status().message(), HasSubstr("data-00001-of-00002"));
  EXPECT_THAT(stats.status().message(), HasSubstr("tensor 'n' chunk 1"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/index"));
}

TEST_F(WriterTest, SyncFailureIsIOError) {
  io::FaultInjectionFileSystem faulty(fs_.get());
  faulty.fail_ops_matching("data-00000", EIO, io::FaultOp::kSync);
  std::vector<HostTensor> tensors = {Floats("f", 1000)};
  Result<WriteStats> stats = WriteCheckpointFiles(faulty, dir_, tensors, {}, {});
  EXPECT_EQ(stats.status().code(), StatusCode::kIOError);
  EXPECT_THAT(stats.status().message(), HasSubstr("data-00000-of-00002"));
}

TEST_F(WriterTest, IndexWriteFailureIsIOError) {
  io::FaultInjectionFileSystem faulty(fs_.get());
  faulty.fail_ops_matching("/index", EIO, io::FaultOp::kWrite);
  std::vector<HostTensor> tensors = {Floats("f", 1000)};
  Result<WriteStats> stats = WriteCheckpointFiles(faulty, dir_, tensors, {}, {});
  EXPECT_EQ(stats.status().code(), StatusCode::kIOError);
  EXPECT_THAT(stats.status().message(), HasSubstr("index"));
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
