// Behaviour every backend shares: files, directories, errors. Runs against the POSIX backend
// and, where a ring can be set up, the io_uring one (which reuses the POSIX file handling).

#include "io/posix_file_system.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "tests/io/exists_and_is_dir.h"
#include "tests/support/watchdog.h"

namespace asyncckpt::io {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

std::vector<char> Pattern(size_t n, unsigned seed) {
  std::vector<char> bytes(n);
  uint32_t x = seed * 2654435761u + 1;
  for (char& b : bytes) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<char>(x >> 24);
  }
  return bytes;
}

std::string ReadHostFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteHostFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

class FileSystemTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "posix") {
      fs_ = NewPosixFileSystem();
    } else {
      std::string why;
      fs_ = NewUringFileSystem(IoOptions{}, &why);
      if (fs_ == nullptr) GTEST_SKIP() << "io_uring unavailable: " << why;
    }
    std::string pattern = ::testing::TempDir() + "/fs_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    root_ = pattern;
  }
  void TearDown() override {
    if (!root_.empty()) std::filesystem::remove_all(root_);
  }

  std::string Path(const std::string& name) const { return root_ + "/" + name; }

  std::unique_ptr<File> OpenForWrite(const std::string& path) {
    std::unique_ptr<File> file;
    OpenOptions options;
    options.write = options.create = options.truncate = true;
    IoStatus s = fs_->open(path, options, &file);
    EXPECT_TRUE(s.ok()) << s.message();
    return file;
  }

  std::unique_ptr<File> OpenForRead(const std::string& path) {
    std::unique_ptr<File> file;
    IoStatus s = fs_->open(path, OpenOptions{}, &file);
    EXPECT_TRUE(s.ok()) << s.message();
    return file;
  }

  std::unique_ptr<FileSystem> fs_;
  std::string root_;
};

TEST_P(FileSystemTest, WriteThenReadRoundTripsOddSizes) {
  for (size_t n : {size_t{1}, size_t{4095}, size_t{4097}, size_t{100000}}) {
    std::string path = Path("f" + std::to_string(n));
    std::vector<char> data = Pattern(n, static_cast<unsigned>(n));
    {
      auto file = OpenForWrite(path);
      ASSERT_NE(file, nullptr);
      EXPECT_EQ(file->path(), path);
      ASSERT_TRUE(file->write_at(0, data.data(), n).ok());
      ASSERT_TRUE(file->sync().ok());
      uint64_t size = 0;
      ASSERT_TRUE(file->size(&size).ok());
      EXPECT_EQ(size, n);
    }
    auto file = OpenForRead(path);
    ASSERT_NE(file, nullptr);
    std::vector<char> back(n);
    IoStatus s = file->read_at(0, back.data(), n);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(back, data);
    uint64_t size = 0;
    ASSERT_TRUE(fs_->file_size(path, &size).ok());
    EXPECT_EQ(size, n);
  }
}

TEST_P(FileSystemTest, WriteAtOffsetLeavesAHoleOfZeros) {
  auto file = OpenForWrite(Path("holes"));
  ASSERT_TRUE(file->write_at(8192, "abc", 3).ok());
  char back[8195];
  ASSERT_TRUE(file->read_at(0, back, sizeof(back)).ok());
  EXPECT_TRUE(std::all_of(back, back + 8192, [](char c) { return c == 0; }));
  EXPECT_EQ(std::string(back + 8192, 3), "abc");
}

