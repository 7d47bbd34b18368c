// The per-file IoQueue beyond the common contract: each file's requests run in submission order
// on one thread, different files run at once on threads of their own up to max_threads, and
// files beyond that share a thread.

#include "io/per_file_io_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/io/io_outcomes.h"

namespace asyncckpt::io {
namespace {

using testing_support::IoOutcomes;

// A File in memory of the test that records which thread wrote which offset, and can hold a
// write until another file's write has begun.
class RecordingFile final : public File {
 public:
  explicit RecordingFile(std::string path) : path_(std::move(path)) {}
  const std::string& path() const override { return path_; }
  bool is_direct() const override { return false; }
  IoStatus write_at(uint64_t offset, const void*, size_t) override {
    if (wait_for_ != nullptr) wait_for_->WaitUntilBegun();
    {
      std::lock_guard lock(mu_);
      writes_.push_back({std::this_thread::get_id(), offset});
      begun_ = true;
    }
    changed_.notify_all();
    if (fail_at_ == offset) return IoStatus(EIO, "write " + path_ + ": injected");
    return IoStatus::Ok();
  }
  IoStatus read_at(uint64_t, void*, size_t) override { return IoStatus::Ok(); }
  IoStatus sync() override { return IoStatus::Ok(); }
  IoStatus size(uint64_t* bytes) override {
    *bytes = 0;
    return IoStatus::Ok();
  }
  IoStatus truncate(uint64_t) override { return IoStatus::Ok(); }
  int fd() const override { return -1; }

  // Its writes wait until `other` has begun one.
  void HoldUntilBegun(RecordingFile* other) { wait_for_ = other; }
  void FailAt(uint64_t offset) { fail_at_ = offset; }
  void WaitUntilBegun() {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return begun_; });
  }
  std::vector<uint64_t> offsets() const {
    std::lock_guard lock(mu_);
    std::vector<uint64_t> out;
    for (const auto& w : writes_) out.push_back(w.offset);
    return out;
  }
  std::set<std::thread::id> threads() const {
    std::lock_guard lock(mu_);
    std::set<std::thread::id> out;
    for (const auto& w : writes_) out.insert(w.thread);
    return out;
  }

 private:
  struct Write {
    std::thread::id thread;
    uint64_t offset;
  };
  const std::string path_;
  RecordingFile* wait_for_ = nullptr;
  uint64_t fail_at_ = ~uint64_t{0};
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<Write> writes_;
  bool begun_ = false;
};

std::unique_ptr<IoQueue> Queue(unsigned depth, unsigned max_threads, IoCallback callback) {
  std::unique_ptr<IoQueue> queue;
  const IoStatus made =
      NewPerFileIoQueue(IoQueueOptions{depth, std::move(callback)}, max_threads, &queue);
  EXPECT_TRUE(made.ok()) << made.message();
  return queue;
}

TEST(PerFileIoQueueTest, EachFilesWritesRunInSubmissionOrderOffTheSubmittersThread) {
  RecordingFile a("a");
  RecordingFile b("b");
  IoOutcomes done;
  auto queue = Queue(64, 2, done.Callback());
  std::vector<uint64_t> expected;
  for (uint64_t i = 0; i < 200; ++i) {
    // Interleaved, and not in offset order: the order kept is the submitter's.
    const uint64_t offset = (i * 7919) % 1000;
    queue->submit_write(WriteOp{&a, offset, nullptr, 1}, 2 * i);
    queue->submit_write(WriteOp{&b, offset, nullptr, 1}, 2 * i + 1);
    expected.push_back(offset);
  }
  queue->drain();
  EXPECT_EQ(done.counts().size(), 400u);
  EXPECT_EQ(a.offsets(), expected);
  EXPECT_EQ(b.offsets(), expected);
  // A file that drains may move to another free thread; it never runs on the submitter's.
  EXPECT_EQ(a.threads().count(std::this_thread::get_id()), 0u);
  EXPECT_EQ(b.threads().count(std::this_thread::get_id()), 0u);
}

