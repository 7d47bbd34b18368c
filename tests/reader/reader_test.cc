#include "asyncckpt/reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <list>
#include <random>
#include <thread>

#include "asyncckpt/file_system.h"
#include "asyncckpt/xtensor.h"
#include "io/fault_injection_file_system.h"
#include "src/codec/bounded_verify.h"
#include "src/format/format.h"
#include "src/format/writer.h"
#include "src/state/checkpoint_state.h"
#include "src/util/log.h"
#include "tests/support/checkpoint_files.h"
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

// One zstd frame of `bytes` zeros, compressed a MiB at a time so that no buffer of `bytes` is
// needed, and the XXH3-64 of those zeros.
struct ZeroFrame {
  std::vector<uint8_t> frame;
  uint64_t xxh3 = 0;
};

ZeroFrame CompressZeros(uint64_t bytes) {
  const std::vector<uint8_t> zeros(std::min<uint64_t>(bytes, 1 << 20), 0);
  std::vector<uint8_t> out(ZSTD_CStreamOutSize());
  ZeroFrame result;
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setPledgedSrcSize(cctx, bytes);
  XXH3_state_t* hash = XXH3_createState();
  XXH3_64bits_reset(hash);
  for (uint64_t done = 0; done < bytes;) {
    const size_t piece = static_cast<size_t>(std::min<uint64_t>(zeros.size(), bytes - done));
    XXH3_64bits_update(hash, zeros.data(), piece);
    done += piece;
    const ZSTD_EndDirective mode = done == bytes ? ZSTD_e_end : ZSTD_e_continue;
    ZSTD_inBuffer in{zeros.data(), piece, 0};
    size_t left = 0;
    do {
      ZSTD_outBuffer o{out.data(), out.size(), 0};
      left = ZSTD_compressStream2(cctx, &o, &in, mode);
      EXPECT_FALSE(ZSTD_isError(left)) << ZSTD_getErrorName(left);
      if (ZSTD_isError(left)) break;
      result.frame.insert(result.frame.end(), out.data(), out.data() + o.pos);
    } while (mode == ZSTD_e_end ? left != 0 : in.pos < in.size);
  }
  result.xxh3 = XXH3_64bits_digest(hash);
  XXH3_freeState(hash);
  ZSTD_freeCCtx(cctx);
  return result;
}

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
    testing_support::WriterOptions options;
    options.chunk_bytes = chunk_bytes;
    options.num_data_files = files;
    CheckpointMetadata metadata{5, 123.5, {{"model", "test"}}};
    Result<testing_support::WriteStats> stats =
        testing_support::WriteCheckpointFiles(*fs_, dir_, tensors, metadata, options);
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  }

  std::unique_ptr<CheckpointReader> OpenOrDie() {
    Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_, Posix());
    EXPECT_TRUE(reader.ok()) << reader.status().ToString();
    return reader.ok() ? std::move(reader).value() : nullptr;
  }

  static ReaderOptions Posix() {
    ReaderOptions options;
    options.force_posix_io = true;
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

  // Writes a checkpoint by hand: one data file holding `data`, and an index with one u8 tensor
  // "w" made of `chunks` (each of the given codec and checksum) as the caller lays them out.
  void WriteByHand(const std::vector<uint8_t>& data,
                   const std::vector<format::ChunkEntry>& chunks) {
    format::Index index;
    index.metadata = CheckpointMetadata{5, 1.5, {}};
    index.num_data_files = 1;
    format::TensorEntry tensor = format::WholeTensorEntry("w", DType::kU8, {0}, 0, chunks);
    for (const format::ChunkEntry& chunk : chunks) tensor.bytes += chunk.raw_bytes;
    tensor.shape = {static_cast<int64_t>(tensor.bytes)};
    index.tensors.push_back(tensor);
    WriteFile(dir_ + "/" + format::DataFileName(0, 1), data);
    WriteFile(dir_ + "/index", format::EncodeIndex(index));
  }

  // A chunk of `frame` (stored at `file_offset`) that claims `raw_bytes` of zeros.
  static format::ChunkEntry ZeroChunk(uint64_t tensor_offset, uint64_t file_offset,
                                      const ZeroFrame& frame, uint64_t raw_bytes) {
    return format::ChunkEntry{tensor_offset,      0,         file_offset,
                              frame.frame.size(), raw_bytes, codec::Codec::kZstd,
                              frame.xxh3};
  }

  uint64_t BytesOnDisk() {
    uint64_t total = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) total += entry.file_size();
    return total;
  }

  std::string root_;
  std::string dir_;
  std::unique_ptr<io::FileSystem> fs_;
  std::list<std::vector<uint8_t>> buffers_;
};

// ---- bounds: what a hostile index may claim --------------------------------------------------

// Issue 8's hostile checkpoint: about 33 KiB on disk, one zstd frame of 1 GiB of zeros, and a
// tensor of 16 chunks that all point at it, claiming 16 GiB. Each chunk alone is within the
// decompression ratio; together they share stored bytes, which the writer never does.
TEST_F(ReaderTest, OpenRefusesChunksThatShareOneFrameBeforeAllocatingTheirClaim) {
  const ZeroFrame frame = CompressZeros(1ull << 30);
  ASSERT_LT(frame.frame.size(), 40u << 10);
  std::vector<format::ChunkEntry> chunks;
  for (uint64_t i = 0; i < 16; ++i) chunks.push_back(ZeroChunk(i << 30, 0, frame, 1ull << 30));
  WriteByHand(frame.frame, chunks);
  EXPECT_LT(BytesOnDisk(), 44u << 10);
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_, Posix());
  ASSERT_FALSE(reader.ok()) << "a " << BytesOnDisk() << "-byte checkpoint claims 16 GiB";
  EXPECT_EQ(reader.status().code(), StatusCode::kCorruption) << reader.status().ToString();
  EXPECT_THAT(reader.status().message(),
              HasSubstr("tensor 'w' chunk 0 and tensor 'w' chunk 1 share stored bytes [0, " +
                        std::to_string(frame.frame.size()) + ") of data-00000-of-00001"));
  EXPECT_THAT(reader.status().message(), HasSubstr(dir_ + "/index"));
}

