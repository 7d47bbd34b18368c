#pragma once

// The seam between asyncckpt and whatever runs the processes of a multi-process job. A hook
// calls a Coordinator only from the training thread, at points every rank reaches in the same
// order (begin, after_create_session, the save_secs decision), never from background threads:
// the commit of a sharded checkpoint agrees through the file system (docs/distributed.md), so
// that a rank that dies cannot hang the others.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "asyncckpt/status.h"

namespace asyncckpt {

/// The processes of one job, and the few collective operations the hooks need.
class Coordinator {
 public:
  virtual ~Coordinator() = default;
  /// This process's rank, 0 <= rank() < size().
  virtual int rank() const = 0;
  /// Processes in the job.
  virtual int size() const = 0;
  /// Collective: every rank's `bytes` becomes root's. Every rank calls it, in the same order.
  virtual Status broadcast(std::vector<uint8_t>& bytes, int root) = 0;
  /// Collective: every rank gets every rank's bytes, in rank order.
  virtual Result<std::vector<std::vector<uint8_t>>> all_gather(std::span<const uint8_t> bytes) = 0;
};

/// The coordinator of a job of one process: rank 0 of 1, collectives are copies.
std::unique_ptr<Coordinator> NewSingleProcessCoordinator();

}  // namespace asyncckpt
