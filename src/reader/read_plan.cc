#include "src/reader/read_plan.h"

#include <algorithm>
#include <tuple>

namespace asyncckpt::reader {
namespace {

// One requested chunk, as the planner walks a data file.
struct Item {
  size_t tensor;
  size_t chunk;
  uint64_t file_offset;
  uint64_t stored_bytes;
  uint64_t tensor_offset;
  uint8_t* destination;  // where its raw bytes go, or null
  bool raw;
};

uint64_t AlignDown(uint64_t value, uint64_t alignment) { return value / alignment * alignment; }
uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return AlignDown(value + alignment - 1, alignment);
}

// Builds the extents of one data file from its requested chunks in file order.
class FilePlanner {
 public:
  FilePlanner(uint32_t file, const PlanOptions& options, std::vector<Extent>* out)
      : file_(file),
        direct_(file < options.direct.size() && options.direct[file]),
        file_size_(file < options.file_sizes.size() ? options.file_sizes[file] : 0),
        options_(options),
        out_(out) {}

  void Add(const Item& item) {
    if (ReadsInPlace(item)) {
      if (!open_ || !in_place_ || !ContinuesInPlace(item)) Start(item, true);
    } else if (!open_ || in_place_ || !FitsInBounce(item)) {
      Start(item, false);
    }
    if (in_place_) tensor_end_ = item.tensor_offset + item.stored_bytes;
    current_.chunks.push_back(
        {item.tensor, item.chunk, item.file_offset - current_.offset, item.destination});
    end_ = item.file_offset + item.stored_bytes;
  }

  void Finish() {
    if (!open_) return;
    current_.length = end_ - current_.offset;
    if (!in_place_ && direct_) AlignForDirect();
    out_->push_back(std::move(current_));
    open_ = false;
  }

 private:
  // A raw chunk with a destination goes straight there, unless O_DIRECT would need alignment
  // that the destination or the chunk lacks.
  bool ReadsInPlace(const Item& item) const {
    if (!item.raw || item.destination == nullptr) return false;
    if (!direct_) return true;
    const uint64_t a = options_.alignment;
    return item.file_offset % a == 0 && item.stored_bytes % a == 0 &&
           reinterpret_cast<uintptr_t>(item.destination) % a == 0;
  }

  bool ContinuesInPlace(const Item& item) const {
    // Box reads give each chunk its own destination: neighbours in the file and the tensor
    // may still land apart in the caller's buffer.
    return item.tensor == tensor_ && item.file_offset == end_ &&
           item.tensor_offset == tensor_end_ &&
           item.destination == current_.target + (item.file_offset - current_.offset) &&
           end_ + item.stored_bytes - current_.offset <= options_.max_extent_bytes;
  }

  bool FitsInBounce(const Item& item) const {
    return item.file_offset - end_ <= options_.max_gap_bytes &&
           item.file_offset + item.stored_bytes - current_.offset <= options_.max_extent_bytes;
  }

  void Start(const Item& item, bool in_place) {
    Finish();
    current_ = Extent{
        file_, item.file_offset, 0, in_place && direct_, in_place ? item.destination : nullptr, {}};
    open_ = true;
    in_place_ = in_place;
    tensor_ = item.tensor;
    tensor_end_ = item.tensor_offset;
  }

  // Widens a bounce extent to aligned bounds, unless that would read past the end of the file
  // (a file's last block is usually partial): then it stays exact and goes through the
  // buffered handle.
  void AlignForDirect() {
    const uint64_t a = options_.alignment;
    const uint64_t begin = AlignDown(current_.offset, a);
    const uint64_t end = AlignUp(current_.offset + current_.length, a);
    if (end > file_size_) return;
    const uint64_t shift = current_.offset - begin;
    for (PlannedChunk& chunk : current_.chunks) chunk.offset_in_extent += shift;
    current_.offset = begin;
    current_.length = end - begin;
    current_.direct_io = true;
  }

  const uint32_t file_;
  const bool direct_;
  const uint64_t file_size_;
  const PlanOptions& options_;
  std::vector<Extent>* out_;
  Extent current_;
  bool open_ = false;
  bool in_place_ = false;
  size_t tensor_ = 0;
  uint64_t tensor_end_ = 0;  // in place: the tensor offset the next chunk must start at
  uint64_t end_ = 0;         // the last chunk's end in the file
};

}  // namespace

std::vector<Extent> PlanReads(const format::Index& index, std::span<const TensorRequest> requests,
                              const PlanOptions& options) {
  std::vector<ChunkRequest> chunks;
  for (const TensorRequest& request : requests) {
    const format::TensorEntry& tensor = index.tensors[request.tensor];
    for (size_t i = 0; i < tensor.chunks.size(); ++i) {
      uint8_t* destination = request.destination == nullptr
                                 ? nullptr
                                 : request.destination + tensor.chunks[i].tensor_offset;
      chunks.push_back({request.tensor, i, destination});
    }
  }
  return PlanChunkReads(index, chunks, options);
}

std::vector<Extent> PlanChunkReads(const format::Index& index,
                                   std::span<const ChunkRequest> requests,
                                   const PlanOptions& options) {
  std::vector<std::vector<Item>> per_file(index.num_data_files);
  for (const ChunkRequest& request : requests) {
    const format::ChunkEntry& c = index.tensors[request.tensor].chunks[request.chunk];
    per_file[c.file_index].push_back({request.tensor, request.chunk, c.file_offset, c.stored_bytes,
                                      c.tensor_offset, request.destination,
                                      c.codec == codec::Codec::kRaw});
  }
  std::vector<Extent> extents;
  for (uint32_t file = 0; file < per_file.size(); ++file) {
    std::vector<Item>& items = per_file[file];
    std::sort(items.begin(), items.end(),
              [](const Item& a, const Item& b) { return a.file_offset < b.file_offset; });
    FilePlanner planner(file, options, &extents);
    for (const Item& item : items) planner.Add(item);
    planner.Finish();
  }
  std::stable_sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return std::tie(a.offset, a.file) < std::tie(b.offset, b.file);
  });
  return extents;
}

}  // namespace asyncckpt::reader