TEST_P(FileSystemTest, ReadPastEndIsEioNamingPathAndOffset) {
  std::string path = Path("short");
  auto file = OpenForWrite(path);
  ASSERT_TRUE(file->write_at(0, "0123456789", 10).ok());
  char back[16];
  IoStatus s = file->read_at(4, back, sizeof(back));
  EXPECT_EQ(s.error_number(), EIO);
  EXPECT_NE(s.message().find("unexpected end of file"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("offset 4"), std::string::npos) << s.message();
}

TEST_P(FileSystemTest, OpenMissingFileNamesPath) {
  std::string path = Path("missing/file");
  std::unique_ptr<File> file;
  IoStatus s = fs_->open(path, OpenOptions{}, &file);
  EXPECT_EQ(s.error_number(), ENOENT);
  EXPECT_EQ(s.message(), "open " + path + ": " + std::strerror(ENOENT));
  EXPECT_EQ(file, nullptr);
}

TEST_P(FileSystemTest, WriteToReadOnlyFileFailsNamingPathAndOffset) {
  std::string path = Path("ro");
  WriteHostFile(path, "x");
  auto file = OpenForRead(path);
  IoStatus s = file->write_at(7, "y", 1);
  EXPECT_EQ(s.error_number(), EBADF);
  EXPECT_NE(s.message().find("write " + path + " at offset 7"), std::string::npos) << s.message();
}

// RLIMIT_FSIZE makes the kernel write only up to the limit and then fail with EFBIG: the
// one portable way to force a short write. A write must continue the short write from where
// it stopped, so the error names the limit as the offset.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    ok_ = ::setrlimit(RLIMIT_FSIZE, &limit) == 0;
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  void (*old_handler_)(int) = nullptr;
  bool ok_ = false;
};

TEST_P(FileSystemTest, ShortWriteIsContinuedFromWhereItStopped) {
  std::string path = Path("limited");
  auto file = OpenForWrite(path);
  std::vector<char> data = Pattern(10000, 4);
  IoStatus s;
  {
    FileSizeLimit limit(6000);
    ASSERT_TRUE(limit.ok());
    s = file->write_at(0, data.data(), data.size());
  }
  EXPECT_EQ(s.error_number(), EFBIG) << s.message();
  EXPECT_NE(s.message().find("write " + path + " at offset 6000"), std::string::npos)
      << s.message();
  std::vector<char> back(6000);
  ASSERT_TRUE(file->read_at(0, back.data(), back.size()).ok());
  EXPECT_TRUE(std::equal(back.begin(), back.end(), data.begin()));
}

TEST_P(FileSystemTest, TruncateSetsSize) {
  auto file = OpenForWrite(Path("t"));
  std::vector<char> data = Pattern(10000, 3);
  ASSERT_TRUE(file->write_at(0, data.data(), data.size()).ok());
  ASSERT_TRUE(file->truncate(1234).ok());
  uint64_t size = 0;
  ASSERT_TRUE(file->size(&size).ok());
  EXPECT_EQ(size, 1234u);
}

TEST_P(FileSystemTest, AllocateSetsTheSizeKeepsTheDataAndReadsZerosBeyondIt) {
  auto file = OpenForWrite(Path("allocated"));
  std::vector<char> data = Pattern(5000, 4);
  ASSERT_TRUE(file->write_at(0, data.data(), data.size()).ok());
  IoStatus s = file->allocate(0, 1 << 20);
  if (s.error_number() == ENOTSUP) GTEST_SKIP() << "no fallocate here: " << s.message();
  ASSERT_TRUE(s.ok()) << s.message();
  uint64_t size = 0;
  ASSERT_TRUE(file->size(&size).ok());
  EXPECT_EQ(size, uint64_t{1} << 20);
  // A range inside the file changes nothing; a write inside the allocation does not extend it.
  ASSERT_TRUE(file->allocate(4096, 4096).ok());
  ASSERT_TRUE(file->write_at(8192, data.data(), data.size()).ok());
  ASSERT_TRUE(file->size(&size).ok());
  EXPECT_EQ(size, uint64_t{1} << 20);
  std::vector<char> back(8192 + data.size());
  ASSERT_TRUE(file->read_at(0, back.data(), back.size()).ok());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), back.begin()));
  EXPECT_TRUE(std::all_of(back.begin() + 5000, back.begin() + 8192, [](char c) { return c == 0; }));
  EXPECT_TRUE(std::equal(data.begin(), data.end(), back.begin() + 8192));
  EXPECT_TRUE(file->allocate(0, 0).ok());
}

