#include "src/reader/streaming_read.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "io/fault_injection_file_system.h"
#include "tests/support/files.h"

namespace asyncckpt::reader {
namespace {

using ::testing::HasSubstr;

// One data file of 64 KiB (byte i holds i * 7 mod 251) read as chunks of 1000 bytes; the sink
// checks each chunk's bytes and records what arrived.
class StreamingReadTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kFileBytes = 64 << 10;
  static constexpr uint64_t kChunk = 1000;

  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/streaming_read_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    std::vector<uint8_t> bytes(kFileBytes);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 % 251);
    testing_support::WriteFile(root_ + "/data", bytes);
    posix_ = io::NewPosixFileSystem();
    faulty_ = std::make_unique<io::FaultInjectionFileSystem>(posix_.get());
    ASSERT_TRUE(faulty_->open(root_ + "/data", io::OpenOptions{}, &file_).ok());
  }
  void TearDown() override {
    file_.reset();
    std::filesystem::remove_all(root_);
  }

  // Extents of `per_extent` chunks each, over the first `chunks` chunks of the file.
  static std::vector<Extent> Plan(size_t chunks, size_t per_extent) {
    std::vector<Extent> plan;
    for (size_t i = 0; i < chunks; i += per_extent) {
      Extent e{0, i * kChunk, 0, false, nullptr, {}};
      for (size_t k = i; k < std::min(chunks, i + per_extent); ++k) {
        e.chunks.push_back({0, k, (k - i) * kChunk, nullptr});
        e.length += kChunk;
      }
      plan.push_back(e);
    }
    return plan;
  }

  void Run(const std::vector<Extent>& plan, const StreamOptions& options) {
    const DataFileHandles handles{file_.get(), nullptr};
    auto sink = [&](const PlannedChunk& p, std::span<uint8_t> stored) {
      bool right = stored.size() == kChunk;
      for (size_t i = 0; right && i < stored.size(); ++i) {
        right = stored[i] == static_cast<uint8_t>((p.chunk * kChunk + i) * 7 % 251);
      }
      std::lock_guard lock(mu_);
      (right ? delivered_ : wrong_).push_back(p.chunk);
    };
    auto failed = [&](const PlannedChunk& p, const Status& status) {
      std::lock_guard lock(mu_);
      failed_.push_back(p.chunk);
      failures_.push_back(status);
    };
    RunReadPlan(
        *faulty_, {&handles, 1}, plan, [](const PlannedChunk&) { return kChunk; }, options, sink,
        failed);
  }

  static std::vector<size_t> Sorted(std::vector<size_t> v) {
    std::sort(v.begin(), v.end());
    return v;
  }
  static std::vector<size_t> Range(size_t n) {
    std::vector<size_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = i;
    return v;
  }

  std::string root_;
  std::unique_ptr<io::FileSystem> posix_;
  std::unique_ptr<io::FaultInjectionFileSystem> faulty_;
  std::unique_ptr<io::File> file_;
  std::mutex mu_;
  std::vector<size_t> delivered_, wrong_, failed_;
  std::vector<Status> failures_;
};

TEST_F(StreamingReadTest, EveryChunkArrivesOnceWithItsBytesAtEveryDepth) {
  for (unsigned depth : {1u, 2u, 32u}) {
    delivered_.clear();
    StreamOptions options;
    options.queue_depth = depth;
    Run(Plan(60, 4), options);
    EXPECT_EQ(Sorted(delivered_), Range(60)) << "depth " << depth;
    EXPECT_TRUE(wrong_.empty());
    EXPECT_TRUE(failed_.empty());
  }
}

TEST_F(StreamingReadTest, AnExtentLargerThanTheBufferBudgetStillRunsAlone) {
  StreamOptions options;
  options.buffer_bytes = 1;
  Run(Plan(30, 10), options);
  EXPECT_EQ(Sorted(delivered_), Range(30));
}

// A transient fault on an extent's read: each chunk is read again alone, and all arrive.
TEST_F(StreamingReadTest, AFailedExtentIsRetriedChunkByChunk) {
  faulty_->fail_at(1, EIO);
  Run(Plan(3, 3), StreamOptions{});
  EXPECT_EQ(Sorted(delivered_), Range(3));
  EXPECT_TRUE(failed_.empty());
  EXPECT_EQ(faulty_->injected_count(), 1u);
}