// Issue 19's bomb: distinct frames, each 1 GiB of zeros in about 33 KiB, each chunk within the
// ratio and alone in its bytes, so the checkpoint opens. verify() once decoded every chunk
// whole (2.1 GB of memory for 16 of them); it now checks each through small windows.
TEST_F(ReaderTest, VerifyOfValidLookingBombsTakesBoundedMemory) {
  constexpr uint64_t kGiB = 1ull << 30;
  const ZeroFrame frame = CompressZeros(kGiB);
  std::vector<uint8_t> data;
  std::vector<format::ChunkEntry> chunks;
  for (uint64_t i = 0; i < 4; ++i) {
    chunks.push_back(ZeroChunk(i * kGiB, data.size(), frame, kGiB));
    data.insert(data.end(), frame.frame.begin(), frame.frame.end());
  }
  WriteByHand(data, chunks);
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);
  struct rusage before, after;
  ::getrusage(RUSAGE_SELF, &before);
  const VerifyReport report = reader->verify();
  ::getrusage(RUSAGE_SELF, &after);
  EXPECT_THAT(report.problems, SizeIs(0));
  EXPECT_EQ(report.bytes_checked, 4 * kGiB);
  // docs/format.md quotes this figure (D9 of issue 31: it said ~11 MiB where a whole `verify`
  // process peaked at 15.7 to 25 MiB; this is what verify itself adds).
  const long added_kib = after.ru_maxrss - before.ru_maxrss;
  std::fprintf(stderr, "verify of 4 x 1 GiB zstd bombs: peak memory +%ld KiB\n", added_kib);
  EXPECT_LT(added_kib, 32 * 1024) << "KiB of peak memory added";
}

TEST_F(ReaderTest, OpenRefusesAChunkClaimingMoreThanItsFrameCanDecodeTo) {
  // 4 MiB of zeros take about 150 bytes; the chunk claims 1 GiB (the largest chunk) from them.
  const ZeroFrame frame = CompressZeros(4ull << 20);
  WriteByHand(frame.frame, {ZeroChunk(0, 0, frame, 1ull << 30)});
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_, Posix());
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), StatusCode::kCorruption) << reader.status().ToString();
  EXPECT_THAT(reader.status().message(),
              HasSubstr("tensor 'w' chunk 0 claims 1073741824 raw bytes from " +
                        std::to_string(frame.frame.size()) + " stored bytes of zstd"));
}

TEST_F(ReaderTest, AFrameDeclaringAnotherSizeThanItsChunkIsCorruptionAtRead) {
  // Within the ratio and alone in its file, but the frame's header says 4 MiB, not 4.5.
  const ZeroFrame frame = CompressZeros(4ull << 20);
  WriteByHand(frame.frame, {ZeroChunk(0, 0, frame, 4608ull << 10)});
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);
  std::vector<uint8_t> out(4608ull << 10);
  Status status = reader->read("w", out.data(), out.size());
  EXPECT_EQ(status.code(), StatusCode::kCorruption);
  EXPECT_THAT(status.message(),
              HasSubstr("declares 4194304 decoded bytes, the index says 4718592"));
  EXPECT_THAT(status.message(), HasSubstr("tensor 'w' chunk 0"));
}

// Adam's moments are all zeros at step 0 and compress about as well as anything can: 64 MiB
// chunks of zeros reach a ratio of about 32470, within 1% of the bound. They must still open,
// read and restore, with both zstd codecs.
TEST_F(ReaderTest, AllZeroTensorsInLargeChunksOpenAndRestore) {
  constexpr uint64_t kBytes = 64ull << 20;
  std::vector<uint8_t> zeros_m(kBytes, 0), zeros_v(kBytes, 0);
  for (CompressionKind kind : {CompressionKind::kZstd, CompressionKind::kShuffleZstd}) {
    SCOPED_TRACE(static_cast<int>(kind));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directory(dir_);
    testing_support::WriterOptions options;
    options.chunk_bytes = kBytes;
    options.num_data_files = 1;
    options.compression.kind = kind;
    const std::vector<format::HostTensor> tensors = {
        {"adam_m", DType::kF32, {int64_t{kBytes / 4}}, zeros_m.data(), kBytes},
        {"adam_v", DType::kF32, {int64_t{kBytes / 4}}, zeros_v.data(), kBytes}};
    Result<testing_support::WriteStats> stats = testing_support::WriteCheckpointFiles(
        *fs_, dir_, tensors, CheckpointMetadata{0, 1.0, {}}, options);
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    ASSERT_GT(stats->bytes_raw / stats->bytes_stored, 30000u);  // near the bound indeed
    std::unique_ptr<CheckpointReader> reader = OpenOrDie();
    ASSERT_NE(reader, nullptr);
    EXPECT_TRUE(reader->verify().problems.empty());
    std::vector<uint8_t> m(kBytes, 0xAA), v(kBytes, 0xBB);
    TensorRegistry registry;
    ASSERT_TRUE(
        registry
            .add({"adam_m", DType::kF32, {int64_t{kBytes / 4}}, m.data(), kBytes, nullptr, {}, {}})
            .ok());
    ASSERT_TRUE(
        registry
            .add({"adam_v", DType::kF32, {int64_t{kBytes / 4}}, v.data(), kBytes, nullptr, {}, {}})
            .ok());
    Status restored = reader->restore(registry);
    ASSERT_TRUE(restored.ok()) << restored.ToString();
    EXPECT_EQ(m, zeros_m);
    EXPECT_EQ(v, zeros_v);
  }
}

// Sanitizer allocators abort on a failed allocation instead of throwing std::bad_alloc.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kAllocatorAbortsOnFailure = true;
#else
constexpr bool kAllocatorAbortsOnFailure = false;
#endif