TEST_P(FileSystemTest, AllocateBeyondWhatTheFileSystemHoldsFailsNamingPathAndOffset) {
  auto file = OpenForWrite(Path("huge"));
  const uint64_t exabyte = uint64_t{1} << 60;
  IoStatus s = file->allocate(4096, exabyte);
  if (s.error_number() == ENOTSUP) GTEST_SKIP() << "no fallocate here: " << s.message();
  // ext4 and XFS answer ENOSPC or EFBIG (past the largest file); either names the file.
  EXPECT_TRUE(s.error_number() == ENOSPC || s.error_number() == EFBIG) << s.message();
  EXPECT_NE(s.message().find("allocate " + Path("huge") + " at offset 4096"), std::string::npos)
      << s.message();
  uint64_t size = 1;
  ASSERT_TRUE(file->size(&size).ok());
  EXPECT_EQ(size, 0u);
}

TEST_P(FileSystemTest, DirectIoRoundTripsAlignedBuffers) {
  std::string path = Path("direct");
  std::unique_ptr<File> file;
  OpenOptions options;
  options.write = options.create = options.truncate = options.direct = true;
  ASSERT_TRUE(fs_->open(path, options, &file).ok());
  if (!file->is_direct()) GTEST_SKIP() << "file system refuses O_DIRECT";
  constexpr size_t kBytes = 3 * 4096;
  void* raw = nullptr;
  ASSERT_EQ(::posix_memalign(&raw, 4096, kBytes), 0);
  std::unique_ptr<void, FreeDeleter> buffer(raw);
  std::vector<char> data = Pattern(kBytes, 9);
  std::memcpy(buffer.get(), data.data(), kBytes);
  IoStatus s = file->write_at(4096, buffer.get(), kBytes);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_TRUE(file->sync().ok());
  std::memset(buffer.get(), 0, kBytes);
  s = file->read_at(4096, buffer.get(), kBytes);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(std::memcmp(buffer.get(), data.data(), kBytes), 0);
  // An unaligned length is refused by the kernel and reported, not silently buffered.
  s = file->write_at(0, buffer.get(), 100);
  EXPECT_EQ(s.error_number(), EINVAL) << s.message();
}

TEST_P(FileSystemTest, CreateDirFailsWhenItExists) {
  std::string path = Path("d");
  ASSERT_TRUE(fs_->create_dir(path).ok());
  IoStatus s = fs_->create_dir(path);
  EXPECT_EQ(s.error_number(), EEXIST);
  EXPECT_NE(s.message().find(path), std::string::npos);
}

TEST_P(FileSystemTest, CreateDirsMakesParentsAndAcceptsExisting) {
  std::string path = Path("a/b//c/");
  ASSERT_TRUE(fs_->create_dirs(path).ok());
  ASSERT_TRUE(fs_->create_dirs(path).ok());
  bool exists = false, is_dir = false;
  ASSERT_TRUE(ExistsAndIsDir(*fs_, Path("a/b/c"), &exists, &is_dir).ok());
  EXPECT_TRUE(exists);
  EXPECT_TRUE(is_dir);
}

TEST_P(FileSystemTest, CreateDirsThroughAFileIsNotADirectory) {
  WriteHostFile(Path("plain"), "x");
  IoStatus s = fs_->create_dirs(Path("plain/sub"));
  EXPECT_EQ(s.error_number(), ENOTDIR);
  EXPECT_NE(s.message().find(Path("plain")), std::string::npos) << s.message();
}

TEST_P(FileSystemTest, EntryTypeReportsMissingWithoutError) {
  bool exists = true, is_dir = true;
  ASSERT_TRUE(ExistsAndIsDir(*fs_, Path("nope"), &exists, &is_dir).ok());
  EXPECT_FALSE(exists);
  EXPECT_FALSE(is_dir);
  WriteHostFile(Path("file"), "x");
  ASSERT_TRUE(ExistsAndIsDir(*fs_, Path("file"), &exists, &is_dir).ok());
  EXPECT_TRUE(exists);
  EXPECT_FALSE(is_dir);
}

