#include "asyncckpt/reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <list>
#include <random>
#include <thread>

#include "asyncckpt/file_system.h"
#include "src/format/format.h"
#include "src/format/writer.h"
#include "src/state/checkpoint_state.h"
#include "src/util/log.h"
#include "tests/support/files.h"

namespace asyncckpt {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;
using testing_support::ReadFileBytes;
using testing_support::WriteFile;

// A device whose memory is ordinary host memory but which the reader must treat as a device:
// restore has to go through allocate_pinned and copy_from_host.
class FakeDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return "fake:0"; }
  Result<PinnedBuffer> allocate_pinned(size_t bytes) override {
    void* data = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (data == nullptr) return Status::Internal("out of memory");
    return PinnedBuffer(data, bytes, [](void* p) { std::free(p); });
  }
  Result<std::unique_ptr<CopyFence>> copy_to_host_async(const void*, void*, size_t) override {
    return Status::Unavailable("the fake device only restores");
  }
  Status copy_from_host(const void* host_src, void* device_dst, size_t bytes) override {
    std::memcpy(device_dst, host_src, bytes);
    ++copies;
    return Status::OK();
  }
  int copies = 0;
};

class ReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/reader_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/model.ckpt-5";
    std::filesystem::create_directory(dir_);
    fs_ = io::NewPosixFileSystem();
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Bytes for `count` elements of `dtype`: smooth for floats (compressible), random otherwise.
  format::HostTensor Make(const std::string& name, DType dtype, std::vector<int64_t> shape) {
    const int64_t count = NumElements(shape);
    const size_t bytes = static_cast<size_t>(count) * DTypeSize(dtype);
    auto& storage = buffers_.emplace_back(bytes);
    std::mt19937 rng(static_cast<uint32_t>(bytes + static_cast<size_t>(dtype)));
    for (size_t i = 0; i < bytes; ++i) {
      // Every other element block repeats so that some chunks compress and some do not.
      storage[i] = (i / 2048) % 2 == 0 ? static_cast<uint8_t>(i / 64) : static_cast<uint8_t>(rng());
    }
    if (dtype == DType::kBool) {
      for (auto& b : storage) b &= 1;
    }
    return format::HostTensor{name, dtype, std::move(shape), storage.data(), bytes};
  }

  void Write(const std::vector<format::HostTensor>& tensors, uint64_t chunk_bytes = 1000,
             uint32_t files = 3) {
    format::WriterOptions options;
    options.chunk_bytes = chunk_bytes;
    options.num_data_files = files;
    CheckpointMetadata metadata{5, 123.5, {{"model", "test"}}};
    Result<format::WriteStats> stats = WriteCheckpointFiles(*fs_, dir_, tensors, metadata, options);
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  }

  std::unique_ptr<CheckpointReader> OpenOrDie() {
    Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_, Posix());
    EXPECT_TRUE(reader.ok()) << reader.status().ToString();
    return reader.ok() ? std::move(reader).value() : nullptr;
  }

  static ReaderOptions Posix() {
    ReaderOptions options;
    options.force_posix = true;
    return options;
  }

  format::Index ParsedIndex() {
    const std::vector<uint8_t> bytes = ReadFileBytes(dir_ + "/index");
    Result<format::Index> index = format::ParseIndex(bytes, "index");
    EXPECT_TRUE(index.ok()) << index.status().ToString();
    return index.ok() ? *index : format::Index{};
  }

  const format::TensorEntry& Entry(const format::Index& index, const std::string& name) {
    for (const auto& t : index.tensors) {
      if (t.name == name) return t;
    }
    ADD_FAILURE() << "no tensor " << name;
    return index.tensors.front();
  }

  // Flips one bit in the middle of chunk `chunk` of tensor `name`; returns its data file's name.
  std::string FlipBitIn(const std::string& name, size_t chunk) {
    const format::Index index = ParsedIndex();
    const format::ChunkEntry& c = Entry(index, name).chunks.at(chunk);
    const std::string file = format::DataFileName(c.file_index, index.num_data_files);
    std::vector<uint8_t> bytes = ReadFileBytes(dir_ + "/" + file);
    bytes.at(c.file_offset + c.stored_bytes / 2) ^= 0x10;
    WriteFile(dir_ + "/" + file, bytes);
    return file;
  }

  std::string root_;
  std::string dir_;
  std::unique_ptr<io::FileSystem> fs_;
  std::list<std::vector<uint8_t>> buffers_;
};

