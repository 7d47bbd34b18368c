// PlanSlabs and CopySlabs: a checkpoint's tensors into one file through a ring of slabs, read
// ahead on one thread while the calling thread writes.

#include "src/interop/slab_copy.h"

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <numeric>
#include <string>
#include <thread>

#include "asyncckpt/tensor.h"
#include "src/util/io_status.h"
#include "src/util/status_macros.h"

namespace asyncckpt::interop {
namespace {

constexpr uint64_t kPage = 4096;  // O_DIRECT's alignment: of reads into slabs, of writes from them

struct Free {
  void operator()(uint8_t* p) const { std::free(p); }
};

// The size the engine most likely cut `t` into: chunk_bytes is a power of two by default, and
// only a tensor's last chunk is shorter.
uint64_t GuessedChunkBytes(const TensorInfo& t) {
  if (t.num_chunks == 0) return kPage;
  return std::bit_ceil(std::max(kPage, (t.bytes + t.num_chunks - 1) / t.num_chunks));
}

// `count` indices of `index_bytes` each, rounded down to a multiple that keeps a piece a whole
// number of chunks, else of pages: a chunk cut by a slab's edge would be read for both slabs.
uint64_t AlignedCount(uint64_t count, uint64_t index_bytes, uint64_t chunk_bytes) {
  for (uint64_t unit : {chunk_bytes, kPage}) {
    const uint64_t indices = unit / std::gcd(index_bytes, unit);  // lcm / index_bytes
    if (indices <= count) return count / indices * indices;
  }
  return count;
}

// How a tensor larger than a slab is cut: one index in each dimension before `dim`, `count`
// indices of `dim` (of `index_bytes` each), all of every later dimension.
struct Cut {
  size_t dim = 0;
  uint64_t index_bytes = 0;
  int64_t count = 0;
};

Cut ChooseCut(const TensorInfo& t, uint64_t slab_bytes) {
  const size_t rank = t.shape.size();
  std::vector<uint64_t> index_bytes(rank);
  uint64_t inner = DTypeSize(t.dtype);  // at most t.bytes: no dimension is 0 here
  for (size_t d = rank; d-- > 0;) {
    index_bytes[d] = inner;
    inner *= uint64_t(t.shape[d]);
  }
  Cut cut;
  while (index_bytes[cut.dim] > slab_bytes) ++cut.dim;  // ends: one element fits a slab
  cut.index_bytes = index_bytes[cut.dim];
  const uint64_t count =
      AlignedCount(slab_bytes / cut.index_bytes, cut.index_bytes, GuessedChunkBytes(t));
  cut.count = int64_t(std::min<uint64_t>(count, uint64_t(t.shape[cut.dim])));
  return cut;
}

// Moves `outer` (the indices of the dimensions before the cut) to the next box; false after
// the last one.
bool NextOuter(const TensorInfo& t, size_t dims, std::vector<int64_t>& outer) {
  for (size_t d = dims; d-- > 0;) {
    if (++outer[d] < t.shape[d]) return true;
    outer[d] = 0;
  }
  return false;
}

// A tensor larger than a slab: each box a slab of its own.
void AddCutTensor(const TensorInfo& t, uint64_t slab_bytes, uint64_t& offset,
                  std::vector<Slab>& slabs) {
  const Cut cut = ChooseCut(t, slab_bytes);
  std::vector<int64_t> outer(cut.dim, 0);
  do {
    for (int64_t i = 0; i < t.shape[cut.dim]; i += cut.count) {
      TensorPiece piece{&t, std::vector<int64_t>(t.shape.size(), 0), t.shape, 0};
      std::copy(outer.begin(), outer.end(), piece.first.begin());
      std::fill(piece.shape.begin(), piece.shape.begin() + ptrdiff_t(cut.dim), 1);
      piece.first[cut.dim] = i;
      piece.shape[cut.dim] = std::min(cut.count, t.shape[cut.dim] - i);
      piece.bytes = uint64_t(piece.shape[cut.dim]) * cut.index_bytes;
      slabs.push_back({offset, piece.bytes, {std::move(piece)}});
      offset += slabs.back().bytes;
    }
  } while (NextOuter(t, cut.dim, outer));
}

// A tensor that fits a slab: whole, in the last slab when it still has room.
void AddWholeTensor(const TensorInfo& t, uint64_t slab_bytes, uint64_t& offset,
                    std::vector<Slab>& slabs) {
  TensorPiece piece{&t, std::vector<int64_t>(t.shape.size(), 0), t.shape, t.bytes};
  if (slabs.empty() || slabs.back().bytes + t.bytes > slab_bytes) slabs.push_back({offset, 0, {}});
  slabs.back().bytes += t.bytes;
  slabs.back().pieces.push_back(std::move(piece));
  offset += t.bytes;
}

std::string DescribeBox(const TensorPiece& piece) {
  std::string out = "[";
  for (size_t d = 0; d < piece.shape.size(); ++d) {
    out += (d ? ", " : "") + std::to_string(piece.first[d]) + ":" +
           std::to_string(piece.first[d] + piece.shape[d]);
  }
  return out + "]";
}

// "tensor "w" box [0:4096, 0:8]", or "tensors "a" to "z" (26)".
std::string DescribeSlab(const Slab& slab) {
  const TensorPiece& first = slab.pieces.front();
  if (slab.pieces.size() > 1) {
    return "tensors \"" + first.tensor->name + "\" to \"" + slab.pieces.back().tensor->name +
           "\" (" + std::to_string(slab.pieces.size()) + ")";
  }
  const bool whole = first.shape == first.tensor->shape;
  return "tensor \"" + first.tensor->name + "\"" + (whole ? "" : " box " + DescribeBox(first));
}

// Reads `slab`'s pieces into `data` in one streaming pass of the reader.
Status ReadSlab(CheckpointReader& reader, const Slab& slab, uint8_t* data) noexcept {
  try {
    TensorRegistry registry;
    for (const TensorPiece& p : slab.pieces) {
      const bool whole = p.shape == p.tensor->shape;
      RETURN_IF_ERROR(registry.add({p.tensor->name, p.tensor->dtype, p.shape, data, p.bytes,
                                    nullptr, whole ? std::vector<int64_t>{} : p.tensor->shape,
                                    whole ? std::vector<int64_t>{} : p.first}));
      data += p.bytes;
    }
    return reader.restore(registry);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("out of memory planning the read");
  } catch (const std::exception& e) {
    return Status::Internal(e.what());
  }
}

// The slabs' memory and who may use which slot: the reader fills slab i into slot i % slots
// once slab i - slots is written; the writer writes slab i once it is filled. Either side may
// stop the other.
class SlabRing {
 public:
  // `slot_bytes`: a multiple of kPage.
  SlabRing(size_t slots, uint64_t slot_bytes) : slots_(slots), slot_bytes_(slot_bytes) {}

