// The io_uring backend: the start-up probe, queues, and the fixed-buffer table they share.

#include "io/uring_file_system.h"

#include <liburing.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <string_view>
#include <utility>
#include <vector>

#include "io/thread_pool_io_queue.h"

namespace asyncckpt::io {
namespace {

// The kernel refuses a registered buffer above 1 GiB.
constexpr size_t kMaxFixedBuffer = size_t{1} << 30;

// A ring that only proves io_uring works here; closed by the destructor.
class ProbeRing {
 public:
  // Returns 0 or a negative errno.
  int Init() {
    int rc = io_uring_queue_init(1, &ring_, 0);
    initialized_ = rc == 0;
    return rc;
  }
  ~ProbeRing() {
    if (initialized_) io_uring_queue_exit(&ring_);
  }
  io_uring* get() { return &ring_; }

 private:
  io_uring ring_{};
  bool initialized_ = false;
};

// Sends one NOP through the ring: where a sandbox lets io_uring_setup() through but blocks
// io_uring_enter(), this is where it shows. Returns 0 or an errno.
int RoundTripNop(ProbeRing& ring) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring.get());
  if (sqe == nullptr) return EBUSY;
  io_uring_prep_nop(sqe);
  io_uring_sqe_set_data64(sqe, 0);
  int rc;
  do {
    rc = io_uring_submit_and_wait(ring.get(), 1);
  } while (rc == -EINTR);
  if (rc < 0) return -rc;
  io_uring_cqe* cqe = nullptr;
  do {
    rc = io_uring_wait_cqe(ring.get(), &cqe);
  } while (rc == -EINTR);
  if (rc < 0) return -rc;
  int res = cqe->res;
  io_uring_cqe_seen(ring.get(), cqe);
  return res < 0 ? -res : 0;
}

bool SupportsReadWrite(ProbeRing& ring) {
  io_uring_probe* probe = io_uring_get_probe_ring(ring.get());
  if (probe == nullptr) return false;
  bool ok = io_uring_opcode_supported(probe, IORING_OP_READ) &&
            io_uring_opcode_supported(probe, IORING_OP_WRITE);
  io_uring_free_probe(probe);
  return ok;
}

}  // namespace

std::unique_ptr<UringFileSystem> UringFileSystem::Create(const IoOptions& options,
                                                         std::string* why) {
  (void)options;  // nothing in it tunes this backend
  ProbeRing ring;
  std::string reason;
  if (int rc = ring.Init(); rc < 0) {
    reason = IoStatus::FromErrno(-rc, "io_uring_queue_init", "(a probe ring)").message();
  } else if (!SupportsReadWrite(ring)) {
    reason = "the kernel's io_uring lacks IORING_OP_READ/IORING_OP_WRITE";
  } else if (int error_number = RoundTripNop(ring); error_number != 0) {
    reason = IoStatus::FromErrno(error_number, "io_uring_enter", "(a NOP request)").message();
  } else {
    return std::unique_ptr<UringFileSystem>(new UringFileSystem());
  }
  if (why != nullptr) *why = std::move(reason);
  return nullptr;
}

namespace {

// "register io_uring buffers (N buffers, M bytes; using unregistered I/O): <strerror>", with
// the memlock limit when that is the likely cause.
IoStatus RegistrationFailure(int error_number, const std::vector<iovec>& buffers,
                             std::string_view where) {
  size_t bytes = 0;
  for (const iovec& b : buffers) bytes += b.iov_len;
  std::string subject = std::string(where) + "(" + std::to_string(buffers.size()) + " buffers, " +
                        std::to_string(bytes) + " bytes; using unregistered I/O)";
  IoStatus status = IoStatus::FromErrno(error_number, "register io_uring buffers", subject);
  rlimit limit{};
  if (error_number == ENOMEM && getrlimit(RLIMIT_MEMLOCK, &limit) == 0 &&
      limit.rlim_cur != RLIM_INFINITY) {
    return IoStatus(error_number, status.message() + " (RLIMIT_MEMLOCK is " +
                                      std::to_string(limit.rlim_cur) +
                                      " bytes, and every ring pins the buffers again)");
  }
  return status;
}

}  // namespace

IoStatus UringFileSystem::RegisterBuffers(std::span<const iovec> buffers) {
  std::vector<iovec> pieces;
  for (const iovec& b : buffers) {
    char* base = static_cast<char*>(b.iov_base);
    for (size_t done = 0; done < b.iov_len; done += kMaxFixedBuffer) {
      pieces.push_back({base + done, std::min(b.iov_len - done, kMaxFixedBuffer)});
    }
  }
  std::sort(pieces.begin(), pieces.end(),
            [](const iovec& a, const iovec& b) { return a.iov_base < b.iov_base; });
  for (size_t i = 1; i < pieces.size(); ++i) {
    const char* end_of_previous =
        static_cast<const char*>(pieces[i - 1].iov_base) + pieces[i - 1].iov_len;
    if (static_cast<const char*>(pieces[i].iov_base) < end_of_previous) {
      return IoStatus(EINVAL, "register io_uring buffers: buffers overlap");
    }
  }
  // The queues' rings, each switched by its owner thread; see io/uring_io_queue.h.
  IoStatus queues = queue_buffers_->Publish(pieces);
  if (queues.ok()) return queues;
  return RegistrationFailure(queues.error_number(), pieces, "with a queue's ring ");
}

IoStatus UringFileSystem::register_buffers(std::span<const IoBuffer> buffers) {
  std::vector<iovec> iovecs;
  iovecs.reserve(buffers.size());
  for (const IoBuffer& b : buffers) iovecs.push_back({b.data, b.length});
  return RegisterBuffers(iovecs);
}

IoStatus UringFileSystem::new_io_queue(const IoQueueOptions& options,
                                       std::unique_ptr<IoQueue>* queue) {
  if (!options.on_complete) return IoStatus(EINVAL, "new_io_queue: on_complete is not set");
  if (options.depth == 0) return IoStatus(EINVAL, "new_io_queue: depth must be at least 1");
  std::unique_ptr<UringIoQueue> uring_queue;
  if (UringIoQueue::Create(UringIoQueueSettings{options, queue_buffers_}, &uring_queue).ok()) {
    *queue = std::move(uring_queue);
    return IoStatus::Ok();
  }
  // No ring to be had now (ENOMEM from too many, or under RLIMIT_MEMLOCK): the thread pool
  // does the same job.
  return NewThreadPoolIoQueue(options, queue);
}

void UringFileSystem::UnregisterBuffers() { (void)RegisterBuffers({}); }

std::unique_ptr<FileSystem> NewUringFileSystem(const IoOptions& options, std::string* why) {
  return UringFileSystem::Create(options, why);
}

}  // namespace asyncckpt::io
