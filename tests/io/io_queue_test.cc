// The IoQueue contract (include/asyncckpt/file_system.h), for every backend's queue (io_uring's
// also with its files in memory, which it writes from threads per file): each
// request completes exactly once with its tag, no more than depth() are in flight, failures go
// to the failing request's callback only, callbacks may submit more, drain() and the destructor
// wait for everything.

#include <fcntl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
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
#include "io/fault_injection_file_system.h"
#include "io/thread_pool_io_queue.h"
#include "io/uring_file_system.h"
#include "tests/io/io_outcomes.h"

namespace asyncckpt::io {
namespace {

using testing_support::IoOutcomes;

namespace fs = std::filesystem;

constexpr size_t kBlock = 4096;

// A File that counts the requests running in it at once and can hold them at a gate.
class GateFile final : public File {
 public:
  explicit GateFile(std::unique_ptr<File> target) : target_(std::move(target)) {}
  const std::string& path() const override { return target_->path(); }
  bool is_direct() const override { return target_->is_direct(); }
  IoStatus write_at(uint64_t offset, const void* data, size_t n) override {
    Enter();
    IoStatus status = target_->write_at(offset, data, n);
    Leave();
    return status;
  }
  IoStatus read_at(uint64_t offset, void* data, size_t n) override {
    Enter();
    IoStatus status = target_->read_at(offset, data, n);
    Leave();
    return status;
  }
  IoStatus sync() override { return target_->sync(); }
  IoStatus size(uint64_t* bytes) override { return target_->size(bytes); }
  IoStatus truncate(uint64_t bytes) override { return target_->truncate(bytes); }
  int fd() const override { return -1; }  // so that no backend bypasses write_at / read_at

  void Close() {
    std::lock_guard lock(mu_);
    open_ = false;
  }
  void Open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    changed_.notify_all();
  }
  void WaitForInside(int n) {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return inside_ >= n; });
  }
  int inside() const {
    std::lock_guard lock(mu_);
    return inside_;
  }
  int most_inside() const {
    std::lock_guard lock(mu_);
    return most_inside_;
  }

 private:
  void Enter() {
    std::unique_lock lock(mu_);
    ++inside_;
    most_inside_ = std::max(most_inside_, inside_);
    changed_.notify_all();
    changed_.wait(lock, [&] { return open_; });
  }
  void Leave() {
    std::lock_guard lock(mu_);
    --inside_;
  }

  std::unique_ptr<File> target_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  bool open_ = true;
  int inside_ = 0;
  int most_inside_ = 0;
};

// How a test gets a queue: through a backend's FileSystem::new_io_queue.
struct Backend {
  std::string name;
  std::unique_ptr<FileSystem> (*make)();
  // Where its files go: /dev/shm puts the io_uring queue's writes on threads per file.
  std::string root = "/tmp";
};

// A FaultInjectionFileSystem (with no faults set) that owns its target, so that a Backend can
// hand one out: the wrapper's queue must keep the contract too.
class OwningFaultFileSystem final : public FileSystemWrapper {
 public:
  static std::unique_ptr<FileSystem> Make(std::unique_ptr<FileSystem> base) {
    if (base == nullptr) return nullptr;
    auto fault = std::make_unique<FaultInjectionFileSystem>(base.get());
    FileSystem* front = fault.get();
    return std::unique_ptr<FileSystem>(
        new OwningFaultFileSystem(front, std::move(base), std::move(fault)));
  }

 private:
  OwningFaultFileSystem(FileSystem* front, std::unique_ptr<FileSystem> base,
                        std::unique_ptr<FaultInjectionFileSystem> fault)
      : FileSystemWrapper(front), base_(std::move(base)), fault_(std::move(fault)) {}
  std::unique_ptr<FileSystem> base_;
  std::unique_ptr<FaultInjectionFileSystem> fault_;
};

