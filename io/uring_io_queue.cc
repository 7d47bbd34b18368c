#include "io/uring_io_queue.h"

#include <liburing.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "asyncckpt/limits.h"
#include "io/per_file_io_queue.h"
#include "io/posix_file_system.h"
#include "io/thread_pool_io_queue.h"

namespace asyncckpt::io {
namespace {

// The user_data of the eventfd read; slots are below depth, so it cannot clash.
constexpr uint64_t kWakeTag = ~uint64_t{0};

}  // namespace

// The ring and the eventfd that wakes its owner; both closed by the destructor, which runs
// only when nothing is in flight.
struct UringIoQueue::Ring {
  io_uring ring{};
  int wake_fd = -1;
  bool initialized = false;

  ~Ring() {
    // Closing the ring also drops its registered buffers.
    if (initialized) io_uring_queue_exit(&ring);
    if (wake_fd >= 0) ::close(wake_fd);
  }
};

// ---- UringFixedBuffers -------------------------------------------------------------------------

IoStatus UringFixedBuffers::Publish(std::vector<iovec> buffers) {
  std::lock_guard publishing(queues_mu_);
  uint64_t generation;
  {
    std::lock_guard lock(table_mu_);
    table_.buffers = std::move(buffers);
    generation = ++table_.generation;
    generation_.store(generation, std::memory_order_release);
  }
  IoStatus first_error;
  for (UringIoQueue* queue : queues_) {
    const int error_number = queue->AwaitRegistration(generation);
    if (error_number != 0 && first_error.ok()) {
      first_error = IoStatus::FromErrno(error_number, "register io_uring buffers",
                                        "with a queue's ring (it uses unregistered I/O)");
    }
  }
  return first_error;
}

UringFixedBuffers::Table UringFixedBuffers::Current() const {
  std::lock_guard lock(table_mu_);
  return table_;
}

void UringFixedBuffers::Attach(UringIoQueue* queue) {
  std::lock_guard lock(queues_mu_);
  queues_.insert(queue);
}

void UringFixedBuffers::Detach(UringIoQueue* queue) {
  std::lock_guard lock(queues_mu_);
  queues_.erase(queue);
}

// ---- UringIoQueue: set-up and tear-down ---------------------------------------------------------

IoStatus UringIoQueue::Create(UringIoQueueSettings settings, std::unique_ptr<UringIoQueue>* queue) {
  if (!settings.options.on_complete) {
    return IoStatus(EINVAL, "new_io_queue: on_complete is not set");
  }
  if (settings.options.depth == 0) {
    return IoStatus(EINVAL, "new_io_queue: depth must be at least 1");
  }
  if (settings.max_piece_bytes == 0 || settings.max_piece_bytes % 4096 != 0 ||
      settings.max_piece_bytes > (size_t{1} << 30)) {
    return IoStatus(EINVAL, "new_io_queue: the piece size must be a multiple of 4096 up to 1 GiB");
  }
  settings.options.depth = std::min(settings.options.depth, kMaxQueueDepth);
  auto ring = std::make_unique<Ring>();
  // One entry more than the depth: the eventfd read is always in the ring too.
  if (int rc = io_uring_queue_init(settings.options.depth + 1, &ring->ring, 0); rc < 0) {
    return IoStatus::FromErrno(
        -rc, "io_uring_queue_init",
        "(an IoQueue of depth " + std::to_string(settings.options.depth) + ")");
  }
  ring->initialized = true;
  ring->wake_fd = ::eventfd(0, EFD_CLOEXEC);
  if (ring->wake_fd < 0) return IoStatus::FromErrno(errno, "eventfd", "(an IoQueue's wake-up)");
  std::unique_ptr<UringIoQueue> made(new UringIoQueue(std::move(settings), std::move(ring)));
  if (made->fixed_buffers_ != nullptr) made->fixed_buffers_->Attach(made.get());
  UringIoQueue* self = made.get();
  made->owner_ = std::thread([self] { self->Loop(); });
  made->owner_id_ = made->owner_.get_id();
  pthread_setname_np(made->owner_.native_handle(), "asyncckpt-uring");
  *queue = std::move(made);
  return IoStatus::Ok();
}

UringIoQueue::UringIoQueue(UringIoQueueSettings settings, std::unique_ptr<Ring> ring)
    : on_complete_(std::move(settings.options.on_complete)),
      depth_(settings.options.depth),
      max_piece_(settings.max_piece_bytes),
      max_file_threads_(settings.max_file_threads != 0
                            ? settings.max_file_threads
                            : std::max(1u, std::thread::hardware_concurrency())),
      fixed_buffers_(std::move(settings.fixed_buffers)),
      ring_(std::move(ring)),
      slots_(depth_) {
  free_slots_.reserve(depth_);
  for (uint32_t slot = depth_; slot > 0; --slot) free_slots_.push_back(slot - 1);
}

UringIoQueue::~UringIoQueue() {
  // First leave the table's list, so that no register_buffers() waits for a stopped owner.
  if (fixed_buffers_ != nullptr) fixed_buffers_->Detach(this);
  drain();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  Wake(/*force=*/true);
  owner_.join();
  // Its requests all finished (drain); this joins their threads before the eventfd they may
  // still write to is closed with the ring.
  pool_.reset();
  file_threads_.reset();
}

// ---- submitter side -----------------------------------------------------------------------------

void UringIoQueue::submit_write(const WriteOp& op, uint64_t tag) {
  // The kernel only reads a write's buffer; the cast lets one Request type serve both.
  Push(Request{op.file, op.offset, static_cast<char*>(const_cast<void*>(op.data)), op.length, tag,
               true});
}

void UringIoQueue::submit_read(const ReadOp& op, uint64_t tag) {
  Push(Request{op.file, op.offset, static_cast<char*>(op.data), op.length, tag, false});
}

void UringIoQueue::Push(Request request) {
  // The wake-up is written under the lock: once it is released the owner may complete the
  // request on a turn it was already taking, a drain() may return and the queue (and its
  // eventfd, whose number the kernel may then hand to another file) go away.
  std::lock_guard lock(mu_);
  submitted_.push_back(request);
  ++unfinished_;
  if (std::this_thread::get_id() == owner_id_) {
    owner_submitted_ = true;  // a callback's: taken at the owner's next turn, no wake-up
  } else if (!wake_sent_) {
    wake_sent_ = true;
    Wake(/*force=*/true);
  }
}

void UringIoQueue::Wake(bool force) {
  if (!force) {
    std::lock_guard lock(mu_);
    if (wake_sent_) return;
    wake_sent_ = true;
  }
  const uint64_t one = 1;
  // An eventfd write fails only when the counter would overflow, which needs 2^64 wake-ups.
  [[maybe_unused]] ssize_t written = ::write(ring_->wake_fd, &one, sizeof(one));
}

void UringIoQueue::drain() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return unfinished_ == 0; });
}

