#pragma once

// The state of one save in flight and of one chunk travelling through the graph.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "asyncckpt/compression.h"
#include "asyncckpt/device.h"
#include "asyncckpt/file_system.h"
#include "asyncckpt/save_stats.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"
#include "src/codec/codec.h"
#include "src/engine/buffer_pool.h"
#include "src/format/placement.h"
#include "src/format/writer.h"
#include "src/staging/staging_pool.h"
#include "src/util/elapsed.h"

namespace asyncckpt {

/// The memory of one pack: a piece of the staging region where one is free (so that packs
/// waiting for the writers are not memory on top of the staging budget), else a pooled buffer.
struct PackBuffer {
  /// The piece of staging (StagingPool::take_charged), or empty.
  StagingLease staged;
  /// The fallback when staging had no piece that large, or empty.
  PooledBuffer heap;
  /// First byte; null before either is taken.
  uint8_t* data() const { return staged.data() != nullptr ? staged.data() : heap.data(); }
};

/// One save in flight. Written by Submit before its chunks enter the graph; the placement by
/// the serial place node only; read by the commit after the last write (the graph orders it).
struct SaveJob {
  /// Submission order; the commit order.
  uint64_t id = 0;
  /// What the index records.
  CheckpointMetadata metadata;
  /// "<basename>-<step>".
  std::string final_name;
  /// The temporary directory's name in checkpoint_dir.
  std::string tmp_name;
  /// checkpoint_dir + "/" + tmp_name.
  std::string tmp_path;
  /// The registry's tensors (data pointers may be device memory: never read through them).
  std::vector<format::HostTensor> tensors;
  /// Sharded saves: each tensor's global shape and box offset (a whole tensor's are its shape
  /// and zeros), by position in `tensors`; empty otherwise.
  std::vector<std::vector<int64_t>> global_shapes;
  /// See global_shapes.
  std::vector<std::vector<int64_t>> box_offsets;
  /// PlanChunks' jobs; a job's position is its chunk id.
  std::vector<format::ChunkJob> jobs;
  /// Where each job landed, by position.
  std::vector<format::ChunkEntry> entries;
  /// The open data files, by index.
  std::vector<std::unique_ptr<io::File>> files;
  /// Bytes preallocated in each data file (its size until the commit trims it), by index.
  std::vector<uint64_t> allocated;
  /// Placement of the chunks (place node only).
  std::optional<format::DataFilePlacer> placer;
  /// The open pack of each data file (place node only): placed chunks are copied in.
  std::vector<PackBuffer> packs;
  /// The longest chunk's staging (bytes, whole pages): packs taken from staging must leave
  /// room for it, or Submit could wait for this save's own open packs. Set before the graph.
  uint64_t max_job_pages = 0;
  /// The staging each open pack stands for: the pages its chunks had leased (place node only).
  std::vector<uint64_t> pack_charges;
  /// The sum of pack_charges (guarded by the staging pool's lock): Submit of this save does
  /// not wait for its own open packs, which only its later chunks can close.
  uint64_t open_pack_charge = 0;
  /// Chunks through the place node so far (place node only).
  size_t chunks_placed = 0;
  /// Work before the commit may run: one per chunk not yet through the write node, one per
  /// write in flight, and one hold that Submit drops when it is done with the save. Whoever
  /// brings it to zero hands the save to the commit.
  std::atomic<size_t> pending{0};
  /// Set at the first failure; later stages skip their work.
  std::atomic<bool> failed{false};
  /// Sharded saves: the rank that failed the save (SaveStats::failed_rank); set by the commit.
  int failed_rank = -1;
  /// When Submit started.
  SteadyClock::time_point start;
  /// Time Submit blocked its caller.
  double blocked_seconds = 0;
  /// Stored bytes, over every chunk.
  std::atomic<uint64_t> bytes_stored{0};
  /// Chunks per codec.
  std::array<std::atomic<uint64_t>, codec::kNumCodecs> codec_counts{};

  /// Records `why` as the save's failure unless one came first.
  void Fail(const Status& why);
  /// The first failure, or OK.
  Status FirstFailure() const;
  /// `options` with this save's current level (or raw, once switched).
  CompressionOptions Compression(CompressionOptions options) const;
  /// Lowers the level (then stores raw) because encoding is the bottleneck; counts calls and
  /// acts at most every `every` chunks.
  void MaybeLowerLevel(uint64_t every, bool encoders_bottleneck);
  /// Sets the starting level.
  void SetLevel(int level);
  /// The save's report (status, sizes, codecs, levels, times so far).
  SaveStats Stats() const;
  /// How long data file `file` is before the commit trims it: what was written, padding
  /// included, or its preallocation where that is longer. After the last chunk was placed.
  uint64_t FileBytes(uint32_t file) const;

 private:
  mutable std::mutex mu_;
  Status status_;                      // first failure
  int level_ = 0;                      // current zstd level
  bool store_raw_ = false;             // encoding switched off
  uint64_t encoded_since_change_ = 0;  // chunks since the level last changed
};

/// Shared by the graph's messages.
using SavePtr = std::shared_ptr<SaveJob>;

/// A placed pack, closed and ready to write.
struct PackWrite {
  /// Where it goes.
  format::WriteExtent extent;
  /// Its bytes (zero-padded to extent.padded_bytes before the write).
  PackBuffer buffer;
  /// The staging pages its chunks had leased: counted against the budget until written.
  uint64_t charge = 0;
};

/// One chunk travelling through the graph.
struct ChunkMsg {
  /// Its save.
  SavePtr save;
  /// Position in save->jobs.
  uint32_t job = 0;
  /// Global order of chunks over every save (the sequencer's key).
  uint64_t seq = 0;
  /// The snapshot's bytes in staging; released once written (or copied into a pack).
  StagingLease lease;
  /// Stream-ordered mode: the copy to wait for before encoding.
  std::shared_ptr<CopyFence> fence;
  /// The encoded bytes when they do not live in staging.
  PooledBuffer out;
  /// The encoder's result: codec, stored bytes, checksum.
  codec::EncodedChunk encoded;
  /// Where the place node put it.
  format::ChunkPlacement placement;
  /// Packs the place node closed with this chunk, to write with it.
  std::vector<PackWrite> packs;
};

/// Shared by the graph's nodes.
using ChunkPtr = std::shared_ptr<ChunkMsg>;

/// "<checkpoint>: tensor '<name>' chunk <i>" for the chunk at position `job`, for messages.
std::string ChunkContext(const SaveJob& save, uint32_t job);

/// Runs `body`, turning anything it throws into the save's failure at `stage`.
template <typename Body>
void Guarded(SaveJob& save, const char* stage, Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    save.Fail(Status::Internal(save.final_name + ": " + stage + " threw: " + e.what()));
  } catch (...) {
    save.Fail(Status::Internal(save.final_name + ": " + stage + " threw a non-standard exception"));
  }
}

}  // namespace asyncckpt
