#pragma once

// The io_uring backend. Files, single reads and writes and every directory operation are the
// POSIX backend's; new_io_queue() hands out a UringIoQueue, a ring with an owner thread of its
// own (io/uring_io_queue.h), and register_buffers() publishes the fixed-buffer table that
// every such queue's ring registers.

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "asyncckpt/file_system.h"
#include "io/posix_file_system.h"
#include "io/uring_io_queue.h"

namespace asyncckpt::io {

/// io_uring queues on top of the POSIX backend. Thread-safe; must not be destroyed while a
/// call is running (its queues may outlive it).
class UringFileSystem final : public PosixFileSystem {
 public:
  /// Sets up a probe ring and sends a NOP through it (proving that io_uring and its
  /// read/write opcodes work here), then closes it; null with *why set, e.g.
  /// "io_uring_queue_init (a probe ring): Operation not permitted", when it cannot.
  static std::unique_ptr<UringFileSystem> Create(const IoOptions& options, std::string* why);
  ~UringFileSystem() override = default;
  UringFileSystem(const UringFileSystem&) = delete;
  UringFileSystem& operator=(const UringFileSystem&) = delete;

  std::string name() const override { return "io_uring"; }
  /// A UringIoQueue sharing this file system's registered buffers; the thread-pool queue when
  /// no ring can be set up now. The queue may outlive the file system (its Files may not).
  IoStatus new_io_queue(const IoQueueOptions& options, std::unique_ptr<IoQueue>* queue) override;
  /// RegisterBuffers() for the public interface.
  IoStatus register_buffers(std::span<const IoBuffer> buffers) override;
  /// UnregisterBuffers() for the public interface.
  void unregister_buffers() override { UnregisterBuffers(); }

  /// Registers `buffers` as fixed buffers (replacing earlier ones) on every live queue's ring,
  /// waiting until each queue's owner has switched tables, and on the ring of every queue made
  /// later, so that a request lying wholly inside one of them is sent as WRITE_FIXED /
  /// READ_FIXED. Buffers may not overlap (EINVAL). When the kernel refuses (ENOMEM under
  /// RLIMIT_MEMLOCK, which every ring's pins count against; too many buffers) I/O silently
  /// goes on without them: the returned status only informs. The memory must stay mapped
  /// until UnregisterBuffers() returns, a later RegisterBuffers() returns, or the file system
  /// and its queues are destroyed. Not from an IoQueue callback.
  IoStatus RegisterBuffers(std::span<const iovec> buffers);
  /// Forgets the registered buffers.
  void UnregisterBuffers();
  /// How many requests the queues sent to the kernel as READ_FIXED / WRITE_FIXED so far.
  uint64_t fixed_requests() const { return queue_buffers_->fixed_requests(); }

 private:
  UringFileSystem() = default;

  const std::shared_ptr<UringFixedBuffers> queue_buffers_ = std::make_shared<UringFixedBuffers>();
};

}  // namespace asyncckpt::io
