#include "io/fault_injection_file_system.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/file_system.h"

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
    EXPECT_TRUE(base_->stat(Path(name), &exists, &is_dir).ok());
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
  EXPECT_TRUE(fs_->stat(root_, &exists, &is_dir).ok());
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

TEST_P(FaultInjectionFileSystemTest, BatchCountsEachOpAndPerformsOnlyThoseBefore) {
  auto file = Create("batch");
  std::vector<std::string> chunks = {"aaaa", "bbbb", "cccc", "dddd"};
  std::vector<WriteOp> writes;
  for (size_t i = 0; i < chunks.size(); ++i) {
    writes.push_back({file.get(), i * 4, chunks[i].data(), 4});
  }
  uint64_t before = fs_->operation_count();
  fs_->fail_after(3, EIO);
  IoStatus s = fs_->write_batch(writes);
  EXPECT_EQ(s.error_number(), EIO);
  EXPECT_NE(s.message().find(Path("batch") + " at offset 8"), std::string::npos) << s.message();
  EXPECT_EQ(fs_->operation_count(), before + 3);
  EXPECT_EQ(SizeOf("batch"), 8u);
  fs_->clear_faults();
  ASSERT_TRUE(fs_->write_batch(writes).ok());
  std::string back(16, '\0');
  std::vector<ReadOp> reads = {{file.get(), 0, back.data(), 16}};
  fs_->fail_ops_matching("batch", EBADMSG, FaultOp::kRead);
  EXPECT_EQ(fs_->read_batch(reads).error_number(), EBADMSG);
  fs_->clear_faults();
  ASSERT_TRUE(fs_->read_batch(reads).ok());
  EXPECT_EQ(back, "aaaabbbbccccdddd");
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
  for (int t = 0; t < kThreads; ++t) files.push_back(Create("c" + std::to_string(t)));
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

INSTANTIATE_TEST_SUITE_P(Backends, FaultInjectionFileSystemTest,
                         ::testing::Values("posix", "io_uring"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace asyncckpt::io