// The current address space of this process in bytes (first field of /proc/self/statm).
uint64_t AddressSpaceBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0;
  statm >> pages;
  return pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// A tensor the bounds allow (1 GiB of zeros in one 32 KiB frame) that this process cannot
// allocate: in a child whose address space is capped at 256 MiB above what it holds,
// ReadXarray must answer ResourceExhausted naming the tensor and its size, not throw.
TEST_F(ReaderTest, ReadXarrayThatCannotAllocateIsResourceExhaustedNotACrash) {
  if (kAllocatorAbortsOnFailure) {
    GTEST_SKIP() << "sanitizer allocators abort on a failed allocation instead of throwing";
  }
  const ZeroFrame frame = CompressZeros(1ull << 30);
  WriteByHand(frame.frame, {ZeroChunk(0, 0, frame, 1ull << 30)});
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);
  // The child runs only ReadXarray, which fails at the allocation before any oneTBB work.
  const pid_t child = fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    // Every way out is an _exit: gtest must not go on running tests in the child.
    try {
      const rlimit limit{AddressSpaceBytes() + (256ull << 20), RLIM_INFINITY};
      if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(10);
      Result<xt::xarray<uint8_t>> array = ReadXarray<uint8_t>(*reader, "w");
      if (array.ok()) _exit(11);
      if (array.status().code() != StatusCode::kResourceExhausted) _exit(12);
      const std::string& message = array.status().message();
      if (message.find("'w'") == std::string::npos ||
          message.find("1073741824 bytes") == std::string::npos) {
        _exit(13);
      }
      _exit(0);
    } catch (...) {
      _exit(14);
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "10: setrlimit failed, 11: the read succeeded, 12: not ResourceExhausted, 13: the "
         "message does not name the tensor and its size, 14: an exception crossed ReadXarray";
}

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
  Result<xt::xarray<float>> array = ReadXarray<float>(*reader, "w");
  ASSERT_TRUE(array.ok()) << array.status().ToString();
  EXPECT_EQ(array->shape(), (std::vector<size_t>{2, 3, 500}));
  EXPECT_EQ((*array)(1, 2, 499), values.back());
  EXPECT_EQ((*array)(0, 1, 7), values[500 + 7]);
  Result<xt::xarray<double>> wrong = ReadXarray<double>(*reader, "w");
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadXarray<float>(*reader, "nope").status().code(), StatusCode::kNotFound);
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
  ASSERT_TRUE(
      registry.add({"a", DType::kF32, {700}, host_a.data(), host_a.size(), nullptr, {}, {}}).ok());
  ASSERT_TRUE(
      registry.add({"b", DType::kU16, {3, 333}, device_b.data(), device_b.size(), device, {}, {}})
          .ok());
  ASSERT_TRUE(
      registry.add({"c", DType::kBF16, {5}, host_c.data(), host_c.size(), HostDevice(), {}, {}})
          .ok());
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
  ASSERT_TRUE(registry.add({"a", DType::kI32, {10}, a.data(), a.size(), nullptr, {}, {}}).ok());
  ASSERT_TRUE(registry.add({"b", DType::kF32, {5, 2}, b.data(), b.size(), nullptr, {}, {}}).ok());
  ASSERT_TRUE(registry.add({"c", DType::kF32, {}, c.data(), c.size(), nullptr, {}, {}}).ok());
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
  Result<std::unique_ptr<CheckpointReader>> empty = CheckpointReader::Open("", Posix());
  EXPECT_EQ(empty.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(empty.status().message(), "no checkpoint at ''");
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

TEST_F(ReaderTest, VerifyChecksAChunkLargerThanTheStreamingBoundThroughSmallWindows) {
  // One shuffle+zstd chunk of 24 MiB: verify takes the streaming path (codec::VerifyStreaming).
  constexpr int64_t kElements = 6 << 20;
  static_assert(kElements * 4 > static_cast<int64_t>(codec::kStreamingVerifyBytes));
  Write({Make("big", DType::kF32, {kElements})}, uint64_t{kElements} * 4, 1);
  {
    std::unique_ptr<CheckpointReader> reader = OpenOrDie();
    ASSERT_NE(reader, nullptr);
    VerifyReport clean = reader->verify();
    EXPECT_THAT(clean.problems, SizeIs(0));
    EXPECT_EQ(clean.chunks_checked, 1u);
  }
  const std::string file = FlipBitIn("big", 0);
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);
  VerifyReport report = reader->verify();
  ASSERT_THAT(report.problems, SizeIs(1));
  EXPECT_THAT(report.problems[0], HasSubstr(file));
  EXPECT_THAT(report.problems[0], HasSubstr("tensor 'big' chunk 0"));
}

TEST_F(ReaderTest, ConcurrentReadsAgree) {
  std::vector<format::HostTensor> tensors;
  for (int i = 0; i < 4; ++i) {
    std::string name = "t";  // appended: GCC 12 -O3 -Wrestrict false positive on "t" + string&&
    name += std::to_string(i);
    tensors.push_back(Make(name, DType::kF32, {5000}));
  }
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
  auto previous = SetLogSink([&](LogLevel, std::string_view line) { logged.emplace_back(line); });
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_);
  SetLogSink(previous);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<uint8_t> dst(a.bytes);
  ASSERT_TRUE((*reader)->read("a", dst.data(), dst.size()).ok());
  EXPECT_EQ(std::memcmp(dst.data(), a.data, a.bytes), 0);
  EXPECT_LE(logged.size(), 2u);  // at most the io_uring and the O_DIRECT fallback lines
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

// ---- streaming restore -------------------------------------------------------------------------

// Host buffers for a registry, 4096-aligned so that O_DIRECT can read raw chunks in place.
class AlignedBuffers {
 public:
  uint8_t* Get(size_t bytes) {
    void* data = std::aligned_alloc(4096, std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096));
    buffers_.emplace_back(static_cast<uint8_t*>(data));
    std::memset(data, 0xEE, bytes);
    return static_cast<uint8_t*>(data);
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<uint8_t, Free>> buffers_;
};