  Status Allocate() {
    for (size_t i = 0; i < slots_; ++i) {
      buffers_.emplace_back(static_cast<uint8_t*>(std::aligned_alloc(kPage, slot_bytes_)));
      if (buffers_.back() == nullptr) {
        return Status::ResourceExhausted(std::to_string(slots_) + " slabs of " +
                                         std::to_string(slot_bytes_) + " bytes");
      }
    }
    return Status::OK();
  }
  // Where slab `i` lies in its slot: at its file offset's place in a page, so that a direct
  // write of its pages needs no copy.
  uint8_t* data(size_t i, const Slab& slab) {
    return buffers_[i % slots_].get() + slab.file_offset % kPage;
  }

  // Reader: false when stopped before slab's slot became free.
  bool WaitFree(size_t slab) {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return stopped_ || slab < written_ + slots_; });
    return !stopped_;
  }
  void Filled(Status status) {
    std::lock_guard lock(mu_);
    ++filled_;
    read_status_ = std::move(status);
    changed_.notify_all();
  }
  // Writer: the outcome of reading slab `slab`.
  Status WaitFilled(size_t slab) {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return slab < filled_; });
    return slab + 1 == filled_ ? read_status_ : Status::OK();
  }
  void Written() {
    std::lock_guard lock(mu_);
    ++written_;
    changed_.notify_all();
  }
  void Stop() {
    std::lock_guard lock(mu_);
    stopped_ = true;
    changed_.notify_all();
  }

 private:
  const size_t slots_;
  const uint64_t slot_bytes_;
  std::vector<std::unique_ptr<uint8_t, Free>> buffers_;
  std::mutex mu_;
  std::condition_variable changed_;
  size_t filled_ = 0;   // slabs read (in order; the reader stops at its first error)
  size_t written_ = 0;  // slabs written
  Status read_status_;  // of the last slab read
  bool stopped_ = false;
};

// The reader's side: fills slabs in order until all are read, one fails, or the ring stops.
void ReadAhead(CheckpointReader& reader, std::span<const Slab> slabs, SlabRing& ring) {
  for (size_t i = 0; i < slabs.size(); ++i) {
    if (!ring.WaitFree(i)) return;
    Status status = ReadSlab(reader, slabs[i], ring.data(i, slabs[i]));
    const bool ok = status.ok();
    ring.Filled(std::move(status));
    if (!ok) return;
  }
}

// Joins the reader on every way out, stopping it first so that it never waits for a slot.
class ReaderThread {
 public:
  ReaderThread(CheckpointReader& reader, std::span<const Slab> slabs, SlabRing& ring)
      : ring_(ring), thread_([&reader, slabs, &ring] { ReadAhead(reader, slabs, ring); }) {}
  ~ReaderThread() {
    ring_.Stop();
    thread_.join();
  }
  ReaderThread(const ReaderThread&) = delete;
  ReaderThread& operator=(const ReaderThread&) = delete;

 private:
  SlabRing& ring_;
  std::thread thread_;
};

