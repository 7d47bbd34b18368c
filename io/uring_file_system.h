#pragma once

// The io_uring backend. Files, single reads and writes and every directory operation are the
// POSIX backend's; write_batch() and read_batch() go through a pool of rings (below), and
// new_io_queue() hands out a UringIoQueue, a ring with an owner thread of its own
// (io/uring_io_queue.h).
//
// The life of a ring. A ring is not thread-safe, so the file system keeps a pool of them
// behind a mutex: a batch takes an idle ring (or sets up a new one), owns it alone until
// every request it submitted has completed, and puts it back. The pool therefore grows to
// the largest number of batches that ever ran at once and no further. All rings are closed
// by the destructor; a ring whose submission failed beyond repair is drained and closed at
// once instead of going back. No request is ever left in flight when a batch returns, so a
// caller may free its buffers as soon as the call is over, whatever it returned.

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "io/posix_file_system.h"
#include "io/uring_io_queue.h"

namespace asyncckpt::io {

class UringRing;

/// io_uring batches on top of the POSIX backend. Thread-safe; must not be destroyed while a
/// call is running.
///
/// A batch keeps at most queue_depth requests in flight, each tagged with its op's index;
/// short transfers are resubmitted for the remainder, -EAGAIN/-EINTR are resubmitted, a read
/// that reaches the end of the file early fails with EIO "unexpected end of file". After the
/// first failure no new op is started, the ones in flight are reaped, and the failure of the
/// lowest-numbered failed op is returned. The ops of one batch run concurrently and in no
/// particular order, so ops that overlap in one file leave unspecified bytes there. Ops on a
/// File without a descriptor (fd() == -1) run synchronously through the File in their turn.
class UringFileSystem final : public PosixFileSystem {
 public:
  /// Sets up a first ring and sends a NOP through it (proving that io_uring and its
  /// read/write opcodes work here); null with *why set, e.g. "io_uring_queue_init (queue
  /// depth 64): Operation not permitted", when it cannot. queue_depth is clamped to [1, 4096].
  static std::unique_ptr<UringFileSystem> Create(const IoOptions& options, std::string* why);
  ~UringFileSystem() override;
  UringFileSystem(const UringFileSystem&) = delete;
  UringFileSystem& operator=(const UringFileSystem&) = delete;

  std::string name() const override { return "io_uring"; }
  IoStatus write_batch(std::span<const WriteOp> ops) override;
  IoStatus read_batch(std::span<const ReadOp> ops) override;
  /// A UringIoQueue sharing this file system's registered buffers; the thread-pool queue when
  /// no ring can be set up now (queue_fallbacks() counts those). The queue may outlive the
  /// file system (its Files may not).
  IoStatus new_io_queue(const IoQueueOptions& options, std::unique_ptr<IoQueue>* queue) override;
  /// RegisterBuffers() for the public interface.
  IoStatus register_buffers(std::span<const IoBuffer> buffers) override;
  /// UnregisterBuffers() for the public interface.
  void unregister_buffers() override { UnregisterBuffers(); }

  /// Registers `buffers` as fixed buffers (replacing earlier ones) on every ring, the batch
  /// pool's and every live queue's (waiting until each queue's owner has switched tables),
  /// so that an op lying wholly inside one of them is sent as WRITE_FIXED / READ_FIXED.
  /// Buffers may not overlap (EINVAL). When the kernel refuses (ENOMEM under RLIMIT_MEMLOCK,
  /// which every ring's pins count against; too many buffers) I/O silently goes on without
  /// them: the returned status only informs. The memory must stay mapped until
  /// UnregisterBuffers() returns, a later RegisterBuffers() returns, or the file system is
  /// destroyed. Not from an IoQueue callback.
  IoStatus RegisterBuffers(std::span<const iovec> buffers);
  /// Forgets the registered buffers; rings busy in another batch drop them when it ends.
  void UnregisterBuffers();
  /// How many rings were set up so far (the pool's high-water mark plus any closed as broken).
  size_t rings_created() const { return rings_created_.load(std::memory_order_relaxed); }
  /// How many requests (batch ops and queue SQEs) went to the kernel as READ_FIXED /
  /// WRITE_FIXED so far.
  uint64_t fixed_requests() const {
    return fixed_requests_.load(std::memory_order_relaxed) + queue_buffers_->fixed_requests();
  }
  /// How many new_io_queue() calls fell back to the thread pool for want of a ring.
  uint64_t queue_fallbacks() const { return queue_fallbacks_.load(std::memory_order_relaxed); }

 private:
  UringFileSystem(unsigned queue_depth, std::unique_ptr<UringRing> first_ring);

  // One op of either kind, as a batch sees it.
  struct Request {
    File* file;
    uint64_t offset;
    char* data;
    size_t length;
    bool write;
  };

  IoStatus RunBatch(std::vector<Request>& requests);
  // An idle ring brought up to date with the registered buffers, a new one, or null when no
  // ring can be set up now (the batch then runs through the POSIX loop).
  std::unique_ptr<UringRing> AcquireRing();
  void ReleaseRing(std::unique_ptr<UringRing> ring);
  // Errno from registering the current buffers on `ring`, 0 on success or with none.
  int RefreshRegistration(UringRing& ring);

  const unsigned queue_depth_;
  std::atomic<size_t> rings_created_{1};
  std::atomic<uint64_t> fixed_requests_{0};
  std::atomic<uint64_t> queue_fallbacks_{0};
  const std::shared_ptr<UringFixedBuffers> queue_buffers_ = std::make_shared<UringFixedBuffers>();
  std::mutex mu_;
  std::vector<std::unique_ptr<UringRing>> idle_rings_;  // guarded by mu_
  std::vector<iovec> fixed_buffers_;                    // guarded by mu_; sorted by address
  uint64_t fixed_generation_ = 0;                       // guarded by mu_
};

}  // namespace asyncckpt::io
