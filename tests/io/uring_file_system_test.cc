// The io_uring backend's batches: depth-capped submission, large and many ops, failures that
// still reap everything, concurrent callers, registered buffers. Skipped without io_uring.

#include "io/uring_file_system.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/file_system.h"

namespace asyncckpt::io {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

std::vector<char> Pattern(size_t n, unsigned seed) {
  std::vector<char> bytes(n);
  uint32_t x = seed * 2654435761u + 7;
  for (char& b : bytes) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<char>(x >> 24);
  }
  return bytes;
}

// A File with no descriptor, kept in memory: the batch must run it through the File itself.
class MemoryFile final : public File {
 public:
  const std::string& path() const override { return path_; }
  bool is_direct() const override { return false; }
  IoStatus write_at(uint64_t offset, const void* data, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes_.size() < offset + n) bytes_.resize(offset + n);
    std::memcpy(bytes_.data() + offset, data, n);
    return IoStatus::Ok();
  }
  IoStatus read_at(uint64_t offset, void* data, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (offset + n > bytes_.size()) return IoStatus(EIO, "read memory: unexpected end of file");
    std::memcpy(data, bytes_.data() + offset, n);
    return IoStatus::Ok();
  }
  IoStatus sync() override { return IoStatus::Ok(); }
  IoStatus size(uint64_t* bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    *bytes = bytes_.size();
    return IoStatus::Ok();
  }
  IoStatus truncate(uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_.resize(bytes);
    return IoStatus::Ok();
  }
  int fd() const override { return -1; }

 private:
  std::string path_ = "memory";
  std::mutex mu_;
  std::vector<char> bytes_;
};

class UringFileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs_ = MakeFs(4);
    if (fs_ == nullptr) GTEST_SKIP() << "io_uring unavailable: " << why_;
    std::string pattern = ::testing::TempDir() + "/uring_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    root_ = pattern;
  }
  void TearDown() override {
    if (!root_.empty()) std::filesystem::remove_all(root_);
  }

  std::unique_ptr<UringFileSystem> MakeFs(unsigned depth) {
    IoOptions options;
    options.queue_depth = depth;
    return UringFileSystem::Create(options, &why_);
  }

  std::unique_ptr<File> Open(const std::string& name, bool write, bool direct = false) {
    std::unique_ptr<File> file;
    OpenOptions options;
    options.write = options.create = options.truncate = write;
    options.direct = direct;
    IoStatus s = fs_->open(root_ + "/" + name, options, &file);
    EXPECT_TRUE(s.ok()) << s.message();
    return file;
  }

  // Writes `chunks` back to back into `file` in one batch, reads them back in one batch.
  void RoundTrip(FileSystem& fs, File* file, const std::vector<std::vector<char>>& chunks) {
    std::vector<WriteOp> writes;
    uint64_t offset = 0;
    for (const auto& c : chunks) {
      writes.push_back({file, offset, c.data(), c.size()});
      offset += c.size();
    }
    IoStatus s = fs.write_batch(writes);
    ASSERT_TRUE(s.ok()) << s.message();
    std::vector<std::vector<char>> back(chunks.size());
    std::vector<ReadOp> reads;
    for (size_t i = 0; i < chunks.size(); ++i) {
      back[i].resize(chunks[i].size());
      reads.push_back({file, writes[i].offset, back[i].data(), back[i].size()});
    }
    s = fs.read_batch(reads);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_TRUE(back == chunks);
  }

  std::string why_;
  std::unique_ptr<UringFileSystem> fs_;
  std::string root_;
};

TEST_F(UringFileSystemTest, NameAndDefaultChoice) {
  EXPECT_EQ(fs_->name(), "io_uring");
  std::string reason = "stale";
  auto fs = NewDefaultFileSystem(IoOptions{}, &reason);
  EXPECT_EQ(fs->name(), "io_uring");
  EXPECT_TRUE(reason.empty());
}

TEST_F(UringFileSystemTest, ManySmallOpsBeyondQueueDepthRoundTrip) {
  auto file = Open("many", true);
  std::vector<std::vector<char>> chunks;
  for (unsigned i = 0; i < 700; ++i) chunks.push_back(Pattern(1 + (i * 37) % 5000, i));
  RoundTrip(*fs_, file.get(), chunks);
  EXPECT_EQ(fs_->rings_created(), 1u);
}

TEST_F(UringFileSystemTest, QueueDepthOfOneStillCompletesEverything) {
  fs_ = MakeFs(1);
  ASSERT_NE(fs_, nullptr);
  auto file = Open("depth1", true);
  std::vector<std::vector<char>> chunks;
  for (unsigned i = 0; i < 50; ++i) chunks.push_back(Pattern(4096 + i, i));
  RoundTrip(*fs_, file.get(), chunks);
}