std::unique_ptr<FileSystem> MakePosix() { return NewPosixFileSystem(); }
// Null where io_uring is unavailable: the test skips.
std::unique_ptr<FileSystem> MakeUring() { return NewUringFileSystem(IoOptions{}, nullptr); }
std::unique_ptr<FileSystem> MakeFaultPosix() {
  return OwningFaultFileSystem::Make(NewPosixFileSystem());
}
std::unique_ptr<FileSystem> MakeFaultUring() { return OwningFaultFileSystem::Make(MakeUring()); }

class IoQueueTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    fs_ = GetParam().make();
    if (fs_ == nullptr) GTEST_SKIP() << "io_uring unavailable here";
    std::string pattern = GetParam().root + "/io_queue_test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) GTEST_SKIP() << "no " << GetParam().root << " here";
    dir_ = pattern;
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  std::unique_ptr<File> Open(const std::string& name, bool write) {
    std::unique_ptr<File> file;
    OpenOptions options;
    options.write = write;
    options.create = write;
    EXPECT_TRUE(fs_->open(dir_ + "/" + name, options, &file).ok());
    return file;
  }

  std::unique_ptr<IoQueue> Queue(unsigned depth, IoCallback callback) {
    std::unique_ptr<IoQueue> queue;
    const IoStatus made = fs_->new_io_queue(IoQueueOptions{depth, std::move(callback)}, &queue);
    EXPECT_TRUE(made.ok()) << made.message();
    return queue;
  }

  static std::vector<uint8_t> Block(uint64_t tag) {
    std::vector<uint8_t> block(kBlock);
    for (size_t i = 0; i < kBlock; ++i) block[i] = static_cast<uint8_t>(tag * 31 + i);
    return block;
  }

  std::unique_ptr<FileSystem> fs_;
  std::string dir_;
};

TEST_P(IoQueueTest, EveryWriteCompletesOnceWithItsTagAndLandsWhereItWasAimed) {
  constexpr uint64_t kWrites = 200;
  auto file = Open("data", true);
  std::vector<std::vector<uint8_t>> blocks;
  for (uint64_t tag = 0; tag < kWrites; ++tag) blocks.push_back(Block(tag));
  IoOutcomes done;
  auto queue = Queue(4, done.Callback());
  for (uint64_t tag = 0; tag < kWrites; ++tag) {
    queue->submit_write(WriteOp{file.get(), tag * kBlock, blocks[tag].data(), kBlock}, tag);
  }
  queue->drain();
  const auto counts = done.counts();
  ASSERT_EQ(counts.size(), kWrites);
  for (const auto& [tag, count] : counts) EXPECT_EQ(count, 1) << "tag " << tag;
  EXPECT_TRUE(done.failures().empty());
  std::vector<uint8_t> back(kBlock);
  for (uint64_t tag = 0; tag < kWrites; ++tag) {
    ASSERT_TRUE(file->read_at(tag * kBlock, back.data(), kBlock).ok());
    ASSERT_EQ(back, blocks[tag]) << "block " << tag;
  }
}

TEST_P(IoQueueTest, ReadsFillTheirBuffersAndAReadPastTheEndFailsAloneNamingTheFile) {
  auto file = Open("data", true);
  const std::vector<uint8_t> block = Block(7);
  ASSERT_TRUE(file->write_at(0, block.data(), kBlock).ok());
  std::vector<uint8_t> first(kBlock), past(kBlock);
  IoOutcomes done;
  auto queue = Queue(2, done.Callback());
  queue->submit_read(ReadOp{file.get(), 0, first.data(), kBlock}, 1);
  queue->submit_read(ReadOp{file.get(), kBlock / 2, past.data(), kBlock}, 2);
  queue->drain();
  EXPECT_EQ(first, block);
  const auto failures = done.failures();
  ASSERT_EQ(failures.size(), 1u);
  ASSERT_EQ(failures.count(2), 1u);
  EXPECT_EQ(failures.at(2).error_number(), EIO);
  EXPECT_NE(failures.at(2).message().find("unexpected end of file"), std::string::npos)
      << failures.at(2).message();
  EXPECT_NE(failures.at(2).message().find(dir_ + "/data"), std::string::npos);
}