struct StreamingCase {
  bool o_direct;
  unsigned queue_depth;
  bool posix = true;  // false: the default backend, io_uring (and its IoQueue) where it works
};

class StreamingRestoreTest : public ReaderTest,
                             public ::testing::WithParamInterface<StreamingCase> {
 protected:
  ReaderOptions Options() const {
    ReaderOptions options;
    options.force_posix_io = GetParam().posix;
    options.use_o_direct = GetParam().o_direct;
    options.queue_depth = GetParam().queue_depth;
    options.read_buffer_bytes = 1 << 20;  // small, so that the budget, not the depth, binds too
    return options;
  }

  // Forty tensors of mixed dtypes and sizes over three data files, in chunks of 4096 bytes:
  // raw and compressed chunks, aligned and not, many to one extent.
  std::vector<format::HostTensor> ManyTensors() {
    std::vector<format::HostTensor> tensors;
    const DType dtypes[] = {DType::kF32, DType::kU8, DType::kF64, DType::kI16};
    for (int i = 0; i < 40; ++i) {
      const int64_t elements = 1 + (i * 7919) % 20000;
      std::string name = "t";  // appended: GCC 12 -O3 -Wrestrict false positive on "t" + string&&
      name += std::to_string(100 + i);
      tensors.push_back(Make(name, dtypes[i % 4], {elements}));
    }
    return tensors;
  }

  Status RestoreInto(CheckpointReader& reader, const std::vector<format::HostTensor>& tensors,
                     AlignedBuffers& buffers, std::vector<uint8_t*>* out) {
    TensorRegistry registry;
    for (const format::HostTensor& t : tensors) {
      out->push_back(buffers.Get(t.bytes));
      Status added =
          registry.add({t.name, t.dtype, t.shape, out->back(), t.bytes, nullptr, {}, {}});
      if (!added.ok()) return added;
    }
    return reader.restore(registry);
  }
};

TEST_P(StreamingRestoreTest, RestoresManyChunksAcrossFilesByteForByte) {
  const std::vector<format::HostTensor> tensors = ManyTensors();
  testing_support::WriterOptions options;
  options.chunk_bytes = 4096;
  options.num_data_files = 3;
  options.compression.kind = CompressionKind::kShuffleZstd;
  options.use_o_direct = GetParam().o_direct;
  ASSERT_TRUE(testing_support::WriteCheckpointFiles(*fs_, dir_, tensors,
                                                    CheckpointMetadata{5, 1.0, {}}, options)
                  .ok());
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_, Options());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  AlignedBuffers buffers;
  std::vector<uint8_t*> out;
  Status status = RestoreInto(**reader, tensors, buffers, &out);
  ASSERT_TRUE(status.ok()) << status.ToString();
  for (size_t i = 0; i < tensors.size(); ++i) {
    ASSERT_EQ(std::memcmp(out[i], tensors[i].data, tensors[i].bytes), 0) << tensors[i].name;
  }
  EXPECT_THAT((*reader)->verify().problems, SizeIs(0));
}

TEST_P(StreamingRestoreTest, ACorruptChunkFailsTheRestoreNamingTensorAndChunk) {
  const std::vector<format::HostTensor> tensors = ManyTensors();
  Write(tensors, 4096, 3);
  const std::string file = FlipBitIn("t117", 1);
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_, Options());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  AlignedBuffers buffers;
  std::vector<uint8_t*> out;
  Status status = RestoreInto(**reader, tensors, buffers, &out);
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr(file));
  EXPECT_THAT(status.message(), HasSubstr("tensor 't117' chunk 1"));
  EXPECT_THAT(status.message(), HasSubstr("checksum"));
}

// A disk that fails every read of one data file from some point on: the restore ends with an
// IOError naming the file and a tensor. It runs on its own thread so that a hang fails the
// test (the process aborts) rather than stalling the suite.
TEST_P(StreamingRestoreTest, AnEioMidStreamReachesTheCallerNamingFileAndTensor) {
  const std::vector<format::HostTensor> tensors = ManyTensors();
  Write(tensors, 4096, 3);
  std::string fallback;
  std::unique_ptr<io::FileSystem> backend =
      GetParam().posix ? nullptr : io::NewDefaultFileSystem(io::IoOptions{}, &fallback);
  io::FaultInjectionFileSystem faulty(backend != nullptr ? backend.get() : fs_.get());
  ReaderOptions options = Options();
  options.file_system = &faulty;
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_, options);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  faulty.fail_ops_matching("data-00001-of-00003", EIO, io::FaultOp::kRead);
  AlignedBuffers buffers;
  std::vector<uint8_t*> out;
  std::promise<Status> done;
  std::future<Status> result = done.get_future();
  std::thread restore([&] { done.set_value(RestoreInto(**reader, tensors, buffers, &out)); });
  if (result.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
    std::fprintf(stderr, "the restore hung after an injected EIO\n");
    std::abort();
  }
  restore.join();
  const Status status = result.get();
  EXPECT_EQ(status.code(), StatusCode::kIOError) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("data-00001-of-00003"));
  EXPECT_THAT(status.message(), HasSubstr("tensor 't1"));
  EXPECT_THAT(status.message(), HasSubstr("injected fault"));
  EXPECT_GT(faulty.injected_count(), 0u);
}

TEST_P(StreamingRestoreTest, ADestinationOfAnotherSizeIsRefusedBeforeReading) {
  Write({Make("a", DType::kF32, {5000})}, 4096, 3);
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_, Options());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<uint8_t> small(19999);
  Status status = (*reader)->read("a", small.data(), small.size());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'a'"));
  EXPECT_THAT(status.message(), HasSubstr("19999"));
}

INSTANTIATE_TEST_SUITE_P(DirectAndDepth, StreamingRestoreTest,
                         ::testing::Values(StreamingCase{true, 1}, StreamingCase{true, 32},
                                           StreamingCase{false, 1}, StreamingCase{false, 32},
                                           StreamingCase{true, 32, false},
                                           StreamingCase{false, 32, false}),
                         [](const ::testing::TestParamInfo<StreamingCase>& info) {
                           return std::string(info.param.o_direct ? "Direct" : "Buffered") +
                                  "Depth" + std::to_string(info.param.queue_depth) +
                                  (info.param.posix ? "" : "DefaultBackend");
                         });

