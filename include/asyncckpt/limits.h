#pragma once

// The one definition of each option's valid range and shared default, which the library's
// validation, the command-line tool's flags and the Python package (through the library) all use.

#include <cstdint>
#include <string>

#include "asyncckpt/status.h"

namespace asyncckpt {

/// Smallest chunk_bytes: every chunk takes at least one 4 KiB page of pinned staging and, under
/// O_DIRECT, of its data file, so smaller chunks would each be padded to 4 KiB and multiply the
/// checkpoint's size.
inline constexpr uint64_t kMinChunkBytes = 4096;
/// Largest chunk_bytes, and the format's largest raw chunk (src/format/format.h): it bounds what a
/// reader allocates to decode one chunk.
inline constexpr uint64_t kMaxChunkBytes = 1ull << 30;
/// Largest num_data_files.
inline constexpr uint32_t kMaxNumDataFiles = 4096;
/// Largest queue_depth (SaverOptions and ReaderOptions), and the most an io_uring IoQueue keeps in
/// flight (a deeper one asked for is capped to it).
inline constexpr unsigned kMaxQueueDepth = 4096;
/// Largest background_threads.
inline constexpr unsigned kMaxBackgroundThreads = 1024;

/// The pinned staging a synchronous save streams the state through when staging_bytes is 0
/// (or one chunk, when that is larger; never more than one snapshot): its caller waits for the
/// whole save anyway, so a full copy of the state would double the job's memory and buy nothing.
inline constexpr uint64_t kSynchronousStagingBytes = 64ull << 20;

/// Most reads or writes a saver or a reader keeps in flight by default (SaverOptions::queue_depth,
/// ReaderOptions::queue_depth): one default for both, since a read plan coalesces chunks into
/// extents much as the writer packs them, and both sides reach the device's limit at that depth.
inline constexpr unsigned kDefaultQueueDepth = 64;

/// InvalidArgument unless queue_depth is in [1, kMaxQueueDepth] (SaverOptions and ReaderOptions).
inline Status ValidateQueueDepth(unsigned queue_depth) {
  if (queue_depth == 0 || queue_depth > kMaxQueueDepth) {
    return Status::InvalidArgument("queue_depth must be in [1, " + std::to_string(kMaxQueueDepth) +
                                   "], got " + std::to_string(queue_depth));
  }
  return Status::OK();
}

}  // namespace asyncckpt