TEST_P(IoQueueTest, AFailedWriteReachesOnlyItsOwnCallback) {
  auto writable = Open("data", true);
  auto read_only = Open("data", false);
  const std::vector<uint8_t> block = Block(1);
  IoOutcomes done;
  auto queue = Queue(4, done.Callback());
  queue->submit_write(WriteOp{writable.get(), 0, block.data(), kBlock}, 10);
  queue->submit_write(WriteOp{read_only.get(), kBlock, block.data(), kBlock}, 11);
  queue->submit_write(WriteOp{writable.get(), 2 * kBlock, block.data(), kBlock}, 12);
  queue->drain();
  EXPECT_EQ(done.counts().size(), 3u);
  const auto failures = done.failures();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures.count(11), 1u);
  EXPECT_EQ(failures.at(11).error_number(), EBADF) << failures.at(11).message();
}

TEST_P(IoQueueTest, NoMoreThanDepthRequestsAreInFlightAndTheRestWait) {
  constexpr unsigned kDepth = 3;
  auto gate = std::make_unique<GateFile>(Open("data", true));
  gate->Close();
  const std::vector<uint8_t> block = Block(2);
  IoOutcomes done;
  auto queue = Queue(kDepth, done.Callback());
  for (uint64_t tag = 0; tag < 12; ++tag) {
    queue->submit_write(WriteOp{gate.get(), tag * kBlock, block.data(), kBlock}, tag);
  }
  gate->WaitForInside(kDepth);
  // Every submit returned although the gate holds the requests: submitting never waits.
  EXPECT_EQ(gate->inside(), static_cast<int>(kDepth));
  EXPECT_TRUE(done.counts().empty());
  gate->Open();
  queue->drain();
  EXPECT_EQ(done.counts().size(), 12u);
  EXPECT_LE(gate->most_inside(), static_cast<int>(kDepth));
}

TEST_P(IoQueueTest, ACallbackMaySubmitMoreAndDrainWaitsForThemToo) {
  auto file = Open("data", true);
  const std::vector<uint8_t> block = Block(3);
  std::atomic<int> completed{0};
  IoQueue* queue_ptr = nullptr;
  auto queue = Queue(2, [&](uint64_t tag, IoStatus status) {
    EXPECT_TRUE(status.ok()) << status.message();
    if (tag < 50) {
      queue_ptr->submit_write(WriteOp{file.get(), (tag + 1) * kBlock, block.data(), kBlock},
                              tag + 1);
    }
    ++completed;
  });
  queue_ptr = queue.get();
  queue->submit_write(WriteOp{file.get(), 0, block.data(), kBlock}, 0);
  queue->drain();
  EXPECT_EQ(completed.load(), 51);
}

TEST_P(IoQueueTest, TheDestructorWaitsForEveryRequest) {
  auto file = Open("data", true);
  const std::vector<uint8_t> block = Block(4);
  std::atomic<int> completed{0};
  {
    auto queue = Queue(4, [&](uint64_t, IoStatus) { ++completed; });
    for (uint64_t tag = 0; tag < 64; ++tag) {
      queue->submit_write(WriteOp{file.get(), tag * kBlock, block.data(), kBlock}, tag);
    }
  }
  EXPECT_EQ(completed.load(), 64);
}