TEST_F(UringFileSystemTest, LargeOpRoundTrips) {
  auto file = Open("large", true);
  std::vector<std::vector<char>> chunks = {Pattern(64u << 20, 5), Pattern(12345, 6)};
  RoundTrip(*fs_, file.get(), chunks);
  uint64_t size = 0;
  ASSERT_TRUE(file->size(&size).ok());
  EXPECT_EQ(size, (64u << 20) + 12345u);
}

TEST_F(UringFileSystemTest, DirectBatchWithAlignedBuffers) {
  auto file = Open("direct", true, /*direct=*/true);
  if (!file->is_direct()) GTEST_SKIP() << "file system refuses O_DIRECT";
  constexpr size_t kOps = 16, kBytes = 8192;
  void* raw = nullptr;
  ASSERT_EQ(::posix_memalign(&raw, 4096, kOps * kBytes * 2), 0);
  std::unique_ptr<void, FreeDeleter> memory(raw);
  char* out = static_cast<char*>(raw);
  char* in = out + kOps * kBytes;
  std::vector<char> data = Pattern(kOps * kBytes, 11);
  std::memcpy(out, data.data(), data.size());
  std::vector<WriteOp> writes;
  std::vector<ReadOp> reads;
  for (size_t i = 0; i < kOps; ++i) {
    writes.push_back({file.get(), i * kBytes, out + i * kBytes, kBytes});
    reads.push_back({file.get(), i * kBytes, in + i * kBytes, kBytes});
  }
  IoStatus s = fs_->write_batch(writes);
  ASSERT_TRUE(s.ok()) << s.message();
  s = fs_->read_batch(reads);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(std::memcmp(in, data.data(), data.size()), 0);
}