// A disk that stays broken: every chunk fails once with the error, none is lost or repeated,
// and the run ends.
TEST_F(StreamingReadTest, APersistentFaultFailsEveryChunkOnce) {
  faulty_->fail_after(1, EIO);
  StreamOptions options;
  options.queue_depth = 8;
  Run(Plan(40, 4), options);
  EXPECT_TRUE(delivered_.empty());
  EXPECT_EQ(Sorted(failed_), Range(40));
  for (const Status& status : failures_) {
    EXPECT_EQ(status.code(), StatusCode::kIOError);
    EXPECT_THAT(status.message(), HasSubstr("injected fault"));
  }
}

// Records what a restore registers, and refuses nothing.
class RecordingFileSystem final : public io::FileSystemWrapper {
 public:
  explicit RecordingFileSystem(io::FileSystem* target) : FileSystemWrapper(target) {}
  io::IoStatus register_buffers(std::span<const io::IoBuffer> buffers) override {
    registered.assign(buffers.begin(), buffers.end());
    ++registrations;
    return io::IoStatus::Ok();
  }
  void unregister_buffers() override { ++unregistrations; }
  std::vector<io::IoBuffer> registered;
  int registrations = 0;
  int unregistrations = 0;
};

TEST(RegisteredDestinationsTest, RegistersEachRegionInPiecesOfAtMostOneGibForItsLifetime) {
  auto posix = io::NewPosixFileSystem();
  RecordingFileSystem fs(posix.get());
  // Never touched: registration is recorded, not done.
  auto* base = reinterpret_cast<uint8_t*>(uintptr_t{1} << 40);
  const std::vector<std::pair<uint8_t*, uint64_t>> regions = {{base, 4096},
                                                              {base + (8ull << 30), 3ull << 29}};
  {
    RegisteredDestinations registered(&fs, regions);
    EXPECT_EQ(fs.registrations, 1);
    EXPECT_EQ(fs.unregistrations, 0);
  }
  EXPECT_EQ(fs.unregistrations, 1);
  ASSERT_EQ(fs.registered.size(), 3u);
  EXPECT_EQ(fs.registered[0].length, 4096u);
  EXPECT_EQ(fs.registered[1].data, base + (8ull << 30));
  EXPECT_EQ(fs.registered[1].length, 1ull << 30);
  EXPECT_EQ(fs.registered[2].data, base + (8ull << 30) + (1ull << 30));
  EXPECT_EQ(fs.registered[2].length, 1ull << 29);
}

TEST(RegisteredDestinationsTest, LeavesABorrowedOrCrowdedFileSystemAlone) {
  auto posix = io::NewPosixFileSystem();
  RecordingFileSystem fs(posix.get());
  std::vector<uint8_t> byte(1);
  { RegisteredDestinations none(nullptr, {{{byte.data(), 1}}}); }
  std::vector<std::pair<uint8_t*, uint64_t>> many(RegisteredDestinations::kMaxRegions + 1,
                                                  {byte.data(), 1});
  { RegisteredDestinations crowded(&fs, many); }
  EXPECT_EQ(fs.registrations, 0);
  EXPECT_EQ(fs.unregistrations, 0);
}

TEST(RegionsReadInPlaceTest, KeepsOnlyRegionsThatAnInPlaceExtentLandsIn) {
  std::vector<uint8_t> memory(3 * 4096);
  uint8_t* a = memory.data();
  uint8_t* b = a + 4096;
  uint8_t* c = a + 2 * 4096;
  const std::vector<std::pair<uint8_t*, uint64_t>> regions = {{a, 4096}, {b, 4096}, {c, 4096}};
  std::vector<Extent> plan(3);
  plan[0].target = b + 100;   // in place, inside b
  plan[1].target = nullptr;   // through a bounce buffer: lands in no region directly
  plan[2].target = c + 4096;  // just past c: in none of them
  const auto used = RegionsReadInPlace(regions, plan);
  ASSERT_EQ(used.size(), 1u);
  EXPECT_EQ(used[0].first, b);
  EXPECT_EQ(used[0].second, 4096u);
}

TEST(RegionsReadInPlaceTest, APlanThatBouncesEverythingRegistersNothing) {
  std::vector<uint8_t> memory(64);
  const std::vector<std::pair<uint8_t*, uint64_t>> regions = {{memory.data(), memory.size()}};
  std::vector<Extent> plan(4);  // no targets: every read goes through bounce buffers
  EXPECT_TRUE(RegionsReadInPlace(regions, plan).empty());
  EXPECT_TRUE(RegionsReadInPlace({}, plan).empty());
}

}  // namespace
}  // namespace asyncckpt::reader