TEST_F(ReaderTest, EveryDTypeRoundTripsAcrossSeveralDataFiles) {
  std::vector<format::HostTensor> tensors;
  for (DType dtype : kAllDTypes) {
    // 1037 elements: neither a multiple of the chunk size nor of 8.
    tensors.push_back(Make("t_" + std::string(DTypeName(dtype)), dtype, {1037}));
  }
  Write(tensors, 1000, 3);
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->num_data_files(), 3u);
  EXPECT_EQ(reader->metadata().step, 5);
  EXPECT_EQ(reader->metadata().user.at("model"), "test");
  for (const format::HostTensor& t : tensors) {
    const TensorInfo* info = reader->find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    EXPECT_EQ(info->dtype, t.dtype);
    EXPECT_EQ(info->shape, t.shape);
    EXPECT_EQ(info->bytes, t.bytes);
    std::vector<uint8_t> back(t.bytes, 0xEE);
    ASSERT_TRUE(reader->read(t.name, back.data(), back.size()).ok()) << t.name;
    EXPECT_EQ(std::memcmp(back.data(), t.data, t.bytes), 0) << t.name;
  }
}

TEST_F(ReaderTest, TensorsAreListedInNameOrderWithCodecCounts) {
  Write({Make("zeta", DType::kF32, {3000}), Make("alpha", DType::kU8, {10}),
         Make("mid", DType::kI64, {0})});
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);
  const std::vector<TensorInfo>& infos = reader->tensors();
  ASSERT_THAT(infos, SizeIs(3));
  EXPECT_EQ(infos[0].name, "alpha");
  EXPECT_EQ(infos[1].name, "mid");
  EXPECT_EQ(infos[2].name, "zeta");
  EXPECT_EQ(infos[1].num_chunks, 0u);
  EXPECT_EQ(infos[2].num_chunks, 12u);  // 12000 bytes in 1000-byte chunks
  uint64_t counted = 0;
  for (const auto& [codec, n] : infos[2].chunks_by_codec) counted += n;
  EXPECT_EQ(counted, infos[2].num_chunks);
  EXPECT_GT(infos[2].chunks_by_codec.count("shuffle+zstd"), 0u);
  EXPECT_GT(infos[2].chunks_by_codec.count("raw"), 0u);
  EXPECT_LT(infos[2].stored_bytes, infos[2].bytes);
}

TEST_F(ReaderTest, EmptyTensorsAndScalarsRoundTrip) {
  format::HostTensor scalar = Make("scalar", DType::kF64, {});
  format::HostTensor empty = Make("empty", DType::kF32, {4, 0, 3});
  Write({scalar, empty});
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);
  double value = 0;
  ASSERT_TRUE(reader->read("scalar", &value, sizeof(value)).ok());
  EXPECT_EQ(std::memcmp(&value, scalar.data, sizeof(value)), 0);
  EXPECT_TRUE(reader->read("empty", nullptr, 0).ok());
  EXPECT_EQ(reader->find("empty")->shape, (std::vector<int64_t>{4, 0, 3}));
}

TEST_F(ReaderTest, ReadsIntoXarrayCheckingTheDType) {
  std::vector<float> values(2 * 3 * 500);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(static_cast<float>(i));
  Write({format::HostTensor{"w", DType::kF32, {2, 3, 500}, values.data(), values.size() * 4}});
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);
  Result<xt::xarray<float>> array = reader->read_xarray<float>("w");
  ASSERT_TRUE(array.ok()) << array.status().ToString();
  EXPECT_EQ(array->shape(), (std::vector<size_t>{2, 3, 500}));
  EXPECT_EQ((*array)(1, 2, 499), values.back());
  EXPECT_EQ((*array)(0, 1, 7), values[500 + 7]);
  Result<xt::xarray<double>> wrong = reader->read_xarray<double>("w");
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reader->read_xarray<float>("nope").status().code(), StatusCode::kNotFound);
}

// Retention may delete a checkpoint while a reader has it open: the reader holds every file
// from Open(), so it goes on reading the bytes it opened.
TEST_F(ReaderTest, OpenReaderKeepsReadingAfterTheCheckpointIsDeleted) {
  format::HostTensor tensor = Make("a", DType::kF32, {5000});
  Write({tensor}, 1000, 2);
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);
  std::filesystem::remove_all(dir_);
  std::vector<uint8_t> out(tensor.bytes);
  ASSERT_TRUE(reader->read("a", out.data(), out.size()).ok());
  EXPECT_EQ(std::memcmp(out.data(), tensor.data, tensor.bytes), 0);
  EXPECT_TRUE(reader->verify().problems.empty());
}

