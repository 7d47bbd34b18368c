#pragma once

// Runs a read plan: keeps up to queue_depth extents in flight through an io::IoQueue, with a
// bounded amount of bounce-buffer memory, and hands every chunk of each completed extent to a
// sink while later reads are still in flight. The calling thread submits, and decodes the
// completed extents together with oneTBB's workers (parallel_for_each), so a caller that is a
// oneTBB worker itself never waits on tasks it cannot help with.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/limits.h"
#include "asyncckpt/status.h"
#include "src/reader/read_plan.h"

namespace asyncckpt::reader {

/// The open handles of one data file.
struct DataFileHandles {
  /// Opened without O_DIRECT: reads any range (unaligned extents, retries of single chunks).
  io::File* buffered = nullptr;
  /// Opened with O_DIRECT, or null when the file system refused it or it was not asked for.
  io::File* direct = nullptr;
};

/// How to run a plan.
struct StreamOptions {
  /// Most extents read or decoded at once.
  unsigned queue_depth = kDefaultQueueDepth;
  /// Most bytes of bounce buffers held at once; an extent larger than this still runs, alone.
  uint64_t buffer_bytes = 64ull << 20;
  /// Alignment of bounce buffers (O_DIRECT's).
  size_t alignment = 4096;
};

/// Receives the stored bytes of one chunk (in a bounce buffer, or in place at the extent's
/// target). Called from the submitting thread or a oneTBB worker, concurrently for different
/// chunks; must not throw.
using ChunkSink = std::function<void(const PlannedChunk& chunk, std::span<uint8_t> stored)>;
/// Receives a chunk that could not be read (its read failed, or there was no memory for its
/// bounce buffer). Same threads and rules as ChunkSink.
using ChunkFailed = std::function<void(const PlannedChunk& chunk, const Status& status)>;

/// Reads every extent of `plan` from `files` (one entry per data file) and passes each chunk to
/// `sink` or `failed`, exactly once, before returning. When a read of an extent of several chunks
/// fails, each of its chunks is read again alone through the buffered handle, so that only the
/// chunks that really cannot be read are reported. `chunk_bytes(chunk)` is a chunk's stored size.
/// A queue that cannot be created falls back to reading one extent at a time. Throws only what
/// oneTBB or an allocation outside the bounce buffers throws; even then every request submitted
/// has completed before it returns.
void RunReadPlan(io::FileSystem& fs, std::span<const DataFileHandles> files,
                 std::span<const Extent> plan,
                 const std::function<uint64_t(const PlannedChunk&)>& chunk_bytes,
                 const StreamOptions& options, const ChunkSink& sink, const ChunkFailed& failed);

/// The regions of `regions` (first byte, bytes) that some extent of `plan` reads into in place.
/// Only those are worth registering: a destination whose reads all go through bounce buffers
/// (O_DIRECT cannot reach memory that is not 4 KiB aligned, e.g. torch's 64-byte aligned
/// tensors) would have its every page faulted in and pinned before the first read, for nothing.
std::vector<std::pair<uint8_t*, uint64_t>> RegionsReadInPlace(
    std::span<const std::pair<uint8_t*, uint64_t>> regions, std::span<const Extent> plan);

/// Host memory a restore reads into, registered with the file system for its lifetime (io_uring
/// fixed buffers): the pages are faulted in and pinned once, up front, rather than pinned again
/// by every O_DIRECT read (issue 17's restore profile). Only for a file system the reader owns:
/// registration replaces whatever was registered before. A failure only costs the speed.
class RegisteredDestinations {
 public:
  /// Registers `regions` (first byte, bytes) with `fs`, in pieces io_uring accepts; nothing
  /// when fs is null or there are more than kMaxRegions regions.
  RegisteredDestinations(io::FileSystem* fs,
                         std::span<const std::pair<uint8_t*, uint64_t>> regions);
  /// Unregisters.
  ~RegisteredDestinations();
  RegisteredDestinations(const RegisteredDestinations&) = delete;
  RegisteredDestinations& operator=(const RegisteredDestinations&) = delete;
  /// Most regions registered: each costs a slot of the ring's table (at most 16384) and a pin.
  static constexpr size_t kMaxRegions = 1024;

 private:
  io::FileSystem* fs_ = nullptr;  // null: nothing registered
};

}  // namespace asyncckpt::reader