TEST_P(FileSystemTest, ListDirReturnsNamesWithoutDots) {
  ASSERT_TRUE(fs_->create_dir(Path("sub")).ok());
  WriteHostFile(Path("x"), "1");
  WriteHostFile(Path("y"), "2");
  std::vector<std::string> names;
  ASSERT_TRUE(fs_->list_dir(root_, &names).ok());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"sub", "x", "y"}));
  IoStatus s = fs_->list_dir(Path("gone"), &names);
  EXPECT_EQ(s.error_number(), ENOENT);
  EXPECT_NE(s.message().find(Path("gone")), std::string::npos);
}

TEST_P(FileSystemTest, RemoveFileAndMissingFileError) {
  WriteHostFile(Path("x"), "1");
  ASSERT_TRUE(fs_->remove_file(Path("x")).ok());
  IoStatus s = fs_->remove_file(Path("x"));
  EXPECT_EQ(s.error_number(), ENOENT);
  EXPECT_NE(s.message().find(Path("x")), std::string::npos);
}

TEST_P(FileSystemTest, RemoveTreeRemovesNestedDirsButNotSymlinkTargets) {
  ASSERT_TRUE(fs_->create_dirs(Path("tree/a/b/c")).ok());
  WriteHostFile(Path("tree/a/file"), "1");
  WriteHostFile(Path("tree/a/b/c/deep"), "2");
  ASSERT_TRUE(fs_->create_dirs(Path("outside/keep_dir")).ok());
  WriteHostFile(Path("outside/keep"), "3");
  ASSERT_EQ(::symlink(Path("outside").c_str(), Path("tree/a/b/link_dir").c_str()), 0);
  ASSERT_EQ(::symlink(Path("outside/keep").c_str(), Path("tree/link_file").c_str()), 0);

  IoStatus s = fs_->remove_tree(Path("tree"));
  ASSERT_TRUE(s.ok()) << s.message();
  bool exists = true, is_dir = false;
  ASSERT_TRUE(ExistsAndIsDir(*fs_, Path("tree"), &exists, &is_dir).ok());
  EXPECT_FALSE(exists);
  ASSERT_TRUE(ExistsAndIsDir(*fs_, Path("outside/keep"), &exists, &is_dir).ok());
  EXPECT_TRUE(exists);
  ASSERT_TRUE(ExistsAndIsDir(*fs_, Path("outside/keep_dir"), &exists, &is_dir).ok());
  EXPECT_TRUE(exists && is_dir);
}

TEST_P(FileSystemTest, RemoveTreeOfSymlinkRemovesOnlyTheLink) {
  ASSERT_TRUE(fs_->create_dirs(Path("target/inner")).ok());
  ASSERT_EQ(::symlink(Path("target").c_str(), Path("link").c_str()), 0);
  ASSERT_TRUE(fs_->remove_tree(Path("link")).ok());
  bool exists = false, is_dir = false;
  ASSERT_TRUE(ExistsAndIsDir(*fs_, Path("target/inner"), &exists, &is_dir).ok());
  EXPECT_TRUE(exists);
  EXPECT_EQ(fs_->remove_tree(Path("link")).error_number(), ENOENT);
}

TEST_P(FileSystemTest, RenameReplacesFile) {
  WriteHostFile(Path("a"), "new");
  WriteHostFile(Path("b"), "old");
  ASSERT_TRUE(fs_->rename(Path("a"), Path("b")).ok());
  uint64_t size = 0;
  ASSERT_TRUE(fs_->file_size(Path("b"), &size).ok());
  EXPECT_EQ(size, 3u);
  IoStatus s = fs_->rename(Path("a"), Path("c"));
  EXPECT_EQ(s.error_number(), ENOENT);
  EXPECT_NE(s.message().find(Path("a")), std::string::npos);
  EXPECT_NE(s.message().find(Path("c")), std::string::npos);
}