TEST_F(ReaderTest, ReadRejectsWrongSizeAndUnknownName) {
  Write({Make("a", DType::kI32, {100})});
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);
  std::vector<uint8_t> dst(399);
  Status status = reader->read("a", dst.data(), dst.size());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'a'"));
  EXPECT_EQ(reader->read("b", dst.data(), dst.size()).code(), StatusCode::kNotFound);
}

TEST_F(ReaderTest, RestoreFillsHostAndDeviceTensors) {
  format::HostTensor a = Make("a", DType::kF32, {700});
  format::HostTensor b = Make("b", DType::kU16, {3, 333});
  format::HostTensor c = Make("c", DType::kBF16, {5});
  Write({a, b, c});
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);

  auto device = std::make_shared<FakeDevice>();
  std::vector<uint8_t> host_a(a.bytes), device_b(b.bytes), host_c(c.bytes);
  TensorRegistry registry;
  ASSERT_TRUE(registry.add({"a", DType::kF32, {700}, host_a.data(), host_a.size(), nullptr}).ok());
  ASSERT_TRUE(
      registry.add({"b", DType::kU16, {3, 333}, device_b.data(), device_b.size(), device}).ok());
  ASSERT_TRUE(
      registry.add({"c", DType::kBF16, {5}, host_c.data(), host_c.size(), HostDevice()}).ok());
  ASSERT_TRUE(reader->restore(registry).ok());
  EXPECT_EQ(std::memcmp(host_a.data(), a.data, a.bytes), 0);
  EXPECT_EQ(std::memcmp(device_b.data(), b.data, b.bytes), 0);
  EXPECT_EQ(std::memcmp(host_c.data(), c.data, c.bytes), 0);
  EXPECT_EQ(device->copies, 1);
}

TEST_F(ReaderTest, RestoreRejectsMismatchesBeforeWritingAnything) {
  Write({Make("a", DType::kF32, {10}), Make("b", DType::kF32, {2, 5})});
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);
  std::vector<uint8_t> a(40, 0xAA), b(40, 0xBB), c(4, 0xCC);
  TensorRegistry registry;
  ASSERT_TRUE(registry.add({"a", DType::kI32, {10}, a.data(), a.size(), nullptr}).ok());
  ASSERT_TRUE(registry.add({"b", DType::kF32, {5, 2}, b.data(), b.size(), nullptr}).ok());
  ASSERT_TRUE(registry.add({"c", DType::kF32, {}, c.data(), c.size(), nullptr}).ok());
  Status status = reader->restore(registry);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("tensor 'a' is i32 in the registry but f32"));
  EXPECT_THAT(status.message(),
              HasSubstr("tensor 'b' has shape [5, 2] in the registry but [2, 5]"));
  EXPECT_THAT(status.message(), HasSubstr("tensor 'c' is not in the checkpoint"));
  EXPECT_EQ(a, std::vector<uint8_t>(40, 0xAA));
  EXPECT_EQ(b, std::vector<uint8_t>(40, 0xBB));
}

TEST_F(ReaderTest, MissingDirectoryOrIndexIsNotFound) {
  Result<std::unique_ptr<CheckpointReader>> none = CheckpointReader::Open(root_ + "/nope", Posix());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  Result<std::unique_ptr<CheckpointReader>> no_index = CheckpointReader::Open(dir_, Posix());
  EXPECT_EQ(no_index.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(no_index.status().message(), HasSubstr(dir_ + "/index"));
}

TEST_F(ReaderTest, DamagedIndexIsCorruptionNamingIt) {
  Write({Make("a", DType::kF32, {10})});
  std::vector<uint8_t> bytes = ReadFileBytes(dir_ + "/index");
  bytes[bytes.size() / 2] ^= 1;
  WriteFile(dir_ + "/index", bytes);
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_, Posix());
  EXPECT_EQ(reader.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(reader.status().message(), HasSubstr(dir_ + "/index"));
  EXPECT_THAT(reader.status().message(), HasSubstr("checksum"));
}

TEST_F(ReaderTest, MissingDataFileIsCorruptionNamingFileTensorAndChunk) {
  Write({Make("a", DType::kF32, {1000})}, 1000, 2);
  std::filesystem::remove(dir_ + "/data-00001-of-00002");
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_, Posix());
  EXPECT_EQ(reader.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(reader.status().message(), HasSubstr("data-00001-of-00002 is missing"));
  EXPECT_THAT(reader.status().message(), HasSubstr("tensor 'a' chunk 1"));
}

TEST_F(ReaderTest, TruncatedDataFileIsCorruptionNamingFileTensorAndChunk) {
  Write({Make("a", DType::kF32, {1000})}, 1000, 2);
  const std::string file = dir_ + "/data-00000-of-00002";
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 1);
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_, Posix());
  EXPECT_EQ(reader.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(reader.status().message(), HasSubstr("data-00000-of-00002"));
  EXPECT_THAT(reader.status().message(), HasSubstr("tensor 'a' chunk"));
}