// The state-file functions and OpenLatest read through the file system they are given: a
// fault in it reaches the caller.
TEST_F(ReaderTest, OpenLatestReadsTheStateFileThroughTheGivenFileSystem) {
  Write({Make("a", DType::kF32, {10})});
  CheckpointState state;
  state.model_checkpoint_path = "model.ckpt-5";
  state.all_model_checkpoint_paths = {"model.ckpt-5"};
  ASSERT_TRUE(WriteCheckpointState(*fs_, root_, state).ok());
  io::FaultInjectionFileSystem faulty(fs_.get());
  faulty.fail_ops_matching("/checkpoint", EIO, io::FaultOp::kOpen | io::FaultOp::kRead);
  ReaderOptions options = Posix();
  options.file_system = &faulty;
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::OpenLatest(root_, options);
  EXPECT_EQ(reader.status().code(), StatusCode::kIOError) << reader.status().ToString();
  EXPECT_THAT(reader.status().message(), HasSubstr("injected fault"));
  EXPECT_EQ(LatestCheckpoint(root_, kCheckpointStateFileName, &faulty).status().code(),
            StatusCode::kIOError);
  faulty.clear_faults();
  EXPECT_TRUE(CheckpointReader::OpenLatest(root_, options).ok());
}

// ---- sharded checkpoints -----------------------------------------------------------------------