TEST_P(FileSystemTest, ExchangeSwapsTwoDirectories) {
  ASSERT_TRUE(fs_->create_dirs(Path("one")).ok());
  ASSERT_TRUE(fs_->create_dirs(Path("two")).ok());
  WriteHostFile(Path("one/marker1"), "1");
  WriteHostFile(Path("two/marker2"), "2");
  IoStatus s = fs_->exchange(Path("one"), Path("two"));
  if (s.error_number() == ENOSYS || s.error_number() == EINVAL) {
    GTEST_SKIP() << "RENAME_EXCHANGE unsupported here: " << s.message();
  }
  ASSERT_TRUE(s.ok()) << s.message();
  bool exists = false, is_dir = false;
  ASSERT_TRUE(ExistsAndIsDir(*fs_, Path("one/marker2"), &exists, &is_dir).ok());
  EXPECT_TRUE(exists);
  ASSERT_TRUE(ExistsAndIsDir(*fs_, Path("two/marker1"), &exists, &is_dir).ok());
  EXPECT_TRUE(exists);
  s = fs_->exchange(Path("one"), Path("missing"));
  EXPECT_EQ(s.error_number(), ENOENT);
  EXPECT_NE(s.message().find(Path("missing")), std::string::npos);
}

TEST_P(FileSystemTest, SyncDirSucceedsAndNamesMissingDir) {
  ASSERT_TRUE(fs_->sync_dir(root_).ok());
  IoStatus s = fs_->sync_dir(Path("nope"));
  EXPECT_EQ(s.error_number(), ENOENT);
  EXPECT_NE(s.message().find(Path("nope")), std::string::npos);
}

// ---- special files: refused at once, never blocked on ------------------------------------------

// Longest a child may take before the watchdog calls it hung (not a timing assertion).
constexpr auto kHangLimit = std::chrono::seconds(30);

// Opens `path` in a child under the watchdog; the child's message is the failure, its exit code
// 0 when the open failed (as it must), 1 when it succeeded.
testing_support::ChildOutcome OpenInChild(FileSystem* fs, const std::string& path,
                                          const OpenOptions& options) {
  return testing_support::RunInChild(
      [&](std::string* message) {
        std::unique_ptr<File> file;
        const IoStatus s = fs->open(path, options, &file);
        *message = std::to_string(s.error_number()) + " " + s.message();
        return s.ok() ? 1 : 0;
      },
      kHangLimit);
}

TEST_P(FileSystemTest, OpeningAFifoFailsAtOnceNamingItForReadAndWrite) {
  const std::string fifo = Path("checkpoint");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  OpenOptions write;
  write.write = write.create = write.truncate = true;
  for (const OpenOptions& options : {OpenOptions{}, write}) {
    const testing_support::ChildOutcome outcome = OpenInChild(fs_.get(), fifo, options);
    ASSERT_TRUE(outcome.ended_on_its_own)
        << "open of a FIFO blocked (write=" << options.write << "); the watchdog killed it";
    EXPECT_EQ(outcome.exit_code, 0) << "a FIFO was opened as a file";
    EXPECT_EQ(outcome.message,
              std::to_string(EINVAL) + " " + fifo + " is a FIFO, not a regular file");
  }
}

TEST_P(FileSystemTest, OpeningADeviceOrADirectoryIsRefusedNamingWhatItIs) {
  std::unique_ptr<File> file;
  IoStatus s = fs_->open("/dev/null", OpenOptions{}, &file);
  EXPECT_EQ(s.error_number(), EINVAL);
  EXPECT_EQ(s.message(), "/dev/null is a character device, not a regular file");
  s = fs_->open(root_, OpenOptions{}, &file);
  EXPECT_EQ(s.error_number(), EISDIR);
  EXPECT_EQ(s.message(), root_ + " is a directory, not a regular file");
  EXPECT_EQ(file, nullptr);
}

TEST_P(FileSystemTest, OpenedRegularFilesAreBlockingAgain) {
  auto file = OpenForWrite(Path("f"));
  ASSERT_NE(file, nullptr);
  // A descriptor left O_NONBLOCK would make io_uring answer -EAGAIN instead of waiting.
  EXPECT_EQ(::fcntl(file->fd(), F_GETFL) & O_NONBLOCK, 0);
}