TEST_F(ReaderTest, FlippedBitInChunkIsCorruptionNamingFileTensorAndChunk) {
  Write({Make("a", DType::kF32, {1000}), Make("b", DType::kF32, {1000})}, 1000, 2);
  const std::string file = FlipBitIn("a", 2);
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);
  std::vector<uint8_t> dst(4000);
  Status status = reader->read("a", dst.data(), dst.size());
  EXPECT_EQ(status.code(), StatusCode::kCorruption);
  EXPECT_THAT(status.message(), HasSubstr(file));
  EXPECT_THAT(status.message(), HasSubstr("tensor 'a' chunk 2"));
  // The undamaged tensor still reads.
  EXPECT_TRUE(reader->read("b", dst.data(), dst.size()).ok());
}

TEST_F(ReaderTest, VerifyReportsEveryDamagedChunk) {
  Write({Make("a", DType::kF32, {1000}), Make("b", DType::kU8, {5000}),
         Make("c", DType::kF64, {300})},
        1000, 3);
  {
    std::unique_ptr<CheckpointReader> reader = OpenOrDie();
    ASSERT_NE(reader, nullptr);
    VerifyReport clean = reader->verify();
    EXPECT_THAT(clean.problems, SizeIs(0));
    EXPECT_EQ(clean.chunks_checked, 4u + 5u + 3u);
    EXPECT_EQ(clean.bytes_checked, 4000u + 5000u + 2400u);
  }
  const std::string file_a = FlipBitIn("a", 0);
  const std::string file_b = FlipBitIn("b", 3);
  const std::string file_c = FlipBitIn("c", 2);
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);
  VerifyReport report = reader->verify();
  ASSERT_THAT(report.problems, SizeIs(3));
  EXPECT_THAT(report.problems[0], HasSubstr(file_a));
  EXPECT_THAT(report.problems[0], HasSubstr("tensor 'a' chunk 0"));
  EXPECT_THAT(report.problems[1], HasSubstr(file_b));
  EXPECT_THAT(report.problems[1], HasSubstr("tensor 'b' chunk 3"));
  EXPECT_THAT(report.problems[2], HasSubstr(file_c));
  EXPECT_THAT(report.problems[2], HasSubstr("tensor 'c' chunk 2"));
  EXPECT_EQ(report.chunks_checked, 12u);
}

TEST_F(ReaderTest, ConcurrentReadsAgree) {
  std::vector<format::HostTensor> tensors;
  for (int i = 0; i < 4; ++i) tensors.push_back(Make("t" + std::to_string(i), DType::kF32, {5000}));
  Write(tensors, 4096, 2);
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);
  std::vector<std::thread> threads;
  std::vector<int> ok(tensors.size(), 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    threads.emplace_back([&, i] {
      std::vector<uint8_t> dst(tensors[i].bytes);
      for (int round = 0; round < 5; ++round) {
        if (!reader->read(tensors[i].name, dst.data(), dst.size()).ok()) return;
        if (std::memcmp(dst.data(), tensors[i].data, dst.size()) != 0) return;
      }
      ok[i] = 1;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, std::vector<int>(tensors.size(), 1));
}

TEST_F(ReaderTest, DefaultBackendReadsTheSameBytes) {
  format::HostTensor a = Make("a", DType::kF32, {3000});
  Write({a});
  std::vector<std::string> logged;
  auto previous = SetLogSink([&](std::string_view line) { logged.emplace_back(line); });
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_);
  SetLogSink(previous);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<uint8_t> dst(a.bytes);
  ASSERT_TRUE((*reader)->read("a", dst.data(), dst.size()).ok());
  EXPECT_EQ(std::memcmp(dst.data(), a.data, a.bytes), 0);
  EXPECT_LE(logged.size(), 1u);  // at most the one fallback line
}

TEST_F(ReaderTest, OpenLatestFollowsTheStateFile) {
  format::HostTensor a = Make("a", DType::kF32, {10});
  Write({a});
  CheckpointState state;
  state.model_checkpoint_path = "model.ckpt-5";
  state.all_model_checkpoint_paths = {"model.ckpt-5"};
  ASSERT_TRUE(WriteCheckpointState(*fs_, root_, state).ok());
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::OpenLatest(root_, Posix());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->metadata().step, 5);
  EXPECT_EQ(CheckpointReader::OpenLatest(dir_, Posix()).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace asyncckpt
