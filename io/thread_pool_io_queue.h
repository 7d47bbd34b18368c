#pragma once

// The default IoQueue: a small pool of threads, each running one request at a time through
// File::write_at / File::read_at. It works for every FileSystem, wrappers included (their Files'
// behaviour applies), at the cost of a thread per request in flight. The io_uring backend has
// its own queue, which keeps `depth` requests in flight from one thread.

#include <memory>

#include "asyncckpt/file_system.h"

namespace asyncckpt::io {

/// A thread-pool IoQueue with min(options.depth, kMaxPoolQueueThreads) threads; EINVAL when
/// options.on_complete is empty or options.depth is 0.
IoStatus NewThreadPoolIoQueue(const IoQueueOptions& options, std::unique_ptr<IoQueue>* queue);

}  // namespace asyncckpt::io