TEST_P(FileSystemTest, PathsThroughANonDirectoryNameTheComponent) {
  WriteHostFile(Path("plain"), "x");
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0644), 0) << std::strerror(errno);
  std::unique_ptr<File> file;
  IoStatus s = fs_->open(Path("plain/index"), OpenOptions{}, &file);
  EXPECT_EQ(s.error_number(), ENOTDIR);
  EXPECT_EQ(s.message(), "open " + Path("plain/index") + ": " + Path("plain") +
                             " is a regular file, not a directory");
  std::vector<std::string> names;
  s = fs_->list_dir(Path("fifo"), &names);
  EXPECT_EQ(s.error_number(), ENOTDIR);
  EXPECT_EQ(s.message(), Path("fifo") + " is a FIFO, not a directory");
  s = fs_->sync_dir(Path("plain"));
  EXPECT_EQ(s.message(), Path("plain") + " is a regular file, not a directory");
  s = fs_->create_dirs(Path("fifo/sub"));
  EXPECT_EQ(s.message(), Path("fifo") + " is a FIFO, not a directory");
}

// ---- lock_file --------------------------------------------------------------------------------

std::string HolderLine() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return "pid=" + std::to_string(::getpid()) + " host=" + host + "\n";
}

TEST_P(FileSystemTest, LockConflictsWithinOneProcessAndNamesTheHolder) {
  const std::string path = Path("model.ckpt.lock");
  std::unique_ptr<FileLock> first;
  IoStatus s = fs_->lock_file(path, &first);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(first->path(), path);
  EXPECT_EQ(ReadHostFile(path), HolderLine());

  std::unique_ptr<FileLock> second;
  s = fs_->lock_file(path, &second);
  EXPECT_EQ(s.error_number(), EWOULDBLOCK);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(s.message(),
            path + " is held by pid " + std::to_string(::getpid()) + " on host " + host);
  EXPECT_EQ(second, nullptr);
  EXPECT_EQ(ReadHostFile(path), HolderLine()) << "the refusal wrote";
}

TEST_P(FileSystemTest, LockIsReleasedAndEmptiedByItsDestructionAndTheFileStays) {
  const std::string path = Path("model.ckpt.lock");
  std::unique_ptr<FileLock> lock;
  ASSERT_TRUE(fs_->lock_file(path, &lock).ok());
  lock.reset();
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(ReadHostFile(path), "");
  IoStatus s = fs_->lock_file(path, &lock);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST_P(FileSystemTest, LockIsTakenWhenNoByteCanBeWritten) {
  // A full disk, as far as writes go: a file-size limit of 0 fails every write (EFBIG).
  const std::string path = Path("checkpoint.lock");
  { std::ofstream(path).flush(); }  // the lock file of an earlier run, emptied by its end()
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit none = old_limit;
  none.rlim_cur = 0;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &none), 0);
  std::unique_ptr<FileLock> lock, second;
  const IoStatus s = fs_->lock_file(path, &lock);
  const IoStatus refused = fs_->lock_file(path, &second);
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(refused.error_number(), EWOULDBLOCK) << "the lock is held all the same";
  EXPECT_EQ(refused.message(), path + " is held by another process (the file does not name it)");
}

TEST_P(FileSystemTest, ClosingAnotherDescriptorOfTheLockFileKeepsTheLock) {
  // The trap of classic fcntl() locks: any close() of the file by the process drops them.
  const std::string path = Path("model.ckpt.lock");
  std::unique_ptr<FileLock> lock;
  ASSERT_TRUE(fs_->lock_file(path, &lock).ok());
  OpenForRead(path).reset();
  std::unique_ptr<FileLock> again;
  EXPECT_EQ(fs_->lock_file(path, &again).error_number(), EWOULDBLOCK);
}