int UringIoQueue::AwaitRegistration(uint64_t generation) {
  Wake(/*force=*/true);
  std::unique_lock lock(mu_);
  registered_.wait(lock, [&] { return registered_generation_ >= generation; });
  return registration_error_;
}

// ---- owner side ---------------------------------------------------------------------------------

void UringIoQueue::Loop() {
  for (;;) {
    const bool stopping = TakeSubmitted();
    RefreshRegistration();
    if (!stopping && !wake_armed_) ArmWake();
    StartMore();
    if (stopping && in_flight_ == 0 && pending_.empty() && !wake_armed_) return;
    // A callback run by StartMore() may have submitted: then only submit, and take it next.
    const int rc = owner_submitted_ ? io_uring_submit(&ring_->ring)
                                    : io_uring_submit_and_wait(&ring_->ring, 1);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      // Out of kernel memory, most likely. The SQEs stay in the ring and go with the next
      // call: back off a little instead of spinning.
      const timespec pause{0, 1'000'000};
      nanosleep(&pause, nullptr);
    }
    Reap();
  }
}

bool UringIoQueue::TakeSubmitted() {
  std::lock_guard lock(mu_);
  wake_sent_ = false;
  owner_submitted_ = false;
  for (Request& request : submitted_) pending_.push_back(request);
  submitted_.clear();
  for (uint32_t slot : returned_slots_) {
    free_slots_.push_back(slot);
    --in_flight_;
  }
  returned_slots_.clear();
  return stopping_;
}

