#include "io/fault_injection_file_system.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "asyncckpt/file_system.h"
#include "tests/io/exists_and_is_dir.h"

namespace asyncckpt::io {
namespace {

class FaultInjectionFileSystemTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "posix") {
      base_ = NewPosixFileSystem();
    } else {
      std::string why;
      base_ = NewUringFileSystem(IoOptions{}, &why);
      if (base_ == nullptr) GTEST_SKIP() << "io_uring unavailable: " << why;
    }
    fs_ = std::make_unique<FaultInjectionFileSystem>(base_.get());
    std::string pattern = ::testing::TempDir() + "/fault_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    root_ = pattern;
  }
  void TearDown() override {
    fs_.reset();
    if (!root_.empty()) std::filesystem::remove_all(root_);
  }

  std::string Path(const std::string& name) const { return root_ + "/" + name; }

  std::unique_ptr<File> Create(const std::string& name) {
    std::unique_ptr<File> file;
    OpenOptions options;
    options.write = options.create = options.truncate = true;
    IoStatus s = fs_->open(Path(name), options, &file);
    EXPECT_TRUE(s.ok()) << s.message();
    return file;
  }

  uint64_t SizeOf(const std::string& name) {
    uint64_t size = 0;
    IoStatus s = base_->file_size(Path(name), &size);
    EXPECT_TRUE(s.ok()) << s.message();
    return size;
  }

  bool Exists(const std::string& name) {
    bool exists = false, is_dir = false;
    EXPECT_TRUE(ExistsAndIsDir(*base_, Path(name), &exists, &is_dir).ok());
    return exists;
  }

  std::unique_ptr<FileSystem> base_;
  std::unique_ptr<FaultInjectionFileSystem> fs_;
  std::string root_;
};

TEST_P(FaultInjectionFileSystemTest, PassesThroughWithoutFaults) {
  EXPECT_EQ(fs_->name(), "fault_injection(" + GetParam() + ")");
  auto file = Create("a");
  ASSERT_TRUE(file->write_at(0, "hello", 5).ok());
  char back[5];
  ASSERT_TRUE(file->read_at(0, back, 5).ok());
  EXPECT_EQ(std::string(back, 5), "hello");
  EXPECT_EQ(file->fd(), -1);
  EXPECT_EQ(fs_->operation_count(), 3u);  // open, write, read
}