TEST(PerFileIoQueueTest, TwoFilesAreWrittenAtOnce) {
  // a's write waits until b's has begun: with one thread for both it would wait forever.
  RecordingFile a("a");
  RecordingFile b("b");
  a.HoldUntilBegun(&b);
  IoOutcomes done;
  auto queue = Queue(64, 2, done.Callback());
  queue->submit_write(WriteOp{&a, 0, nullptr, 1}, 0);
  queue->submit_write(WriteOp{&b, 0, nullptr, 1}, 1);
  queue->drain();
  EXPECT_EQ(done.counts().size(), 2u);
}

TEST(PerFileIoQueueTest, FilesBeyondMaxThreadsShareThemInOrder) {
  std::vector<std::unique_ptr<RecordingFile>> files;
  for (int i = 0; i < 5; ++i) files.push_back(std::make_unique<RecordingFile>(std::to_string(i)));
  IoOutcomes done;
  auto queue = Queue(64, 2, done.Callback());
  for (uint64_t i = 0; i < 50; ++i) {
    for (size_t f = 0; f < files.size(); ++f) {
      queue->submit_write(WriteOp{files[f].get(), i, nullptr, 1}, i * files.size() + f);
    }
  }
  queue->drain();
  EXPECT_EQ(done.counts().size(), 250u);
  std::set<std::thread::id> all;
  for (const auto& file : files) {
    EXPECT_EQ(file->offsets().size(), 50u);
    for (size_t i = 0; i < file->offsets().size(); ++i) EXPECT_EQ(file->offsets()[i], i);
    const std::set<std::thread::id> threads = file->threads();
    all.insert(threads.begin(), threads.end());
  }
  EXPECT_EQ(all.size(), 2u);
}

TEST(PerFileIoQueueTest, AFailedWriteReachesOnlyItsOwnCallback) {
  RecordingFile a("a");
  a.FailAt(3);
  IoOutcomes done;
  auto queue = Queue(8, 2, done.Callback());
  for (uint64_t i = 0; i < 6; ++i) queue->submit_write(WriteOp{&a, i, nullptr, 1}, i);
  queue->drain();
  EXPECT_EQ(done.counts().size(), 6u);
  const auto failures = done.failures();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_NE(failures.at(3).message().find("injected"), std::string::npos);
}

TEST(PerFileIoQueueTest, TheDestructorWaitsForEveryRequestAndCallbacksMaySubmitMore) {
  RecordingFile a("a");
  std::atomic<int> completed{0};
  IoQueue* self = nullptr;
  {
    auto queue = Queue(4, 2, [&](uint64_t tag, IoStatus) {
      if (tag < 20) self->submit_write(WriteOp{&a, tag + 1, nullptr, 1}, tag + 1);
      ++completed;
    });
    self = queue.get();
    queue->submit_write(WriteOp{&a, 0, nullptr, 1}, 0);
    queue->drain();
    EXPECT_EQ(completed.load(), 21);
    for (uint64_t tag = 100; tag < 140; ++tag) {
      queue->submit_write(WriteOp{&a, tag, nullptr, 1}, tag);
    }
  }
  EXPECT_EQ(completed.load(), 61);
}

TEST(PerFileIoQueueTest, ACallbackADepthAndAThreadAreRequired) {
  std::unique_ptr<IoQueue> queue;
  const IoCallback callback = [](uint64_t, IoStatus) {};
  EXPECT_EQ(NewPerFileIoQueue(IoQueueOptions{4, nullptr}, 2, &queue).error_number(), EINVAL);
  EXPECT_EQ(NewPerFileIoQueue(IoQueueOptions{0, callback}, 2, &queue).error_number(), EINVAL);
  EXPECT_EQ(NewPerFileIoQueue(IoQueueOptions{4, callback}, 0, &queue).error_number(), EINVAL);
  EXPECT_EQ(queue, nullptr);
}

}  // namespace
}  // namespace asyncckpt::io
