#include "src/format/placement.h"

#include <algorithm>

namespace asyncckpt::format {

DataFilePlacer::DataFilePlacer(uint32_t num_files, uint64_t alignment, uint64_t pack_threshold)
    : alignment_(std::max<uint64_t>(1, alignment)),
      pack_threshold_(pack_threshold),
      files_(std::max<uint32_t>(1, num_files)) {}

std::optional<WriteExtent> DataFilePlacer::ClosePack(FileCursor& cursor) {
  std::optional<WriteExtent> pack = std::move(cursor.pack);
  cursor.pack.reset();
  if (pack) {
    pack->padded_bytes = Align(pack->bytes);
    cursor.written_end = pack->offset + pack->padded_bytes;
  }
  return pack;
}

ChunkPlacement DataFilePlacer::Place(uint32_t file, uint64_t stored_bytes) {
  FileCursor& cursor = files_[file];
  ChunkPlacement placement;
  placement.file = file;
  if (stored_bytes >= pack_threshold_) {
    placement.closed_pack = ClosePack(cursor);
    placement.offset = Align(cursor.written_end);
    placement.own_write = WriteExtent{file, placement.offset, stored_bytes, Align(stored_bytes)};
    cursor.written_end = placement.offset + placement.own_write->padded_bytes;
    cursor.logical_end = placement.offset + stored_bytes;
    return placement;
  }
  if (cursor.pack && cursor.pack->bytes + stored_bytes > kPackBytes) {
    placement.closed_pack = ClosePack(cursor);
  }
  if (!cursor.pack) cursor.pack = WriteExtent{file, Align(cursor.written_end), 0, 0};
  placement.packed = true;
  placement.pack_offset = cursor.pack->offset;
  placement.offset = cursor.pack->offset + cursor.pack->bytes;
  cursor.pack->bytes += stored_bytes;
  cursor.logical_end = placement.offset + stored_bytes;
  return placement;
}

std::vector<WriteExtent> DataFilePlacer::Finish() {
  std::vector<WriteExtent> packs;
  for (FileCursor& cursor : files_) {
    if (auto pack = ClosePack(cursor)) packs.push_back(*pack);
  }
  return packs;
}

std::vector<uint64_t> PlannedFileEnds(uint32_t num_files, uint64_t alignment,
                                      uint64_t pack_threshold, std::span<const PlannedChunk> chunks,
                                      bool exact) {
  DataFilePlacer placer(num_files, alignment, pack_threshold);
  std::vector<uint64_t> ends(placer.num_files(), 0);
  if (!exact) {
    const uint64_t align = std::max<uint64_t>(1, alignment);
    for (const PlannedChunk& chunk : chunks) {
      if (chunk.file < ends.size()) ends[chunk.file] += (chunk.bytes + align - 1) / align * align;
    }
    return ends;
  }
  for (const PlannedChunk& chunk : chunks) {
    if (chunk.bytes > 0 && chunk.file < ends.size()) (void)placer.Place(chunk.file, chunk.bytes);
  }
  (void)placer.Finish();
  for (uint32_t file = 0; file < placer.num_files(); ++file) ends[file] = placer.written_end(file);
  return ends;
}

}  // namespace asyncckpt::format