TEST_F(UringFileSystemTest, ReadPastEndFailsWithLowestOpAndCompletesTheRest) {
  std::string path = root_ + "/eof";
  {
    auto file = Open("eof", true);
    std::vector<char> data = Pattern(10000, 1);
    ASSERT_TRUE(file->write_at(0, data.data(), data.size()).ok());
  }
  auto file = Open("eof", false);
  std::vector<std::vector<char>> back(40, std::vector<char>(100));
  std::vector<ReadOp> reads;
  for (size_t i = 0; i < back.size(); ++i) {
    // Ops 5 and 9 run past the end; op 5's offset is what the message must name.
    uint64_t offset = (i == 5) ? 9950 : (i == 9) ? 20000 : i * 100;
    reads.push_back({file.get(), offset, back[i].data(), back[i].size()});
  }
  IoStatus s = fs_->read_batch(reads);
  EXPECT_EQ(s.error_number(), EIO);
  EXPECT_NE(s.message().find("unexpected end of file"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(path + " at offset 9950"), std::string::npos) << s.message();
  // The first completion was short (50 bytes); the remainder was resubmitted and hit the end.
  EXPECT_NE(s.message().find("got 50 of 100 bytes"), std::string::npos) << s.message();
  // The ring went back to the pool in a clean state: the next batch works on it.
  std::vector<ReadOp> good = {{file.get(), 0, back[0].data(), 100}};
  ASSERT_TRUE(fs_->read_batch(good).ok());
  EXPECT_EQ(fs_->rings_created(), 1u);
}

TEST_F(UringFileSystemTest, WriteFailureNamesPathAndOffset) {
  std::string path = root_ + "/ro";
  { Open("ro", true); }
  auto read_only = Open("ro", false);
  auto writable = Open("rw", true);
  std::vector<char> data(4096, 'x');
  std::vector<WriteOp> writes = {{writable.get(), 0, data.data(), data.size()},
                                 {read_only.get(), 8192, data.data(), data.size()},
                                 {writable.get(), 4096, data.data(), data.size()}};
  IoStatus s = fs_->write_batch(writes);
  EXPECT_EQ(s.error_number(), EBADF);
  EXPECT_NE(s.message().find("write " + path + " at offset 8192"), std::string::npos)
      << s.message();
}

TEST_F(UringFileSystemTest, FilesWithoutDescriptorRunThroughTheFile) {
  MemoryFile memory;
  auto real = Open("real", true);
  std::vector<char> a = Pattern(300, 1), b = Pattern(500, 2);
  std::vector<WriteOp> writes = {{&memory, 0, a.data(), a.size()},
                                 {real.get(), 0, b.data(), b.size()}};
  ASSERT_TRUE(fs_->write_batch(writes).ok());
  std::vector<char> a2(300), b2(500);
  std::vector<ReadOp> reads = {{&memory, 0, a2.data(), a2.size()},
                               {real.get(), 0, b2.data(), b2.size()}};
  ASSERT_TRUE(fs_->read_batch(reads).ok());
  EXPECT_EQ(a2, a);
  EXPECT_EQ(b2, b);
}

TEST_F(UringFileSystemTest, ConcurrentBatchesFromSeveralThreads) {
  constexpr int kThreads = 4, kRounds = 20, kOps = 40;
  std::vector<std::unique_ptr<File>> files;
  for (int t = 0; t < kThreads; ++t) {
    // Appended, not `"t" + std::to_string(t)`: for that GCC 12 at -O3 reports an overlapping
    // memcpy of 2^63 bytes (-Wrestrict, a known false positive), which fails the Release build.
    std::string name = "t";
    name += std::to_string(t);
    files.push_back(Open(name, true));
  }
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds && failures[t].empty(); ++round) {
        std::vector<std::vector<char>> chunks, back;
        std::vector<WriteOp> writes;
        std::vector<ReadOp> reads;
        for (int i = 0; i < kOps; ++i) {
          chunks.push_back(Pattern(1000 + i, static_cast<unsigned>(t * 1000 + round * 50 + i)));
        }
        back.resize(kOps);
        for (int i = 0; i < kOps; ++i) {
          uint64_t offset = static_cast<uint64_t>(i) * 2000;
          writes.push_back({files[t].get(), offset, chunks[i].data(), chunks[i].size()});
          back[i].resize(chunks[i].size());
          reads.push_back({files[t].get(), offset, back[i].data(), back[i].size()});
        }
        IoStatus s = fs_->write_batch(writes);
        if (s.ok()) s = fs_->read_batch(reads);
        if (!s.ok()) {
          failures[t] = s.message();
        } else if (back != chunks) {
          failures[t] = "data mismatch in round " + std::to_string(round);
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
  EXPECT_LE(fs_->rings_created(), static_cast<size_t>(kThreads));
}

TEST_F(UringFileSystemTest, RegisteredBuffersRoundTrip) {
  constexpr size_t kBytes = 1 << 20;
  void* raw = nullptr;
  ASSERT_EQ(::posix_memalign(&raw, 4096, 2 * kBytes), 0);
  std::unique_ptr<void, FreeDeleter> memory(raw);
  char* out = static_cast<char*>(raw);
  char* in = out + kBytes;
  std::vector<char> data = Pattern(kBytes, 21);
  std::memcpy(out, data.data(), kBytes);
  std::memset(in, 0, kBytes);
  iovec buffers[] = {{out, kBytes}, {in, kBytes}};
  IoStatus registered = fs_->RegisterBuffers(buffers);
  // A refusal (memlock limit) is allowed: the batches below must work either way.
  if (!registered.ok()) std::cout << "registration refused: " << registered.message() << "\n";
  auto file = Open("fixed", true);
  std::vector<WriteOp> writes;
  std::vector<ReadOp> reads;
  for (size_t i = 0; i < 16; ++i) {
    size_t piece = kBytes / 16;
    writes.push_back({file.get(), i * piece, out + i * piece, piece});
    reads.push_back({file.get(), i * piece, in + i * piece, piece});
  }
  ASSERT_TRUE(fs_->write_batch(writes).ok());
  ASSERT_TRUE(fs_->read_batch(reads).ok());
  EXPECT_EQ(std::memcmp(in, data.data(), kBytes), 0);
  EXPECT_EQ(fs_->fixed_requests(), registered.ok() ? 32u : 0u);
  // This read straddles both buffers (out's tail, in's head), so it must go unregistered.
  std::vector<ReadOp> across = {{file.get(), 0, out + kBytes - 32, 64}};
  ASSERT_TRUE(fs_->read_batch(across).ok());
  EXPECT_EQ(std::memcmp(out + kBytes - 32, data.data(), 64), 0);
  std::memcpy(out + kBytes - 32, data.data() + kBytes - 32, 32);
  std::memcpy(in, data.data(), 32);
  fs_->UnregisterBuffers();
  std::memset(in, 0, kBytes);
  ASSERT_TRUE(fs_->read_batch(reads).ok());
  EXPECT_EQ(std::memcmp(in, data.data(), kBytes), 0);
  EXPECT_EQ(fs_->fixed_requests(), registered.ok() ? 32u : 0u);
}

TEST_F(UringFileSystemTest, OverlappingRegisteredBuffersAreInvalid) {
  std::vector<char> memory(8192);
  iovec buffers[] = {{memory.data(), 8192}, {memory.data() + 4096, 100}};
  EXPECT_EQ(fs_->RegisterBuffers(buffers).error_number(), EINVAL);
}

}  // namespace
}  // namespace asyncckpt::io