// Writes slabs in file order. Through a direct (O_DIRECT) file only whole pages go out: the
// bytes of a slab's last, partial page wait in `carry_` and go out at the front of the next
// slab (each slab lies in its slot at its file offset's place in a page), and Finish() writes
// the last partial page padded, then truncates the padding away.
class SlabWriter {
 public:
  explicit SlabWriter(io::File& out) : out_(out) {}

  // `data`: the slab's first byte, at slab.file_offset % kPage of a page-aligned slot.
  Status Write(const Slab& slab, uint8_t* data) {
    if (!out_.is_direct()) return ToStatus(out_.write_at(slab.file_offset, data, slab.bytes));
    const uint64_t page = slab.file_offset - slab.file_offset % kPage;
    if (slab.file_offset % kPage != carry_.size() || (!carry_.empty() && page != carry_offset_)) {
      return Status::Internal("the slab at " + std::to_string(slab.file_offset) +
                              " does not follow the one before");
    }
    uint8_t* first = data - slab.file_offset % kPage;
    std::copy(carry_.begin(), carry_.end(), first);
    const uint64_t end = slab.file_offset + slab.bytes;
    const uint64_t whole = end - end % kPage;  // at least `page`
    if (whole > page) RETURN_IF_ERROR(ToStatus(out_.write_at(page, first, whole - page)));
    carry_.assign(first + (whole - page), first + (end - page));
    carry_offset_ = whole;
    return Status::OK();
  }

  Status Finish() {
    if (!out_.is_direct() || carry_.empty()) return Status::OK();
    const uint64_t size = carry_offset_ + carry_.size();
    std::unique_ptr<uint8_t, Free> page(static_cast<uint8_t*>(std::aligned_alloc(kPage, kPage)));
    if (page == nullptr) return Status::ResourceExhausted("a page for the file's last bytes");
    std::fill(std::copy(carry_.begin(), carry_.end(), page.get()), page.get() + kPage, 0);
    RETURN_IF_ERROR(ToStatus(out_.write_at(carry_offset_, page.get(), kPage)));
    return ToStatus(out_.truncate(size));
  }

 private:
  io::File& out_;
  std::vector<uint8_t> carry_;  // the bytes of the page at carry_offset_ written so far
  uint64_t carry_offset_ = 0;
};

Status WriteSlabs(std::span<const Slab> slabs, SlabRing& ring, io::File& out) {
  SlabWriter writer(out);
  for (size_t i = 0; i < slabs.size(); ++i) {
    const Slab& slab = slabs[i];
    RETURN_IF_ERROR(ring.WaitFilled(i).WithContext("reading " + DescribeSlab(slab)));
    RETURN_IF_ERROR(writer.Write(slab, ring.data(i, slab))
                        .WithContext("writing " + DescribeSlab(slab) + " to " + out.path()));
    ring.Written();
  }
  return writer.Finish().WithContext("writing the last page of " + out.path());
}

Status Copy(CheckpointReader& reader, std::span<const Slab> slabs, io::File& out,
            const SlabCopyOptions& options) {
  if (out.is_direct() && slabs.front().file_offset % kPage != 0) {
    return Status::InvalidArgument(out.path() + " is direct, but its first slab starts at " +
                                   std::to_string(slabs.front().file_offset) + ", not on a page");
  }
  uint64_t largest = 0;
  for (const Slab& slab : slabs) largest = std::max(largest, slab.bytes);
  // A slot holds its slab from the slab's offset in a page on, and whole pages.
  SlabRing ring(std::min<size_t>(std::max(2u, options.slabs), slabs.size()),
                (largest + 2 * kPage - 1) / kPage * kPage);
  RETURN_IF_ERROR(ring.Allocate());
  ReaderThread thread(reader, slabs, ring);
  return WriteSlabs(slabs, ring, out);
}

}  // namespace

std::vector<Slab> PlanSlabs(std::span<const TensorInfo* const> tensors, uint64_t file_offset,
                            uint64_t slab_bytes) {
  slab_bytes = std::max(slab_bytes, kMinSlabBytes);
  std::vector<Slab> slabs;
  for (const TensorInfo* t : tensors) {
    if (t->bytes == 0) continue;
    if (t->bytes <= slab_bytes) {
      AddWholeTensor(*t, slab_bytes, file_offset, slabs);
    } else {
      AddCutTensor(*t, slab_bytes, file_offset, slabs);
    }
  }
  return slabs;
}

Status CopySlabs(CheckpointReader& reader, std::span<const Slab> slabs, io::File& out,
                 const SlabCopyOptions& options) {
  if (slabs.empty()) return Status::OK();
  try {
    return Copy(reader, slabs, out, options);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("out of memory copying tensors to " + out.path());
  } catch (const std::exception& e) {
    // std::thread's system_error, when no thread can be started.
    return Status::Internal("copying tensors to " + out.path() + ": " + e.what());
  }
}

}  // namespace asyncckpt::interop
