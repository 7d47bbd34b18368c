// The io_uring IoQueue beyond the common contract (tests/io/io_queue_test.cc): requests stay in
// the ring (no thread pool) except writes to files in memory (a thread per file), large requests
// go in pieces, the remainder of a short read or a short write is resubmitted, registered
// buffers are used when a request lies inside one, registration can change under a live queue,
// and a refused registration leaves I/O working. Skipped without io_uring.

#include "io/uring_io_queue.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/file_system.h"
#include "io/uring_file_system.h"
#include "tests/io/io_outcomes.h"

namespace asyncckpt::io {
namespace {

using testing_support::IoOutcomes;

constexpr size_t kBlock = 4096;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// 4096-aligned memory, as O_DIRECT and a fair test of fixed buffers want.
std::unique_ptr<char, FreeDeleter> Aligned(size_t bytes) {
  void* raw = nullptr;
  if (::posix_memalign(&raw, kBlock, bytes) != 0) return nullptr;
  std::memset(raw, 0, bytes);
  return std::unique_ptr<char, FreeDeleter>(static_cast<char*>(raw));
}

void Fill(char* data, size_t n, unsigned seed) {
  uint32_t x = seed * 2654435761u + 7;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    data[i] = static_cast<char>(x >> 24);
  }
}

class UringIoQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    fs_ = UringFileSystem::Create(IoOptions{}, &why);
    if (fs_ == nullptr) GTEST_SKIP() << "io_uring unavailable: " << why;
    std::string pattern = ::testing::TempDir() + "/uring_queue_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<File> Open(const std::string& name, bool write = true) {
    std::unique_ptr<File> file;
    OpenOptions options;
    options.write = options.create = write;
    const IoStatus s = fs_->open(dir_ + "/" + name, options, &file);
    EXPECT_TRUE(s.ok()) << s.message();
    return file;
  }

  // A queue from the file system, sharing its registered buffers.
  std::unique_ptr<UringIoQueue> Queue(unsigned depth, IoCallback callback) {
    std::unique_ptr<IoQueue> made;
    const IoStatus s = fs_->new_io_queue(IoQueueOptions{depth, std::move(callback)}, &made);
    EXPECT_TRUE(s.ok()) << s.message();
    auto* uring = dynamic_cast<UringIoQueue*>(made.get());
    EXPECT_NE(uring, nullptr) << "not an io_uring queue: " << (made ? made->name() : "none");
    if (uring == nullptr) return nullptr;
    made.release();
    return std::unique_ptr<UringIoQueue>(uring);
  }

  // A queue whose SQEs carry at most max_piece bytes (not an IoQueueOptions field).
  std::unique_ptr<UringIoQueue> QueueWithPieces(unsigned depth, IoCallback callback,
                                                size_t max_piece) {
    std::unique_ptr<UringIoQueue> queue;
    const IoStatus s = UringIoQueue::Create(
        UringIoQueueSettings{{depth, std::move(callback)}, nullptr, max_piece}, &queue);
    EXPECT_TRUE(s.ok()) << s.message();
    return queue;
  }

  std::unique_ptr<UringFileSystem> fs_;
  std::string dir_;
};

TEST_F(UringIoQueueTest, KeepsAtMostDepthInFlightInItsRingAcrossInterleavedFiles) {
  constexpr int kFiles = 8;
  constexpr uint64_t kBlocksPerFile = 32;
  constexpr unsigned kDepth = 5;
  std::vector<std::unique_ptr<File>> files;
  for (int f = 0; f < kFiles; ++f) files.push_back(Open("data-" + std::to_string(f)));
  std::vector<char> out(kFiles * kBlocksPerFile * kBlock);
  Fill(out.data(), out.size(), 1);
  IoOutcomes outcomes;
  auto queue = Queue(kDepth, outcomes.Callback());
  ASSERT_NE(queue, nullptr);
  EXPECT_EQ(queue->name(), "io_uring");
  EXPECT_EQ(queue->depth(), kDepth);
  // Block b of every file, then block b + 1 of every file: each file's requests interleave
  // with all the others'.
  for (uint64_t b = 0; b < kBlocksPerFile; ++b) {
    for (int f = 0; f < kFiles; ++f) {
      const uint64_t tag = f * kBlocksPerFile + b;
      queue->submit_write(WriteOp{files[f].get(), b * kBlock, &out[tag * kBlock], kBlock}, tag);
    }
  }
  queue->drain();
  EXPECT_EQ(outcomes.completed(), kFiles * kBlocksPerFile);
  EXPECT_TRUE(outcomes.failures().empty());
  EXPECT_LE(queue->most_in_flight(), kDepth);
  EXPECT_GE(queue->most_in_flight(), 1u);
  EXPECT_EQ(queue->pool_requests(), 0u);
  std::vector<char> back(kBlocksPerFile * kBlock);
  for (int f = 0; f < kFiles; ++f) {
    ASSERT_TRUE(files[f]->read_at(0, back.data(), back.size()).ok());
    EXPECT_EQ(std::memcmp(back.data(), &out[f * kBlocksPerFile * kBlock], back.size()), 0)
        << "file " << f;
  }
}

