#pragma once

// Where each chunk of a checkpoint lands in its data file: the one placement every saver uses,
// so that a checkpoint's bytes do not depend on which hook wrote it.
//
// Chunks are placed one at a time, in chunk order (PlanChunks' order), each in the data file
// its job names. A chunk of at least kPackThreshold (by default) stored bytes is a "direct" chunk:
// it starts on an `alignment` boundary and is written on its own, from its own buffer, padded with
// zeros to a multiple of `alignment`. Smaller chunks are "packed": they lie back to back in a pack
// of at most kPackBytes that starts on an `alignment` boundary and is written in one request, so
// that ten thousand small tensors cost a few hundred writes, not ten thousand. With alignment 1
// (buffered files) every chunk simply follows the one before it in its file.
//
// The result is a pure function of (alignment, file count, the sequence of (file, stored size)):
// the same state and options give the same bytes on disk.

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace asyncckpt::format {

/// Alignment of chunks and writes in files opened with O_DIRECT.
inline constexpr uint64_t kDirectAlignment = 4096;
/// Chunks with fewer stored bytes than this share packed writes.
inline constexpr uint64_t kPackThreshold = 128 << 10;
/// Most stored bytes of one pack (one write).
inline constexpr uint64_t kPackBytes = 1 << 20;

/// A range of one data file to write in one request.
struct WriteExtent {
  /// The data file.
  uint32_t file = 0;
  /// First byte in the file (a multiple of the alignment).
  uint64_t offset = 0;
  /// Bytes of chunks in it.
  uint64_t bytes = 0;
  /// Bytes to write: `bytes` rounded up to the alignment (the rest zeros).
  uint64_t padded_bytes = 0;
};

/// Where one chunk landed.
struct ChunkPlacement {
  /// The data file.
  uint32_t file = 0;
  /// Its first byte in the file.
  uint64_t offset = 0;
  /// True when it went into the file's open pack (its bytes are copied there, at
  /// offset - pack.offset, and written with the pack); false for a direct chunk.
  bool packed = false;
  /// Where the open pack it went into starts (packed chunks only).
  uint64_t pack_offset = 0;
  /// A direct chunk's own write (offset, stored bytes, padded length); empty when packed.
  std::optional<WriteExtent> own_write;
  /// A pack this placement closed: write it now. Packs close when full, when a direct chunk
  /// comes to the same file, and at Finish().
  std::optional<WriteExtent> closed_pack;
};

/// Places the chunks of one checkpoint. Not thread-safe: one placer per checkpoint, fed in
/// chunk order from one thread at a time.
class DataFilePlacer {
 public:
  /// `alignment` is 1 for buffered files or kDirectAlignment for O_DIRECT ones; chunks of
  /// fewer than `pack_threshold` stored bytes are packed (0: none).
  DataFilePlacer(uint32_t num_files, uint64_t alignment, uint64_t pack_threshold = kPackThreshold);

  /// Places the next chunk: `stored_bytes` (> 0) in data file `file` (< num_files).
  ChunkPlacement Place(uint32_t file, uint64_t stored_bytes);
  /// Closes every open pack; returns them, to be written. Call once, after the last Place.
  std::vector<WriteExtent> Finish();

  /// The end of the last chunk in `file`: its size once the padding is trimmed.
  uint64_t logical_end(uint32_t file) const { return files_[file].logical_end; }
  /// The end of what is written to `file`, padding included.
  uint64_t written_end(uint32_t file) const { return files_[file].written_end; }
  /// Data files.
  uint32_t num_files() const { return static_cast<uint32_t>(files_.size()); }

 private:
  struct FileCursor {
    uint64_t logical_end = 0;
    uint64_t written_end = 0;
    std::optional<WriteExtent> pack;  // open, not yet written
  };
  uint64_t Align(uint64_t bytes) const {
    return (bytes + alignment_ - 1) / alignment_ * alignment_;
  }
  std::optional<WriteExtent> ClosePack(FileCursor& cursor);

  const uint64_t alignment_;
  const uint64_t pack_threshold_;
  std::vector<FileCursor> files_;
};

/// A chunk as a save knows it before encoding: its data file and its bytes.
struct PlannedChunk {
  /// The data file.
  uint32_t file = 0;
  /// Its stored bytes when known (a raw save), else its raw bytes, which bound them (a chunk
  /// that does not shrink is stored raw).
  uint64_t bytes = 0;
};

/// How far each of `num_files` data files will reach, padding included (what
/// DataFilePlacer::written_end gives after Finish), once `chunks` are placed in this order with
/// `alignment` and `pack_threshold`: the extent to preallocate. With `exact`, each chunk is
/// stored with exactly its bytes and the result is the placer's. Otherwise each is stored with
/// at most its bytes, and the result bounds every such placement: each chunk counts as if
/// written alone, padded to the alignment, which no pack exceeds (a pack's padding is at most
/// its members' own).
std::vector<uint64_t> PlannedFileEnds(uint32_t num_files, uint64_t alignment,
                                      uint64_t pack_threshold, std::span<const PlannedChunk> chunks,
                                      bool exact);

}  // namespace asyncckpt::format