// A global tensor held whole by the test, to cut slices from and check boxes against.
struct GlobalTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// The box [first, first + extent) of `g`, row-major, element by element: a reference that shares
// nothing with the reader's run arithmetic.
std::vector<uint8_t> CutBox(const GlobalTensor& g, const std::vector<int64_t>& first,
                            const std::vector<int64_t>& extent) {
  const size_t elem = DTypeSize(g.dtype);
  const int64_t count = NumElements(extent);
  std::vector<uint8_t> out(static_cast<size_t>(count) * elem);
  std::vector<int64_t> index(extent.size(), 0);
  for (int64_t n = 0; n < count; ++n) {
    int64_t linear = 0;
    for (size_t d = 0; d < extent.size(); ++d) linear = linear * g.shape[d] + first[d] + index[d];
    std::memcpy(out.data() + static_cast<size_t>(n) * elem,
                g.bytes.data() + static_cast<size_t>(linear) * elem, elem);
    for (size_t d = extent.size(); d-- > 0;) {
      if (++index[d] < extent[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

// Cuts [0, n) into `parts` uneven pieces (sizes growing with the part), as boundaries.
std::vector<int64_t> UnevenSplit(int64_t n, int64_t parts) {
  std::vector<int64_t> bounds;
  for (int64_t i = 0; i <= parts; ++i) bounds.push_back(n * i * (i + 1) / (parts * (parts + 1)));
  return bounds;
}

class ShardedReaderTest : public ReaderTest {
 protected:
  void SetUp() override {
    ReaderTest::SetUp();
    std::mt19937 rng(7);
    auto make = [&](std::string name, DType dtype, std::vector<int64_t> shape) {
      GlobalTensor g{std::move(name), dtype, std::move(shape), {}};
      g.bytes.resize(static_cast<size_t>(NumElements(g.shape)) * DTypeSize(dtype));
      // Runs of repeated bytes (compressible chunks) between random ones (raw chunks).
      for (size_t i = 0; i < g.bytes.size(); ++i) {
        g.bytes[i] =
            (i / 512) % 2 == 0 ? static_cast<uint8_t>(i / 128) : static_cast<uint8_t>(rng());
      }
      globals_[g.name] = std::move(g);
    };
    make("big", DType::kF32, {40, 33});
    make("g", DType::kI32, {6, 8});
    make("emb", DType::kBF16, {9, 5, 3});
    make("u8t", DType::kU8, {13});
    make("bias", DType::kF64, {5});
    make("step", DType::kI64, {});
  }

  // The slice of global tensor `name` at [first, first + extent), as rank r would write it.
  testing_support::HostSlice SliceOf(const std::string& name, std::vector<int64_t> first,
                                     std::vector<int64_t> extent) {
    const GlobalTensor& g = globals_.at(name);
    std::vector<uint8_t>& bytes = slice_bytes_.emplace_back(CutBox(g, first, extent));
    return testing_support::HostSlice{
        format::HostTensor{name, g.dtype, extent, bytes.data(), bytes.size()}, g.shape,
        std::move(first)};
  }

  // Saves the globals as 4 ranks with uneven shards: "big" along dim 0 (13, 7, 12, 8 rows),
  // "g" on a 2x2 grid, "emb" along dim 1 (rank 3 holds a replica of rank 2's box, written by
  // rank 2 only), "u8t" along dim 0 with an empty slice on rank 1, "bias" and "step" whole
  // (replicated, written by rank 0).
  void WriteFourRanks(uint64_t chunk_bytes = 200) {
    std::vector<std::vector<testing_support::HostSlice>> ranks(4);
    const int64_t rows[] = {0, 13, 20, 32, 40};
    for (int r = 0; r < 4; ++r) {
      ranks[r].push_back(SliceOf("big", {rows[r], 0}, {rows[r + 1] - rows[r], 33}));
    }
    ranks[0].push_back(SliceOf("g", {0, 0}, {4, 3}));
    ranks[1].push_back(SliceOf("g", {0, 3}, {4, 5}));
    ranks[2].push_back(SliceOf("g", {4, 0}, {2, 3}));
    ranks[3].push_back(SliceOf("g", {4, 3}, {2, 5}));
    ranks[0].push_back(SliceOf("emb", {0, 0, 0}, {9, 2, 3}));
    ranks[1].push_back(SliceOf("emb", {0, 2, 0}, {9, 1, 3}));
    ranks[2].push_back(SliceOf("emb", {0, 3, 0}, {9, 2, 3}));
    ranks[0].push_back(SliceOf("u8t", {0}, {5}));
    ranks[1].push_back(SliceOf("u8t", {5}, {0}));
    ranks[2].push_back(SliceOf("u8t", {5}, {4}));
    ranks[3].push_back(SliceOf("u8t", {9}, {4}));
    ranks[0].push_back(SliceOf("bias", {0}, {5}));
    ranks[0].push_back(SliceOf("step", {}, {}));
    testing_support::WriterOptions options;
    options.chunk_bytes = chunk_bytes;
    options.num_data_files = 2;
    Result<format::Index> index = testing_support::WriteShardedCheckpointFiles(
        *fs_, dir_, ranks, CheckpointMetadata{100, 9.5, {{"job", "sharded"}}}, options);
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    index_ = *index;
  }

  static ReaderOptions Buffered() {
    ReaderOptions options = Posix();
    options.use_o_direct = false;  // exact reads, so that bytes read can be compared
    return options;
  }

  std::unique_ptr<CheckpointReader> OpenBuffered() {
    Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_, Buffered());
    EXPECT_TRUE(reader.ok()) << reader.status().ToString();
    return reader.ok() ? std::move(reader).value() : nullptr;
  }

  // Reads box [first, first + extent) of `name` and expects the reference bytes.
  void ExpectBox(CheckpointReader& reader, const std::string& name, std::vector<int64_t> first,
                 std::vector<int64_t> extent) {
    const std::vector<uint8_t> want = CutBox(globals_.at(name), first, extent);
    std::vector<uint8_t> got(want.size(), 0xEE);
    Status status = reader.read_box(name, first, extent, got.data(), got.size());
    ASSERT_TRUE(status.ok()) << status.ToString();
    ASSERT_TRUE(got == want) << name << " box " << ::testing::PrintToString(first) << " + "
                             << ::testing::PrintToString(extent);
  }

  std::map<std::string, GlobalTensor> globals_;
  std::list<std::vector<uint8_t>> slice_bytes_;
  format::Index index_;
};

TEST_F(ShardedReaderTest, ListsGlobalShapesAndSlices) {
  WriteFourRanks();
  std::unique_ptr<CheckpointReader> reader = OpenBuffered();
  ASSERT_NE(reader, nullptr);
  EXPECT_TRUE(reader->sharded());
  EXPECT_EQ(reader->world_size(), 4u);
  EXPECT_EQ(reader->num_data_files(), 8u);
  EXPECT_EQ(reader->metadata().step, 100);
  ASSERT_EQ(reader->tensors().size(), 6u);  // one per name, in name order
  EXPECT_EQ(reader->tensors()[0].name, "bias");
  const TensorInfo* big = reader->find("big");
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->shape, (std::vector<int64_t>{40, 33}));
  EXPECT_EQ(big->bytes, 40u * 33 * 4);
  ASSERT_EQ(big->slices.size(), 4u);
  EXPECT_EQ(big->slices[2].offset, (std::vector<int64_t>{20, 0}));
  EXPECT_EQ(big->slices[2].shape, (std::vector<int64_t>{12, 33}));
  EXPECT_EQ(big->slices[2].writer_rank, 2u);
  EXPECT_EQ(big->slices[2].bytes, 12u * 33 * 4);
  uint64_t stored = 0, chunks = 0;
  for (const SliceInfo& slice : big->slices) {
    stored += slice.stored_bytes;
    chunks += slice.num_chunks;
  }
  EXPECT_EQ(big->stored_bytes, stored);
  EXPECT_EQ(big->num_chunks, chunks);
  const TensorInfo* emb = reader->find("emb");
  ASSERT_NE(emb, nullptr);
  ASSERT_EQ(emb->slices.size(), 3u);  // rank 3's replica was not written
  EXPECT_EQ(reader->find("step")->shape, std::vector<int64_t>{});
  EXPECT_EQ(reader->find("u8t")->slices[1].bytes, 0u);
}

TEST_F(ShardedReaderTest, ReadsWholeGlobalTensorsBitForBit) {
  WriteFourRanks();
  std::unique_ptr<CheckpointReader> reader = OpenBuffered();
  ASSERT_NE(reader, nullptr);
  for (const auto& [name, g] : globals_) {
    std::vector<uint8_t> got(g.bytes.size(), 0xEE);
    ASSERT_TRUE(reader->read(name, got.data(), got.size()).ok()) << name;
    EXPECT_TRUE(got == g.bytes) << name;
  }
  Result<xt::xarray<float>> big = ReadXarray<float>(*reader, "big");
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->shape(0), 40u);
  EXPECT_EQ(std::memcmp(big->data(), globals_.at("big").bytes.data(), 40 * 33 * 4), 0);
}

TEST_F(ShardedReaderTest, RandomBoxesMatchTheReferenceBitForBit) {
  // Chunks of 28 bytes: 7 f32 elements, never a whole row of "big" (33), so chunks straddle rows.
  WriteFourRanks(28);
  std::unique_ptr<CheckpointReader> reader = OpenBuffered();
  ASSERT_NE(reader, nullptr);
  std::mt19937 rng(11);
  for (const auto& [name, g] : globals_) {
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<int64_t> first, extent;
      for (int64_t dim : g.shape) {
        const int64_t a = static_cast<int64_t>(rng() % static_cast<uint32_t>(dim + 1));
        const int64_t b = static_cast<int64_t>(rng() % static_cast<uint32_t>(dim + 1));
        first.push_back(std::min(a, b));
        extent.push_back(std::max(a, b) - std::min(a, b));
      }
      ExpectBox(*reader, name, first, extent);
    }
  }
  // Edges: a single element, whole rows across slice boundaries, the whole tensor.
  ExpectBox(*reader, "big", {39, 32}, {1, 1});
  ExpectBox(*reader, "big", {12, 0}, {2, 33});
  ExpectBox(*reader, "big", {0, 0}, {40, 33});
  ExpectBox(*reader, "g", {3, 2}, {2, 2});
  ExpectBox(*reader, "emb", {4, 1, 1}, {3, 3, 2});
  ExpectBox(*reader, "step", {}, {});
}

TEST_F(ShardedReaderTest, RestoresOntoOneToFourRanksBitForBit) {
  WriteFourRanks();
  for (int64_t world = 1; world <= 4; ++world) {
    uint64_t total_read = 0;
    for (int64_t rank = 0; rank < world; ++rank) {
      std::unique_ptr<CheckpointReader> reader = OpenBuffered();
      ASSERT_NE(reader, nullptr);
      TensorRegistry registry;
      std::list<std::vector<uint8_t>> buffers;
      struct Want {
        std::string name;
        std::vector<int64_t> first, extent;
        std::vector<uint8_t>* buffer;
      };
      std::vector<Want> wants;
      // `dim` of `name` cut into `world` uneven pieces; this rank holds piece `rank`.
      auto shard = [&](const std::string& name, size_t dim) {
        const GlobalTensor& g = globals_.at(name);
        const std::vector<int64_t> bounds = UnevenSplit(g.shape[dim], world);
        std::vector<int64_t> first(g.shape.size(), 0), extent = g.shape;
        first[dim] = bounds[static_cast<size_t>(rank)];
        extent[dim] = bounds[static_cast<size_t>(rank) + 1] - first[dim];
        std::vector<uint8_t>& buffer =
            buffers.emplace_back(static_cast<size_t>(NumElements(extent)) * DTypeSize(g.dtype));
        ASSERT_TRUE(
            registry
                .add({name, g.dtype, extent, buffer.data(), buffer.size(), nullptr, g.shape, first})
                .ok());
        wants.push_back({name, first, extent, &buffer});
      };
      auto whole = [&](const std::string& name) {
        const GlobalTensor& g = globals_.at(name);
        std::vector<uint8_t>& buffer = buffers.emplace_back(g.bytes.size());
        ASSERT_TRUE(
            registry.add({name, g.dtype, g.shape, buffer.data(), buffer.size(), nullptr, {}, {}})
                .ok());
        wants.push_back({name, std::vector<int64_t>(g.shape.size(), 0), g.shape, &buffer});
      };
      shard("big", 0);  // the saved split, other bounds
      shard("g", 1);    // another dimension than either of the saved ones
      shard("emb", 2);
      shard("u8t", 0);
      whole("bias");  // replicated
      whole("step");
      Status status = reader->restore(registry);
      ASSERT_TRUE(status.ok()) << status.ToString();
      for (const Want& want : wants) {
        EXPECT_TRUE(*want.buffer == CutBox(globals_.at(want.name), want.first, want.extent))
            << want.name << " on rank " << rank << " of " << world;
      }
      total_read += reader->read_stats().bytes_read;
      if (world == 4) {
        uint64_t stored = 0;
        for (const TensorInfo& info : reader->tensors()) stored += info.stored_bytes;
        EXPECT_LT(reader->read_stats().bytes_read, stored) << "rank " << rank;
      }
    }
    // Appended: `"..." + std::string&&` trips GCC 12's -Wrestrict false positive at -O3.
    std::string key = "bytes_read_world_";
    key += std::to_string(world);
    RecordProperty(key, std::to_string(total_read));
  }
}

TEST_F(ShardedReaderTest, AReplicatedBoxRestoresOnEveryRankThatHoldsIt) {
  WriteFourRanks();
  for (int rank = 0; rank < 3; ++rank) {
    std::unique_ptr<CheckpointReader> reader = OpenBuffered();
    ASSERT_NE(reader, nullptr);
    std::vector<uint8_t> buffer(5 * 2 * 3 * 2);
    TensorRegistry registry;
    ASSERT_TRUE(registry
                    .add({"emb",
                          DType::kBF16,
                          {5, 2, 3},
                          buffer.data(),
                          buffer.size(),
                          nullptr,
                          {9, 5, 3},
                          {2, 3, 0}})
                    .ok());
    ASSERT_TRUE(reader->restore(registry).ok());
    EXPECT_TRUE(buffer == CutBox(globals_.at("emb"), {2, 3, 0}, {5, 2, 3}));
  }
}

TEST_F(ShardedReaderTest, ABoxReadsOnlyTheChunksThatOverlapIt) {
  WriteFourRanks();
  std::unique_ptr<CheckpointReader> reader = OpenBuffered();
  ASSERT_NE(reader, nullptr);
  const TensorInfo* big = reader->find("big");
  ASSERT_NE(big, nullptr);
  // Two rows of slice 0: 264 bytes, two chunks of 200 raw bytes at most.
  ExpectBox(*reader, "big", {0, 0}, {2, 33});
  const ReadStats small = reader->read_stats();
  EXPECT_EQ(small.chunks_read, 2u);
  EXPECT_LE(small.bytes_read, 400u);
  EXPECT_LT(small.bytes_read, big->stored_bytes / 4);
  // One column of all rows touches every slice but not every chunk: a short last chunk of a
  // slice may hold no element of column 5.
  ExpectBox(*reader, "big", {0, 5}, {40, 1});
  uint64_t needed = 0;
  for (const format::TensorEntry& t : index_.tensors) {
    if (t.name != "big") continue;
    for (const format::ChunkEntry& c : t.chunks) {
      bool overlaps = false;
      for (uint64_t e = c.tensor_offset / 4; e < (c.tensor_offset + c.raw_bytes) / 4; ++e) {
        overlaps = overlaps || e % 33 == 5;
      }
      needed += overlaps ? 1 : 0;
    }
  }
  EXPECT_LT(needed, big->num_chunks);
  EXPECT_EQ(reader->read_stats().chunks_read - small.chunks_read, needed);
  // The whole tensor reads each chunk once.
  const ReadStats before = reader->read_stats();
  ExpectBox(*reader, "big", {0, 0}, {40, 33});
  EXPECT_EQ(reader->read_stats().chunks_read - before.chunks_read, big->num_chunks);
  EXPECT_GE(reader->read_stats().bytes_read - before.bytes_read, big->stored_bytes);
}

TEST_F(ShardedReaderTest, BadBoxesAreNamedErrors) {
  WriteFourRanks();
  std::unique_ptr<CheckpointReader> reader = OpenBuffered();
  ASSERT_NE(reader, nullptr);
  std::vector<uint8_t> buffer(4096);
  Status status = reader->read_box("nope", {0}, {1}, buffer.data(), 1);
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("no tensor named 'nope'"));
  status = reader->read_box("big", {30, 0}, {11, 33}, buffer.data(), 11 * 33 * 4);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("box [30:41, 0:33] leaves tensor 'big' in " + dir_ +
                                          " of shape [40, 33] in dimension 0"));
  status = reader->read_box("big", {-1, 0}, {1, 33}, buffer.data(), 33 * 4);
  EXPECT_THAT(status.message(), HasSubstr("in dimension 0"));
  status = reader->read_box("big", {0}, {1}, buffer.data(), 4);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("does not fit tensor 'big'"));
  status = reader->read_box("big", {0, 0}, {1, 33}, buffer.data(), 100);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("box [0:1, 0:33] of tensor 'big'"));
  EXPECT_THAT(status.message(), HasSubstr("holds 132 bytes; the destination has 100"));
  EXPECT_TRUE(reader->read_box("big", {3, 4}, {0, 10}, nullptr, 0).ok());  // empty box
}