TEST_F(UringIoQueueTest, ALargeRequestGoesPieceAfterPieceAndLandsWhole) {
  constexpr size_t kBytes = 16 * kBlock;
  auto file = Open("large");
  std::vector<char> out(kBytes), in(kBytes);
  Fill(out.data(), kBytes, 2);
  IoOutcomes outcomes;
  auto queue = QueueWithPieces(2, outcomes.Callback(), /*max_piece=*/kBlock);
  ASSERT_NE(queue, nullptr);
  queue->submit_write(WriteOp{file.get(), 0, out.data(), kBytes}, 1);
  queue->drain();
  queue->submit_read(ReadOp{file.get(), 0, in.data(), kBytes}, 2);
  queue->drain();
  EXPECT_TRUE(outcomes.failures().empty());
  EXPECT_EQ(out, in);
  // 16 pieces each way: the first SQE and 15 continuations.
  EXPECT_EQ(queue->continuations(), 30u);
}

TEST_F(UringIoQueueTest, AShortReadIsResubmittedForItsRemainderThenFailsAtTheEnd) {
  auto file = Open("short");
  std::vector<char> out(kBlock + kBlock / 2);
  Fill(out.data(), out.size(), 3);
  ASSERT_TRUE(file->write_at(0, out.data(), out.size()).ok());
  std::vector<char> in(2 * kBlock, '.');
  IoOutcomes outcomes;
  auto queue = Queue(2, outcomes.Callback());
  ASSERT_NE(queue, nullptr);
  queue->submit_read(ReadOp{file.get(), 0, in.data(), in.size()}, 7);
  queue->drain();
  const auto failures = outcomes.failures();
  ASSERT_EQ(failures.count(7), 1u);
  EXPECT_EQ(failures.at(7).error_number(), EIO);
  // The kernel gave 6144 bytes, the resubmitted remainder 0: the message counts both.
  EXPECT_NE(failures.at(7).message().find("got 6144 of 8192 bytes"), std::string::npos)
      << failures.at(7).message();
  EXPECT_GE(queue->continuations(), 1u);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), out.size()), 0);
}

TEST_F(UringIoQueueTest, AShortWriteIsResubmittedForItsRemainder) {
  // A file size limit makes the kernel write what fits and stop short; the remainder, sent
  // again, meets the limit itself (EFBIG, SIGXFSZ ignored) at the offset where it begins.
  auto file = Open("limited");
  std::vector<char> out(2 * kBlock);
  Fill(out.data(), out.size(), 8);
  IoOutcomes outcomes;
  auto queue = Queue(2, outcomes.Callback());
  ASSERT_NE(queue, nullptr);
  rlimit old_limit{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit low = old_limit;
  low.rlim_cur = kBlock + kBlock / 2;
  const sighandler_t old_handler = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &low), 0);
  queue->submit_write(WriteOp{file.get(), 0, out.data(), out.size()}, 3);
  queue->drain();
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  std::signal(SIGXFSZ, old_handler);
  const auto failures = outcomes.failures();
  ASSERT_EQ(failures.count(3), 1u);
  EXPECT_EQ(failures.at(3).error_number(), EFBIG);
  EXPECT_NE(failures.at(3).message().find(" at offset 6144: "), std::string::npos)
      << failures.at(3).message();
  EXPECT_EQ(queue->continuations(), 1u);
  std::vector<char> back(kBlock + kBlock / 2);
  ASSERT_TRUE(file->read_at(0, back.data(), back.size()).ok());
  EXPECT_EQ(std::memcmp(back.data(), out.data(), back.size()), 0);
}

