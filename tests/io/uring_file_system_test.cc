// The io_uring backend itself: its name, the default choice, and the checks of the
// fixed-buffer table it shares with its queues. The queues are tested in uring_io_queue_test
// and io_queue_test. Skipped without io_uring.

#include "io/uring_file_system.h"

#include <gtest/gtest.h>
#include <sys/uio.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"

namespace asyncckpt::io {
namespace {

class UringFileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs_ = UringFileSystem::Create(IoOptions{}, &why_);
    if (fs_ == nullptr) GTEST_SKIP() << "io_uring unavailable: " << why_;
  }

  std::string why_;
  std::unique_ptr<UringFileSystem> fs_;
};

TEST_F(UringFileSystemTest, NameAndDefaultChoice) {
  EXPECT_EQ(fs_->name(), "io_uring");
  std::string reason = "stale";
  auto fs = NewDefaultFileSystem(IoOptions{}, &reason);
  EXPECT_EQ(fs->name(), "io_uring");
  EXPECT_TRUE(reason.empty());
}

TEST_F(UringFileSystemTest, HandsOutIoUringQueues) {
  std::unique_ptr<IoQueue> queue;
  IoQueueOptions options;
  options.depth = 4;
  options.on_complete = [](uint64_t, IoStatus) {};
  IoStatus s = fs_->new_io_queue(options, &queue);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(queue->name(), "io_uring");
  EXPECT_EQ(queue->depth(), 4u);
}

TEST_F(UringFileSystemTest, OverlappingRegisteredBuffersAreInvalid) {
  std::vector<char> memory(8192);
  iovec buffers[] = {{memory.data(), 8192}, {memory.data() + 4096, 100}};
  EXPECT_EQ(fs_->RegisterBuffers(buffers).error_number(), EINVAL);
  EXPECT_EQ(fs_->fixed_requests(), 0u);
}

}  // namespace
}  // namespace asyncckpt::io