TEST_F(ShardedReaderTest, RestoreRejectsDtypeAndGlobalShapeMismatchesByName) {
  WriteFourRanks();
  std::unique_ptr<CheckpointReader> reader = OpenBuffered();
  ASSERT_NE(reader, nullptr);
  std::vector<uint8_t> a(4 * 33 * 4, 0xAA), b(4 * 33 * 4, 0xBB), c(40, 0xCC);
  TensorRegistry registry;
  ASSERT_TRUE(
      registry.add({"big", DType::kI32, {4, 33}, a.data(), a.size(), nullptr, {40, 33}, {0, 0}})
          .ok());
  ASSERT_TRUE(
      registry.add({"g", DType::kI32, {1, 33}, b.data(), 33 * 4, nullptr, {41, 33}, {0, 0}}).ok());
  ASSERT_TRUE(registry.add({"u8t", DType::kU8, {40}, c.data(), 40, nullptr, {}, {}}).ok());
  Status status = reader->restore(registry);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("tensor 'big' is i32 in the registry but f32"));
  EXPECT_THAT(status.message(), HasSubstr("tensor 'g' is a shard of global shape [41, 33] in the "
                                          "registry but has global shape [6, 8]"));
  EXPECT_THAT(status.message(), HasSubstr("tensor 'u8t' has shape [40] in the registry but [13]"));
  EXPECT_EQ(a, std::vector<uint8_t>(a.size(), 0xAA));
}