TEST_F(UringIoQueueTest, RegisteredBuffersAreUsedByQueuesMadeBeforeAndAfterRegistration) {
  constexpr size_t kBytes = 16 * kBlock;
  auto memory = Aligned(2 * kBytes);
  ASSERT_NE(memory, nullptr);
  char* out = memory.get();
  char* in = out + kBytes;
  Fill(out, kBytes, 4);
  std::vector<char> unregistered(kBlock);
  Fill(unregistered.data(), kBlock, 5);
  auto file = Open("fixed");
  IoOutcomes outcomes;
  auto before = Queue(4, outcomes.Callback());
  ASSERT_NE(before, nullptr);
  const IoBuffer buffers[] = {{out, kBytes}, {in, kBytes}};
  const IoStatus registered = fs_->register_buffers(buffers);
  if (!registered.ok()) GTEST_SKIP() << "registration refused here: " << registered.message();
  auto after = Queue(4, outcomes.Callback());
  ASSERT_NE(after, nullptr);
  for (uint64_t i = 0; i < 16; ++i) {
    UringIoQueue* queue = i % 2 == 0 ? before.get() : after.get();
    queue->submit_write(WriteOp{file.get(), i * kBlock, out + i * kBlock, kBlock}, i);
  }
  // Outside every registered buffer: a plain write.
  before->submit_write(WriteOp{file.get(), 16 * kBlock, unregistered.data(), kBlock}, 16);
  before->drain();
  after->drain();
  for (uint64_t i = 0; i < 16; ++i) {
    UringIoQueue* queue = i % 2 == 0 ? before.get() : after.get();
    queue->submit_read(ReadOp{file.get(), i * kBlock, in + i * kBlock, kBlock}, 100 + i);
  }
  before->drain();
  after->drain();
  EXPECT_TRUE(outcomes.failures().empty());
  EXPECT_EQ(std::memcmp(in, out, kBytes), 0);
  EXPECT_EQ(before->fixed_ops(), 16u);
  EXPECT_EQ(after->fixed_ops(), 16u);
  EXPECT_EQ(fs_->fixed_requests(), 32u);
  // Forgotten: from now on nothing goes as fixed, on either queue.
  fs_->unregister_buffers();
  before->submit_write(WriteOp{file.get(), 0, out, kBlock}, 200);
  after->submit_read(ReadOp{file.get(), 0, in, kBlock}, 201);
  before->drain();
  after->drain();
  EXPECT_EQ(before->fixed_ops() + after->fixed_ops(), 32u);
  EXPECT_TRUE(outcomes.failures().empty());
}

TEST_F(UringIoQueueTest, ARegistrationRefusedUnderTheMemlockLimitSaysSoAndIOGoesOn) {
  constexpr size_t kBytes = 1 << 20;
  auto memory = Aligned(kBytes);
  ASSERT_NE(memory, nullptr);
  Fill(memory.get(), kBytes, 6);
  // The queue first: a ring may count against the limit too, and this is about buffers.
  IoOutcomes outcomes;
  auto queue = Queue(4, outcomes.Callback());
  ASSERT_NE(queue, nullptr);
  rlimit old_limit{};
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &old_limit), 0);
  rlimit low = old_limit;
  low.rlim_cur = kBlock;
  ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &low), 0);
  const IoBuffer buffer{memory.get(), kBytes};
  const IoStatus registered = fs_->register_buffers(std::span<const IoBuffer>(&buffer, 1));
  ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &old_limit), 0);
  if (registered.ok()) GTEST_SKIP() << "pinning is not limited here (CAP_IPC_LOCK)";
  EXPECT_EQ(registered.error_number(), ENOMEM);
  EXPECT_NE(registered.message().find("RLIMIT_MEMLOCK"), std::string::npos) << registered.message();
  auto file = Open("limited");
  queue->submit_write(WriteOp{file.get(), 0, memory.get(), kBytes}, 1);
  queue->drain();
  EXPECT_TRUE(outcomes.failures().empty());
  EXPECT_EQ(queue->fixed_ops(), 0u);
}

TEST_F(UringIoQueueTest, AWriteToAReadOnlyFileFailsWithEbadfNamingTheFileAndOffset) {
  auto writable = Open("ro");
  auto read_only = Open("ro", /*write=*/false);
  std::vector<char> block(kBlock, 'x');
  IoOutcomes outcomes;
  auto queue = Queue(2, outcomes.Callback());
  ASSERT_NE(queue, nullptr);
  queue->submit_write(WriteOp{read_only.get(), 3 * kBlock, block.data(), kBlock}, 9);
  queue->drain();
  const auto failures = outcomes.failures();
  ASSERT_EQ(failures.count(9), 1u);
  EXPECT_EQ(failures.at(9).error_number(), EBADF);
  EXPECT_EQ(failures.at(9).message(),
            "write " + dir_ + "/ro at offset 12288: " + std::strerror(EBADF));
}