TEST_P(FileSystemTest, LockHeldByAnotherProcessNamesItsPid) {
  const std::string path = Path("model.ckpt.lock");
  int ready[2], done[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(done), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    // Holds the lock until the parent closes `done`.
    ::close(ready[0]);
    ::close(done[1]);
    std::unique_ptr<FileLock> lock;
    const char ok = fs_->lock_file(path, &lock).ok() ? 'y' : 'n';
    (void)!::write(ready[1], &ok, 1);
    char byte;
    (void)!::read(done[0], &byte, 1);
    lock.reset();
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(done[0]);
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 'y');
  std::unique_ptr<FileLock> lock;
  IoStatus s = fs_->lock_file(path, &lock);
  EXPECT_EQ(s.error_number(), EWOULDBLOCK);
  EXPECT_NE(s.message().find(path + " is held by pid " + std::to_string(child) + " on host "),
            std::string::npos)
      << s.message();
  ::close(done[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::close(ready[0]);
  s = fs_->lock_file(path, &lock);
  EXPECT_TRUE(s.ok()) << "not released when its holder ended: " << s.message();
}

TEST_P(FileSystemTest, ReleasedLockIsFreeWhileAForkedChildStillHasTheDescriptor) {
  const std::string path = Path("model.ckpt.lock");
  std::unique_ptr<FileLock> lock;
  ASSERT_TRUE(fs_->lock_file(path, &lock).ok());
  int done[2];
  ASSERT_EQ(::pipe(done), 0);
  const pid_t child = ::fork();  // a DataLoader-style worker: forked, never exec'd
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    ::close(done[1]);
    char byte;
    (void)!::read(done[0], &byte, 1);
    ::_exit(0);
  }
  ::close(done[0]);
  lock.reset();
  std::unique_ptr<FileLock> again;
  IoStatus s = fs_->lock_file(path, &again);
  EXPECT_TRUE(s.ok()) << "the forked child kept the released lock: " << s.message();
  ::close(done[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
}

TEST_P(FileSystemTest, LockFileThatIsASymlinkOrAFifoIsRefusedAndLeftAlone) {
  WriteHostFile(Path("notes"), "my notes");
  ASSERT_EQ(::symlink(Path("notes").c_str(), Path("link.lock").c_str()), 0);
  std::unique_ptr<FileLock> lock;
  IoStatus s = fs_->lock_file(Path("link.lock"), &lock);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message(), Path("link.lock") + " is a symbolic link, not a regular file");
  EXPECT_EQ(ReadHostFile(Path("notes")), "my notes");

  ASSERT_EQ(::mkfifo(Path("fifo.lock").c_str(), 0644), 0) << std::strerror(errno);
  const testing_support::ChildOutcome outcome = testing_support::RunInChild(
      [&](std::string* message) {
        std::unique_ptr<FileLock> held;
        *message = fs_->lock_file(Path("fifo.lock"), &held).message();
        return held == nullptr ? 0 : 1;
      },
      kHangLimit);
  ASSERT_TRUE(outcome.ended_on_its_own) << "locking a FIFO blocked";
  EXPECT_EQ(outcome.exit_code, 0);
  EXPECT_EQ(outcome.message, Path("fifo.lock") + " is a FIFO, not a regular file");
}

TEST(IoStatusTest, FromErrnoNamesOpPathAndReason) {
  IoStatus s = IoStatus::FromErrno(ENOSPC, "write", "/ckpt/x at offset 4096");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.error_number(), ENOSPC);
  EXPECT_EQ(s.message(), std::string("write /ckpt/x at offset 4096: ") + std::strerror(ENOSPC));
  EXPECT_TRUE(IoStatus::FromErrno(0, "write", "x").ok());
}

TEST(DefaultFileSystemTest, ForcedPosixIsNotAFallback) {
  IoOptions options;
  options.force_posix_io = true;
  std::string reason = "stale";
  auto fs = NewDefaultFileSystem(options, &reason);
  ASSERT_NE(fs, nullptr);
  EXPECT_EQ(fs->name(), "posix");
  EXPECT_TRUE(reason.empty());
}

TEST(DefaultFileSystemTest, PicksUringOrSaysWhyNot) {
  std::string reason;
  auto fs = NewDefaultFileSystem(IoOptions{}, &reason);
  ASSERT_NE(fs, nullptr);
  if (fs->name() == "io_uring") {
    EXPECT_TRUE(reason.empty());
  } else {
    EXPECT_EQ(fs->name(), "posix");
    EXPECT_NE(reason.find("io_uring unavailable"), std::string::npos) << reason;
  }
}

// In a child process with io_uring_setup() blocked by seccomp (as in many sandboxes), the
// default file system must fall back to POSIX and say why. Exit codes: 0 as expected,
// 1 not as expected, 2 seccomp unavailable.
int CheckFallbackWithIoUringBlocked() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program = {static_cast<unsigned short>(std::size(filter)), filter};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 2;
  if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) return 2;
  std::string why;
  if (NewUringFileSystem(IoOptions{}, &why) != nullptr) return 1;
  std::string reason;
  auto fs = NewDefaultFileSystem(IoOptions{}, &reason);
  std::string expected = "io_uring unavailable (io_uring_queue_init (a probe ring): " +
                         std::string(std::strerror(EPERM)) + "); using POSIX I/O";
  return fs != nullptr && fs->name() == "posix" && reason == expected ? 0 : 1;
}