TEST_P(IoQueueTest, EmptyRequestsCompleteAndTheirCallbacksMaySubmitMore) {
  // Nothing to transfer: the queue completes them itself, still on its own thread, and a
  // submission from that callback must not be left waiting for a wake-up.
  std::atomic<int> completed{0};
  IoQueue* queue_ptr = nullptr;
  auto file = Open("data", true);
  auto queue = Queue(2, [&](uint64_t tag, IoStatus status) {
    EXPECT_TRUE(status.ok()) << status.message();
    if (tag < 50) queue_ptr->submit_write(WriteOp{file.get(), 0, nullptr, 0}, tag + 1);
    ++completed;
  });
  queue_ptr = queue.get();
  queue->submit_read(ReadOp{file.get(), 0, nullptr, 0}, 0);
  queue->drain();
  EXPECT_EQ(completed.load(), 51);
}

TEST_P(IoQueueTest, RequestsFromManyThreadsOnManyFilesAllLand) {
  constexpr int kThreads = 4;
  constexpr uint64_t kPerThread = 64;
  std::vector<std::unique_ptr<File>> files;
  for (int t = 0; t < kThreads; ++t) files.push_back(Open("data-" + std::to_string(t), true));
  std::vector<std::vector<uint8_t>> blocks;
  for (uint64_t tag = 0; tag < kThreads * kPerThread; ++tag) blocks.push_back(Block(tag));
  IoOutcomes done;
  auto queue = Queue(8, done.Callback());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < kPerThread; ++i) {
        const uint64_t tag = t * kPerThread + i;
        // Each thread writes every file, so requests for one file come from all of them.
        File* file = files[(t + i) % kThreads].get();
        queue->submit_write(WriteOp{file, tag * kBlock, blocks[tag].data(), kBlock}, tag);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  queue->drain();
  EXPECT_EQ(done.counts().size(), kThreads * kPerThread);
  EXPECT_TRUE(done.failures().empty());
  std::vector<uint8_t> back(kBlock);
  for (uint64_t tag = 0; tag < kThreads * kPerThread; ++tag) {
    File* file = files[(tag / kPerThread + tag % kPerThread) % kThreads].get();
    ASSERT_TRUE(file->read_at(tag * kBlock, back.data(), kBlock).ok());
    ASSERT_EQ(back, blocks[tag]) << "block " << tag;
  }
}

TEST_P(IoQueueTest, ACallbackAndADepthAreRequired) {
  std::unique_ptr<IoQueue> queue;
  EXPECT_EQ(fs_->new_io_queue(IoQueueOptions{4, nullptr}, &queue).error_number(), EINVAL);
  EXPECT_EQ(fs_->new_io_queue(IoQueueOptions{0, [](uint64_t, IoStatus) {}}, &queue).error_number(),
            EINVAL);
  EXPECT_EQ(queue, nullptr);
}

INSTANTIATE_TEST_SUITE_P(Backends, IoQueueTest,
                         ::testing::Values(Backend{"Posix", &MakePosix},
                                           Backend{"Uring", &MakeUring},
                                           Backend{"UringInMemory", &MakeUring, "/dev/shm"},
                                           Backend{"FaultInjectionOverPosix", &MakeFaultPosix},
                                           Backend{"FaultInjectionOverUring", &MakeFaultUring}),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param.name;
                         });

TEST(FileSystemWrapperTest, ForwardsQueuesAndBufferRegistrationToItsTarget) {
  auto posix = NewPosixFileSystem();
  FileSystemWrapper wrapper(posix.get());
  std::unique_ptr<IoQueue> queue;
  ASSERT_TRUE(wrapper.new_io_queue(IoQueueOptions{2, [](uint64_t, IoStatus) {}}, &queue).ok());
  EXPECT_EQ(queue->name(), "thread_pool");
  std::vector<uint8_t> memory(kBlock);
  const IoBuffer buffer{memory.data(), memory.size()};
  // POSIX has no use for registered buffers: the default answer, forwarded.
  EXPECT_EQ(wrapper.register_buffers(std::span<const IoBuffer>(&buffer, 1)).error_number(),
            ENOTSUP);
}

}  // namespace
}  // namespace asyncckpt::io