TEST_F(UringIoQueueTest, DestroyingAQueueWithRequestsOutstandingCompletesThemAll) {
  auto file = Open("outstanding");
  std::vector<char> block(kBlock, 'y');
  std::atomic<int> completed{0};
  {
    auto queue = Queue(2, [&](uint64_t, IoStatus status) {
      EXPECT_TRUE(status.ok()) << status.message();
      ++completed;
    });
    ASSERT_NE(queue, nullptr);
    for (uint64_t i = 0; i < 256; ++i) {
      queue->submit_write(WriteOp{file.get(), i * kBlock, block.data(), kBlock}, i);
    }
  }
  EXPECT_EQ(completed.load(), 256);
  uint64_t size = 0;
  ASSERT_TRUE(file->size(&size).ok());
  EXPECT_EQ(size, 256 * kBlock);
}

// io_uring hands buffered writes to tmpfs to one io-wq worker per ring, so writes to files in
// memory go to threads of their files instead: the two files' writes run off the ring's owner
// (which completes what the ring wrote, here a file on disk) and on more than one thread.
TEST_F(UringIoQueueTest, WritesToFilesInMemoryRunOnThreadsOfTheirFilesOffTheRing) {
  char shm[] = "/dev/shm/uring_queue_test_XXXXXX";
  if (::mkdtemp(shm) == nullptr) GTEST_SKIP() << "no /dev/shm here";
  const std::string memory_dir = shm;
  std::vector<std::unique_ptr<File>> files;
  for (const char* name : {"a", "b"}) {
    std::unique_ptr<File> file;
    ASSERT_TRUE(
        fs_->open(memory_dir + "/" + name, OpenOptions{.write = true, .create = true}, &file).ok());
    files.push_back(std::move(file));
  }
  auto on_disk = Open("disk");
  if (!files[0]->in_memory() || on_disk->in_memory()) {
    std::filesystem::remove_all(memory_dir);
    GTEST_SKIP() << "/dev/shm is not tmpfs, or the test directory is";
  }
  constexpr uint64_t kBlocks = 64;
  auto data = Aligned(kBlocks * kBlock);
  Fill(data.get(), kBlocks * kBlock, 5);
  std::mutex mu;
  std::set<std::thread::id> memory_threads;
  std::set<std::thread::id> disk_threads;
  auto callback = [&](uint64_t tag, IoStatus status) {
    EXPECT_TRUE(status.ok()) << status.message();
    std::lock_guard lock(mu);
    (tag % 3 == 2 ? disk_threads : memory_threads).insert(std::this_thread::get_id());
  };
  std::unique_ptr<UringIoQueue> queue;
  // Two file threads whatever the machine's CPUs, so that the two files may run apart.
  ASSERT_TRUE(UringIoQueue::Create(
                  UringIoQueueSettings{{16, callback}, nullptr, size_t{1} << 30, 2}, &queue)
                  .ok());
  File* targets[] = {files[0].get(), files[1].get(), on_disk.get()};
  for (uint64_t i = 0; i < kBlocks; ++i) {
    for (uint64_t f = 0; f < 3; ++f) {
      queue->submit_write(WriteOp{targets[f], i * kBlock, data.get() + i * kBlock, kBlock},
                          3 * i + f);
    }
  }
  queue->drain();
  EXPECT_EQ(queue->file_thread_requests(), 2 * kBlocks);
  ASSERT_EQ(disk_threads.size(), 1u);  // the ring's owner
  EXPECT_EQ(memory_threads.count(*disk_threads.begin()), 0u);
  EXPECT_GE(memory_threads.size(), 2u);
  std::vector<char> back(kBlocks * kBlock);
  for (File* file : targets) {
    ASSERT_TRUE(file->read_at(0, back.data(), back.size()).ok());
    EXPECT_EQ(std::memcmp(back.data(), data.get(), back.size()), 0) << file->path();
  }
  files.clear();
  std::filesystem::remove_all(memory_dir);
}

TEST_F(UringIoQueueTest, BadSettingsAreRefused) {
  std::unique_ptr<UringIoQueue> queue;
  auto callback = [](uint64_t, IoStatus) {};
  EXPECT_EQ(UringIoQueue::Create({{4, callback}, nullptr, 1000}, &queue).error_number(), EINVAL);
  EXPECT_EQ(UringIoQueue::Create({{0, callback}, nullptr}, &queue).error_number(), EINVAL);
  EXPECT_EQ(UringIoQueue::Create({{4, nullptr}, nullptr}, &queue).error_number(), EINVAL);
  EXPECT_EQ(queue, nullptr);
  ASSERT_TRUE(UringIoQueue::Create({{100000, callback}, nullptr}, &queue).ok());
  EXPECT_EQ(queue->depth(), 4096u);
}

}  // namespace
}  // namespace asyncckpt::io