TEST(DefaultFileSystemTest, FallsBackToPosixWhenIoUringIsBlocked) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) ::_exit(CheckFallbackWithIoUringBlocked());
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child status " << status;
  if (WEXITSTATUS(status) == 2) GTEST_SKIP() << "seccomp filters unavailable here";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "wrong backend or fallback reason";
}

INSTANTIATE_TEST_SUITE_P(Backends, FileSystemTest, ::testing::Values("posix", "io_uring"),
                         [](const auto& info) { return info.param; });

// On tmpfs O_DIRECT bypasses nothing, and a direct file would be preallocated (every page
// zeroed up front): such a file is opened buffered.
TEST(PosixFileSystemMemoryTest, DirectOnTmpfsOpensBuffered) {
  struct statfs fs;
  if (::statfs("/dev/shm", &fs) != 0 || fs.f_type != 0x01021994) {
    GTEST_SKIP() << "/dev/shm is not tmpfs here";
  }
  char pattern[] = "/dev/shm/asyncckpt-direct-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string path = std::string(pattern) + "/f";
  auto posix = NewPosixFileSystem();
  std::unique_ptr<File> file;
  const IoStatus opened =
      posix->open(path, OpenOptions{.write = true, .create = true, .direct = true}, &file);
  ASSERT_TRUE(opened.ok()) << opened.message();
  EXPECT_FALSE(file->is_direct());
  EXPECT_EQ(::fcntl(file->fd(), F_GETFL) & O_DIRECT, 0);
  const char byte = 'x';
  EXPECT_TRUE(file->write_at(1, &byte, 1).ok());  // unaligned: fine once buffered
  file.reset();
  std::filesystem::remove_all(pattern);
}

// The IoQueues write such a file from a thread of its own instead of a ring (per_file_io_queue.h).
TEST(PosixFileSystemMemoryTest, AFileOnTmpfsSaysItLivesInMemoryAndOneOnDiskDoesNot) {
  struct statfs fs;
  if (::statfs("/dev/shm", &fs) != 0 || fs.f_type != 0x01021994) {
    GTEST_SKIP() << "/dev/shm is not tmpfs here";
  }
  char shm[] = "/dev/shm/asyncckpt-memory-XXXXXX";
  ASSERT_NE(::mkdtemp(shm), nullptr);
  const std::string disk_dir = ::testing::TempDir() + "/asyncckpt-memory-XXXXXX";
  std::string disk = disk_dir;
  ASSERT_NE(::mkdtemp(disk.data()), nullptr);
  if (::statfs(disk.c_str(), &fs) == 0 && fs.f_type == 0x01021994) {
    std::filesystem::remove_all(shm);
    std::filesystem::remove_all(disk);
    GTEST_SKIP() << "the test's temporary directory is on tmpfs too";
  }
  auto posix = NewPosixFileSystem();
  const OpenOptions options{.write = true, .create = true};
  std::unique_ptr<File> in_memory;
  std::unique_ptr<File> on_disk;
  ASSERT_TRUE(posix->open(std::string(shm) + "/f", options, &in_memory).ok());
  ASSERT_TRUE(posix->open(disk + "/f", options, &on_disk).ok());
  EXPECT_TRUE(in_memory->in_memory());
  EXPECT_FALSE(on_disk->in_memory());
  in_memory.reset();
  on_disk.reset();
  std::filesystem::remove_all(shm);
  std::filesystem::remove_all(disk);
}

}  // namespace
}  // namespace asyncckpt::io
