#pragma once

// An IoQueue that runs each file's requests in order on one thread, the files spread over a few
// threads: the write path of files that live in memory (tmpfs, ramfs; File::in_memory()).
//
// Why not the ring or the thread pool for them. A buffered write to tmpfs is the kernel copying
// into newly allocated pages under the file's inode lock, on the CPU that asks: CPU work, not a
// transfer a device does. io_uring hands such writes to io-wq, which hashes writes to a regular
// file by inode and starts no second worker for hashed work while one runs, so every write of a
// ring ends up on one worker thread. Beside a training update that keeps every core busy, that one
// thread gets a fair share of one core and the save falls behind the next (issue 33: unpaced
// train-sim, 1 GiB on tmpfs: one iou-wrk thread per ring, on CPU 0.6 s per GiB but runnable and
// waiting 4x longer). A thread per file gives each data file a writer the scheduler counts, and
// keeps each file's writes in order, front to back: time to durable 2.4-3x shorter than the
// ring's, and about the thread pool's, which spreads one file's writes over 32 threads that queue
// on its inode lock (benchmarks/results/sinks/tmpfs-write-paths-1GiB.md).

#include <memory>

#include "asyncckpt/file_system.h"

namespace asyncckpt::io {

/// An IoQueue whose requests run through File::write_at / File::read_at, each file's in the order
/// submitted on one thread. A file with nothing outstanding is placed afresh by its next request:
/// on a thread with no file, a new thread while fewer than max_threads exist (kept for the queue's
/// life), else the thread with fewest files. Depth bounds nothing beyond that (at most
/// min(depth, max_threads) requests run at once) and is reported by depth(). EINVAL for a missing
/// callback, depth 0 or max_threads 0.
IoStatus NewPerFileIoQueue(const IoQueueOptions& options, unsigned max_threads,
                           std::unique_ptr<IoQueue>* queue);

}  // namespace asyncckpt::io