TEST_F(ShardedReaderTest, DamageInAChunkABoxNeedsIsCorruptionAndVerifyFindsIt) {
  WriteFourRanks();
  // Damage a chunk of rank 3's slice of "big" (rows 32..39).
  const format::TensorEntry* victim = nullptr;
  for (const format::TensorEntry& t : index_.tensors) {
    if (t.name == "big" && t.writer_rank == 3) victim = &t;
  }
  ASSERT_NE(victim, nullptr);
  const format::ChunkEntry& c = victim->chunks.back();
  const std::string file = dir_ + "/" + format::DataFileName(c.file_index, 8);
  std::vector<uint8_t> bytes = ReadFileBytes(file);
  bytes.at(c.file_offset + c.stored_bytes / 2) ^= 0x10;
  WriteFile(file, bytes);
  std::unique_ptr<CheckpointReader> reader = OpenBuffered();
  ASSERT_NE(reader, nullptr);
  ExpectBox(*reader, "big", {0, 0}, {32, 33});  // rank 3's slice is not needed
  std::vector<uint8_t> buffer(40 * 33 * 4);
  Status status = reader->read_box("big", {39, 0}, {1, 33}, buffer.data(), 33 * 4);
  EXPECT_EQ(status.code(), StatusCode::kCorruption);
  EXPECT_THAT(status.message(), HasSubstr("tensor 'big' chunk"));
  const VerifyReport report = reader->verify();
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_THAT(report.problems[0], HasSubstr(format::DataFileName(c.file_index, 8)));
}

TEST_F(ReaderTest, ReadBoxWorksOnAnUnshardedCheckpoint) {
  format::HostTensor a = Make("a", DType::kU16, {17, 9});
  Write({a}, 30);
  std::unique_ptr<CheckpointReader> reader = OpenOrDie();
  ASSERT_NE(reader, nullptr);
  EXPECT_FALSE(reader->sharded());
  EXPECT_EQ(reader->world_size(), 1u);
  EXPECT_TRUE(reader->find("a")->slices.empty());
  GlobalTensor g{"a", DType::kU16, {17, 9}, {}};
  g.bytes.assign(static_cast<const uint8_t*>(a.data),
                 static_cast<const uint8_t*>(a.data) + a.bytes);
  std::vector<uint8_t> got(5 * 4 * 2);
  ASSERT_TRUE(reader->read_box("a", {3, 2}, {5, 4}, got.data(), got.size()).ok());
  EXPECT_TRUE(got == CutBox(g, {3, 2}, {5, 4}));
  // A shard of an unsharded checkpoint's tensor restores its box.
  TensorRegistry registry;
  std::vector<uint8_t> shard(8 * 9 * 2);
  ASSERT_TRUE(
      registry.add({"a", DType::kU16, {8, 9}, shard.data(), shard.size(), nullptr, {17, 9}, {9, 0}})
          .ok());
  ASSERT_TRUE(reader->restore(registry).ok());
  EXPECT_TRUE(shard == CutBox(g, {9, 0}, {8, 9}));
}

}  // namespace
}  // namespace asyncckpt