TEST_P(FaultInjectionFileSystemTest, NthOperationAndLaterFailWithErrnoNamingPath) {
  auto file = Create("data");
  fs_->fail_after(3, ENOSPC);
  EXPECT_TRUE(file->write_at(0, "a", 1).ok());
  EXPECT_TRUE(file->write_at(1, "b", 1).ok());
  IoStatus s = file->write_at(2, "c", 1);
  EXPECT_EQ(s.error_number(), ENOSPC);
  EXPECT_NE(s.message().find("write " + Path("data") + " at offset 2"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find(std::strerror(ENOSPC)), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("injected"), std::string::npos) << s.message();
  EXPECT_EQ(fs_->sync_dir(root_).error_number(), ENOSPC);
  EXPECT_EQ(SizeOf("data"), 2u);  // the failed write touched nothing
  fs_->clear_faults();
  EXPECT_TRUE(file->write_at(2, "c", 1).ok());
  EXPECT_EQ(fs_->operation_count(), 6u);
}

TEST_P(FaultInjectionFileSystemTest, UncountedOperationsNeverFail) {
  fs_->fail_after(1, EIO);
  std::vector<std::string> names;
  EXPECT_TRUE(fs_->list_dir(root_, &names).ok());
  bool exists, is_dir;
  EXPECT_TRUE(ExistsAndIsDir(*fs_, root_, &exists, &is_dir).ok());
  EXPECT_EQ(fs_->operation_count(), 0u);
  EXPECT_EQ(fs_->create_dir(Path("d")).error_number(), EIO);
  EXPECT_FALSE(Exists("d"));
}

TEST_P(FaultInjectionFileSystemTest, MatchingPathAndKindFail) {
  fs_->fail_ops_matching("index", EACCES, FaultOp::kSync | FaultOp::kRename);
  auto data = Create("data-0");
  auto index = Create("index");
  ASSERT_TRUE(index->write_at(0, "x", 1).ok());  // writes are not in the filter
  ASSERT_TRUE(data->sync().ok());
  IoStatus s = index->sync();
  EXPECT_EQ(s.error_number(), EACCES);
  EXPECT_NE(s.message().find("sync " + Path("index")), std::string::npos) << s.message();
  s = fs_->rename(Path("data-0"), Path("index2"));
  EXPECT_EQ(s.error_number(), EACCES);
  EXPECT_TRUE(Exists("data-0"));
  fs_->clear_faults();
  EXPECT_TRUE(index->sync().ok());
}

TEST_P(FaultInjectionFileSystemTest, DropUnsyncedDataTruncatesToSyncedLength) {
  auto file = Create("synced");
  ASSERT_TRUE(file->write_at(0, "durable", 7).ok());
  ASSERT_TRUE(file->sync().ok());
  ASSERT_TRUE(file->write_at(7, " and lost", 9).ok());
  auto never = Create("never_synced");
  ASSERT_TRUE(never->write_at(0, "gone", 4).ok());
  auto clean = Create("clean");
  ASSERT_TRUE(clean->write_at(0, "kept", 4).ok());
  ASSERT_TRUE(clean->sync().ok());
  file.reset();
  never.reset();
  clean.reset();

  IoStatus s = fs_->drop_unsynced_data();
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(SizeOf("synced"), 7u);
  EXPECT_FALSE(Exists("never_synced"));
  EXPECT_EQ(SizeOf("clean"), 4u);
  // Nothing is left to drop a second time.
  ASSERT_TRUE(fs_->drop_unsynced_data().ok());
  EXPECT_EQ(SizeOf("synced"), 7u);
}

TEST_P(FaultInjectionFileSystemTest, DropFollowsRenamedDirectories) {
  ASSERT_TRUE(fs_->create_dir(Path("tmp")).ok());
  auto file = Create("tmp/data");
  ASSERT_TRUE(file->write_at(0, "0123", 4).ok());
  ASSERT_TRUE(file->sync().ok());
  ASSERT_TRUE(file->write_at(4, "4567", 4).ok());
  file.reset();
  ASSERT_TRUE(fs_->rename(Path("tmp"), Path("final")).ok());
  ASSERT_TRUE(fs_->drop_unsynced_data().ok());
  EXPECT_EQ(SizeOf("final/data"), 4u);
}

TEST_P(FaultInjectionFileSystemTest, RemovedFilesAreForgotten) {
  auto file = Create("temp");
  ASSERT_TRUE(file->write_at(0, "x", 1).ok());
  file.reset();
  ASSERT_TRUE(fs_->remove_file(Path("temp")).ok());
  // A new file by the same name, created behind the wrapper's back, is not touched.
  auto again = base_->open(Path("temp"), OpenOptions{true, true, true, false}, &file);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(fs_->drop_unsynced_data().ok());
  EXPECT_TRUE(Exists("temp"));
}

TEST_P(FaultInjectionFileSystemTest, ConcurrentOperationsAreCounted) {
  constexpr int kThreads = 4, kWrites = 200;
  std::vector<std::unique_ptr<File>> files;
  for (int t = 0; t < kThreads; ++t) {
    // Appended, not `"c" + std::to_string(t)`: for that GCC 12 at -O3 reports an overlapping
    // memcpy of 2^63 bytes (-Wrestrict, a known false positive), which fails the Release build.
    std::string name = "c";
    name += std::to_string(t);
    files.push_back(Create(name));
  }
  uint64_t before = fs_->operation_count();
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kWrites; ++i) {
        if (!files[t]->write_at(static_cast<uint64_t>(i), "z", 1).ok()) ++failures[t];
        if (i % 50 == 0 && !files[t]->sync().ok()) ++failures[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0);
  EXPECT_EQ(fs_->operation_count(), before + kThreads * (kWrites + kWrites / 50));
}

TEST_P(FaultInjectionFileSystemTest, AllocationIsDroppedByACrashUnlessSynced) {
  auto kept = Create("kept");
  auto lost = Create("lost");
  for (File* file : {kept.get(), lost.get()}) {
    IoStatus s = file->allocate(0, 8192);
    if (s.error_number() == ENOTSUP) GTEST_SKIP() << "no fallocate here: " << s.message();
    ASSERT_TRUE(s.ok()) << s.message();
  }
  ASSERT_TRUE(kept->sync().ok());
  fs_->fail_ops_matching("lost", ENOSPC, FaultOp::kAllocate);
  IoStatus s = lost->allocate(0, 1 << 20);
  EXPECT_EQ(s.error_number(), ENOSPC);
  EXPECT_NE(s.message().find("allocate " + Path("lost") + " at offset 0"), std::string::npos)
      << s.message();
  EXPECT_EQ(SizeOf("lost"), 8192u);  // the failed call reserved nothing
  kept.reset();
  lost.reset();
  ASSERT_TRUE(fs_->drop_unsynced_data().ok());
  EXPECT_EQ(SizeOf("kept"), 8192u);
  EXPECT_FALSE(Exists("lost"));
}

TEST_P(FaultInjectionFileSystemTest, EveryKindOfOperationASaveUsesIsCountedAndCanFail) {
  auto file = Create("f");
  ASSERT_TRUE(file->write_at(0, "0123456789", 10).ok());
  ASSERT_TRUE(fs_->create_dir(Path("d")).ok());
  char byte;
  std::unique_ptr<FileLock> lock;
  std::unique_ptr<File> opened;
  // One call of each counted kind, as a full save makes them.
  const std::vector<std::pair<std::string, std::function<IoStatus()>>> calls = {
      {"open", [&] { return fs_->open(Path("f"), OpenOptions{}, &opened); }},
      {"write_at", [&] { return file->write_at(0, "x", 1); }},
      {"read_at", [&] { return file->read_at(0, &byte, 1); }},
      {"sync", [&] { return file->sync(); }},
      {"truncate", [&] { return file->truncate(10); }},
      {"allocate", [&] { return file->allocate(0, 1 << 20); }},
      {"create_dir", [&] { return fs_->create_dir(Path("d2")); }},
      {"create_dirs", [&] { return fs_->create_dirs(Path("d3/e")); }},
      {"rename", [&] { return fs_->rename(Path("d"), Path("d4")); }},
      {"exchange", [&] { return fs_->exchange(Path("d"), Path("f")); }},
      {"remove_file", [&] { return fs_->remove_file(Path("f")); }},
      {"remove_tree", [&] { return fs_->remove_tree(Path("d")); }},
      {"sync_dir", [&] { return fs_->sync_dir(root_); }},
      {"lock_file", [&] { return fs_->lock_file(Path("model.ckpt.lock"), &lock); }},
  };
  for (const auto& [what, call] : calls) {
    SCOPED_TRACE(what);
    const uint64_t count = fs_->operation_count();
    const uint64_t injected = fs_->injected_count();
    fs_->fail_at(1, EIO);
    IoStatus s = call();
    EXPECT_EQ(s.error_number(), EIO) << s.message();
    EXPECT_NE(s.message().find("(injected fault)"), std::string::npos) << s.message();
    EXPECT_EQ(fs_->operation_count(), count + 1);
    EXPECT_EQ(fs_->injected_count(), injected + 1);
  }
  // Nothing happened underneath.
  EXPECT_TRUE(Exists("f"));
  EXPECT_TRUE(Exists("d"));
  EXPECT_FALSE(Exists("d2"));
  EXPECT_FALSE(Exists("d4"));
  EXPECT_FALSE(Exists("model.ckpt.lock"));
  EXPECT_EQ(SizeOf("f"), 10u);
}

TEST_P(FaultInjectionFileSystemTest, FailAtFailsOnlyThatOperation) {
  auto file = Create("once");
  fs_->fail_at(2, EIO);
  EXPECT_TRUE(file->write_at(0, "a", 1).ok());
  EXPECT_EQ(file->write_at(1, "b", 1).error_number(), EIO);
  EXPECT_TRUE(file->write_at(1, "b", 1).ok());
  EXPECT_TRUE(file->sync().ok());
  EXPECT_EQ(fs_->injected_count(), 1u);
  EXPECT_EQ(SizeOf("once"), 2u);
}

TEST_P(FaultInjectionFileSystemTest, ShortWriteWritesTheFirstHalfThenFails) {
  auto file = Create("full");
  fs_->fail_after(1, ENOSPC, FaultMode::kShortTransfer);
  IoStatus s = file->write_at(0, "0123456789", 10);
  EXPECT_EQ(s.error_number(), ENOSPC);
  EXPECT_EQ(s.message(), "write " + Path("full") + " at offset 0: " + std::strerror(ENOSPC) +
                             " (injected fault after 5 of 10 bytes)");
  EXPECT_EQ(SizeOf("full"), 5u);
  // A disk that stays full: the next write fails too, after its own half.
  EXPECT_EQ(file->write_at(5, "abcd", 4).error_number(), ENOSPC);
  EXPECT_EQ(SizeOf("full"), 7u);
  // Other kinds fail plainly.
  s = fs_->sync_dir(root_);
  EXPECT_EQ(s.error_number(), ENOSPC);
  EXPECT_EQ(s.message().find("after"), std::string::npos) << s.message();
  fs_->clear_faults();
  // The half that was written is unsynced like any write: a crash drops it.
  file.reset();
  ASSERT_TRUE(fs_->drop_unsynced_data().ok());
  EXPECT_FALSE(Exists("full"));
}

TEST_P(FaultInjectionFileSystemTest, ShortReadReadsTheFirstHalfThenFails) {
  auto file = Create("r");
  ASSERT_TRUE(file->write_at(0, "abcdefgh", 8).ok());
  std::string back(8, '.');
  fs_->fail_at(1, EIO, FaultMode::kShortTransfer);
  IoStatus s = file->read_at(0, back.data(), 8);
  EXPECT_EQ(s.error_number(), EIO);
  EXPECT_NE(s.message().find("after 4 of 8 bytes"), std::string::npos) << s.message();
  EXPECT_EQ(back, "abcd....");
}

TEST_P(FaultInjectionFileSystemTest, ShortTransferOnADirectFileKeepsWholeBlocks) {
  std::unique_ptr<File> file;
  OpenOptions options;
  options.write = options.create = options.truncate = options.direct = true;
  ASSERT_TRUE(fs_->open(Path("direct"), options, &file).ok());
  if (!file->is_direct()) GTEST_SKIP() << "O_DIRECT is not supported here";
  constexpr size_t kBytes = 3 * 4096;
  void* raw = nullptr;
  ASSERT_EQ(::posix_memalign(&raw, 4096, kBytes), 0);
  std::unique_ptr<void, decltype(&std::free)> buffer(raw, &std::free);
  std::memset(raw, 'z', kBytes);
  fs_->fail_at(1, ENOSPC, FaultMode::kShortTransfer);
  IoStatus s = file->write_at(0, raw, kBytes);
  EXPECT_EQ(s.error_number(), ENOSPC);
  EXPECT_NE(s.message().find("after 4096 of 12288 bytes"), std::string::npos) << s.message();
  EXPECT_EQ(SizeOf("direct"), 4096u);
}

TEST_P(FaultInjectionFileSystemTest, MatchingRulesCanBeShortTransfers) {
  fs_->fail_ops_matching("data-", ENOSPC, FaultOp::kWrite, FaultMode::kShortTransfer);
  auto data = Create("data-00000-of-00001");
  auto index = Create("index");
  EXPECT_TRUE(index->write_at(0, "12", 2).ok());
  EXPECT_EQ(data->write_at(0, "12", 2).error_number(), ENOSPC);
  EXPECT_EQ(SizeOf("data-00000-of-00001"), 1u);
}

TEST_P(FaultInjectionFileSystemTest, LocksPassThroughAndConflictWithTheTargetsOwn) {
  std::unique_ptr<FileLock> through_wrapper, direct;
  ASSERT_TRUE(fs_->lock_file(Path("x.lock"), &through_wrapper).ok());
  EXPECT_EQ(base_->lock_file(Path("x.lock"), &direct).error_number(), EWOULDBLOCK);
  through_wrapper.reset();
  EXPECT_TRUE(base_->lock_file(Path("x.lock"), &direct).ok());
  fs_->fail_ops_matching("x.lock", ENOLCK, FaultOp::kLock);
  IoStatus s = fs_->lock_file(Path("y/x.lock"), &through_wrapper);
  EXPECT_EQ(s.error_number(), ENOLCK);
  EXPECT_EQ(s.message(),
            "lock " + Path("y/x.lock") + ": " + std::strerror(ENOLCK) + " (injected fault)");
}

// Outcomes of a queue's requests, by tag.
class QueueOutcomes {
 public:
  IoCallback Callback() {
    return [this](uint64_t tag, IoStatus status) {
      std::lock_guard lock(mu_);
      outcomes_.emplace(tag, std::move(status));
    };
  }
  std::map<uint64_t, IoStatus> get() const {
    std::lock_guard lock(mu_);
    return outcomes_;
  }

 private:
  mutable std::mutex mu_;
  std::map<uint64_t, IoStatus> outcomes_;
};

TEST_P(FaultInjectionFileSystemTest, QueuedWritesAreCountedInSubmissionOrderAndFailLikeWriteAt) {
  auto file = Create("queued");
  QueueOutcomes outcomes;
  std::unique_ptr<IoQueue> queue;
  ASSERT_TRUE(fs_->new_io_queue(IoQueueOptions{4, outcomes.Callback()}, &queue).ok());
  // The target's own queue does the I/O: the io_uring one keeps it in its ring.
  EXPECT_EQ(queue->name(),
            GetParam() == "posix" ? "fault_injection(thread_pool)" : "fault_injection(io_uring)");
  const uint64_t before = fs_->operation_count();
  fs_->fail_at(2, ENOSPC);
  const std::string chunks[] = {"aaaa", "bbbb", "cccc"};
  for (uint64_t i = 0; i < 3; ++i) {
    queue->submit_write(WriteOp{file.get(), i * 4, chunks[i].data(), 4}, 10 + i);
  }
  queue->drain();
  EXPECT_EQ(fs_->operation_count(), before + 3);
  EXPECT_EQ(fs_->injected_count(), 1u);
  const auto got = outcomes.get();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(got.at(10).ok()) << got.at(10).message();
  EXPECT_TRUE(got.at(12).ok()) << got.at(12).message();
  EXPECT_EQ(got.at(11).error_number(), ENOSPC);
  EXPECT_EQ(got.at(11).message(), "write " + Path("queued") + " at offset 4: " +
                                      std::strerror(ENOSPC) + " (injected fault)");
  // The hit request wrote nothing: its bytes are a hole.
  std::string back(12, '.');
  ASSERT_TRUE(file->read_at(0, back.data(), 12).ok());
  EXPECT_EQ(back, std::string("aaaa") + std::string(4, '\0') + "cccc");
}

TEST_P(FaultInjectionFileSystemTest, AQueuedShortTransferMovesItsFirstHalfThenFails) {
  auto file = Create("half");
  QueueOutcomes outcomes;
  std::unique_ptr<IoQueue> queue;
  ASSERT_TRUE(fs_->new_io_queue(IoQueueOptions{2, outcomes.Callback()}, &queue).ok());
  fs_->fail_at(1, ENOSPC, FaultMode::kShortTransfer);
  queue->submit_write(WriteOp{file.get(), 0, "0123456789", 10}, 1);
  queue->drain();
  EXPECT_EQ(outcomes.get().at(1).message(), "write " + Path("half") +
                                                " at offset 0: " + std::strerror(ENOSPC) +
                                                " (injected fault after 5 of 10 bytes)");
  EXPECT_EQ(SizeOf("half"), 5u);
  // Reads too: the first half lands in the buffer, the rest stays untouched.
  std::string back(4, '.');
  fs_->fail_at(1, EIO, FaultMode::kShortTransfer);
  queue->submit_read(ReadOp{file.get(), 0, back.data(), 4}, 2);
  queue->drain();
  EXPECT_EQ(outcomes.get().at(2).error_number(), EIO);
  EXPECT_EQ(back, "01..");
}

TEST_P(FaultInjectionFileSystemTest, QueuedReadsMatchRulesAndQueuedWritesAreDroppedByACrash) {
  auto file = Create("crash");
  QueueOutcomes outcomes;
  std::unique_ptr<IoQueue> queue;
  ASSERT_TRUE(fs_->new_io_queue(IoQueueOptions{2, outcomes.Callback()}, &queue).ok());
  fs_->fail_ops_matching("crash", EIO, FaultOp::kRead);
  queue->submit_write(WriteOp{file.get(), 0, "data", 4}, 1);
  queue->drain();
  char back[4];
  queue->submit_read(ReadOp{file.get(), 0, back, 4}, 2);
  queue->drain();
  const auto got = outcomes.get();
  EXPECT_TRUE(got.at(1).ok()) << got.at(1).message();
  EXPECT_EQ(got.at(2).error_number(), EIO);
  EXPECT_EQ(SizeOf("crash"), 4u);
  // The queued write made the file dirty: never synced, a crash removes it.
  queue.reset();
  file.reset();
  ASSERT_TRUE(fs_->drop_unsynced_data().ok());
  EXPECT_FALSE(Exists("crash"));
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultInjectionFileSystemTest,
                         ::testing::Values("posix", "io_uring"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace asyncckpt::io