void UringIoQueue::ArmWake() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
  // The ring has room for every slot and this read; a full SQ only means unsubmitted SQEs.
  while (sqe == nullptr) {
    io_uring_submit(&ring_->ring);
    sqe = io_uring_get_sqe(&ring_->ring);
  }
  io_uring_prep_read(sqe, ring_->wake_fd, &wake_value_, sizeof(wake_value_), 0);
  io_uring_sqe_set_data64(sqe, kWakeTag);
  wake_armed_ = true;
}

void UringIoQueue::RefreshRegistration() {
  if (fixed_buffers_ == nullptr) return;
  if (fixed_buffers_->generation() == owner_generation_) return;
  // A fixed SQE names a slot of the ring's table: the table may change only when none is in
  // flight. Until then, new SQEs go without it.
  use_fixed_ = false;
  if (fixed_in_flight_ > 0) return;
  UringFixedBuffers::Table table = fixed_buffers_->Current();
  if (!fixed_.empty()) io_uring_unregister_buffers(&ring_->ring);
  fixed_.clear();
  int error_number = 0;
  if (!table.buffers.empty()) {
    const int rc = io_uring_register_buffers(&ring_->ring, table.buffers.data(),
                                             static_cast<unsigned>(table.buffers.size()));
    if (rc < 0) {
      error_number = -rc;
    } else {
      fixed_ = std::move(table.buffers);
    }
  }
  owner_generation_ = table.generation;
  use_fixed_ = !fixed_.empty();
  {
    std::lock_guard lock(mu_);
    registered_generation_ = table.generation;
    registration_error_ = error_number;
  }
  registered_.notify_all();
}

void UringIoQueue::StartMore() {
  while (in_flight_ < depth_ && !pending_.empty()) {
    const Request request = pending_.front();
    pending_.pop_front();
    Start(request);
  }
}

void UringIoQueue::Start(const Request& request) {
  if (request.file == nullptr || request.length == 0) {
    Callback(request.tag, request.file == nullptr
                              ? IoStatus(EINVAL, std::string(request.write ? "write" : "read") +
                                                     ": the request has no file")
                              : IoStatus::Ok());
    Finished();
    return;
  }
  const uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  slots_[slot] = request;
  ++in_flight_;
  if (in_flight_ > most_in_flight_.load(std::memory_order_relaxed)) {
    most_in_flight_.store(in_flight_, std::memory_order_relaxed);
  }
  if (request.file->fd() < 0) {
    RunInPool(slot);
  } else if (request.write && request.file->in_memory()) {
    RunOnFileThread(slot);
  } else {
    Prepare(slot);
  }
}

int UringIoQueue::FindFixed(const char* data, size_t n) const {
  auto after = std::upper_bound(
      fixed_.begin(), fixed_.end(), data,
      [](const char* p, const iovec& b) { return p < static_cast<const char*>(b.iov_base); });
  if (after == fixed_.begin()) return -1;
  const iovec& b = *(after - 1);
  if (data + n > static_cast<const char*>(b.iov_base) + b.iov_len) return -1;
  return static_cast<int>(after - 1 - fixed_.begin());
}

void UringIoQueue::Prepare(uint32_t slot) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
  while (sqe == nullptr) {
    io_uring_submit(&ring_->ring);
    sqe = io_uring_get_sqe(&ring_->ring);
  }
  Request& r = slots_[slot];
  char* data = r.data + r.done;
  r.piece = std::min(r.length - r.done, max_piece_);
  const auto n = static_cast<unsigned>(r.piece);
  const uint64_t offset = r.offset + r.done;
  const int fd = r.file->fd();
  const int fixed = use_fixed_ ? FindFixed(data, r.piece) : -1;
  if (fixed >= 0) {
    r.fixed = true;
    ++fixed_in_flight_;
    fixed_ops_.fetch_add(1, std::memory_order_relaxed);
    fixed_buffers_->AddFixedRequests(1);
    if (r.write) {
      io_uring_prep_write_fixed(sqe, fd, data, n, offset, fixed);
    } else {
      io_uring_prep_read_fixed(sqe, fd, data, n, offset, fixed);
    }
  } else if (r.write) {
    io_uring_prep_write(sqe, fd, data, n, offset);
  } else {
    io_uring_prep_read(sqe, fd, data, n, offset);
  }
  io_uring_sqe_set_data64(sqe, slot);
}

void UringIoQueue::Reap() {
  unsigned head;
  unsigned seen = 0;
  io_uring_cqe* cqe;
  io_uring_for_each_cqe(&ring_->ring, head, cqe) {
    if (cqe->user_data == kWakeTag) {
      wake_armed_ = false;
    } else {
      Complete(static_cast<uint32_t>(cqe->user_data), cqe->res);
    }
    ++seen;
  }
  io_uring_cq_advance(&ring_->ring, seen);
}

void UringIoQueue::Complete(uint32_t slot, int res) {
  Request& r = slots_[slot];
  if (r.fixed) {
    r.fixed = false;
    --fixed_in_flight_;
  }
  if (res == -EAGAIN || res == -EINTR) return Prepare(slot);
  const char* verb = r.write ? "write" : "read";
  if (res < 0) {
    return Finish(
        slot, IoStatus::FromErrno(-res, verb, DescribeOffset(r.file->path(), r.offset + r.done)));
  }
  if (res == 0) {
    // A regular file never takes or gives 0 bytes with bytes left, but at its end.
    return Finish(slot, r.write ? IoStatus::FromErrno(
                                      EIO, verb, DescribeOffset(r.file->path(), r.offset + r.done))
                                : UnexpectedEndOfFile(r.file->path(), r.offset, r.done, r.length));
  }
  r.done += static_cast<size_t>(res);
  if (r.done < r.length) {
    continuations_.fetch_add(1, std::memory_order_relaxed);
    return Prepare(slot);
  }
  Finish(slot, IoStatus::Ok());
}

void UringIoQueue::Finish(uint32_t slot, IoStatus status) {
  const uint64_t tag = slots_[slot].tag;
  free_slots_.push_back(slot);
  --in_flight_;
  Callback(tag, std::move(status));
  Finished();
}

void UringIoQueue::RunInPool(uint32_t slot) {
  if (pool_ == nullptr) {
    IoQueueOptions options{depth_, [this](uint64_t pool_tag, IoStatus status) {
                             PoolDone(static_cast<uint32_t>(pool_tag), std::move(status));
                           }};
    // As for the file threads: a failure fails the request instead of dereferencing nothing.
    if (IoStatus made = NewThreadPoolIoQueue(options, &pool_); !made.ok()) {
      Finish(slot, std::move(made));
      return;
    }
  }
  pool_requests_.fetch_add(1, std::memory_order_relaxed);
  const Request& r = slots_[slot];
  if (r.write) {
    pool_->submit_write(WriteOp{r.file, r.offset, r.data, r.length}, slot);
  } else {
    pool_->submit_read(ReadOp{r.file, r.offset, r.data, r.length}, slot);
  }
}

void UringIoQueue::RunOnFileThread(uint32_t slot) {
  if (file_threads_ == nullptr) {
    IoQueueOptions options{depth_, [this](uint64_t pool_tag, IoStatus status) {
                             PoolDone(static_cast<uint32_t>(pool_tag), std::move(status));
                           }};
    // The options are valid here, so this does not fail today; if it ever does, the request
    // fails with its reason rather than the queue dereferencing nothing.
    if (IoStatus made = NewPerFileIoQueue(options, max_file_threads_, &file_threads_); !made.ok()) {
      Finish(slot, std::move(made));
      return;
    }
  }
  file_thread_requests_.fetch_add(1, std::memory_order_relaxed);
  const Request& r = slots_[slot];
  file_threads_->submit_write(WriteOp{r.file, r.offset, r.data, r.length}, slot);
}

// ---- either side --------------------------------------------------------------------------------

void UringIoQueue::Callback(uint64_t tag, IoStatus status) {
  // A callback that throws would take the owner, and every later completion, with it.
  try {
    on_complete_(tag, std::move(status));
  } catch (...) {
  }
}

void UringIoQueue::Finished() {
  std::lock_guard lock(mu_);
  if (--unfinished_ == 0) idle_.notify_all();
}

void UringIoQueue::PoolDone(uint32_t slot, IoStatus status) {
  // The slot is the owner's again only once it is in returned_slots_; until then it is ours.
  Callback(slots_[slot].tag, std::move(status));
  {
    std::lock_guard lock(mu_);
    returned_slots_.push_back(slot);
    if (--unfinished_ == 0) idle_.notify_all();
  }
  // The owner may be waiting for a slot to start the next request.
  Wake(/*force=*/false);
}

}  // namespace asyncckpt::io
