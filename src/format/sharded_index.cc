// The checks of a sharded index's slices: each inside its global shape, written by its rank; the
// slices of a name tiling the global shape.

#include "src/format/sharded_index.h"

#include <algorithm>
#include <array>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace asyncckpt::format {

namespace {

// "[4:7, 0:8]": a box as first:end per dimension, for messages.
std::string BoxText(const std::vector<int64_t>& first, const std::vector<int64_t>& extent) {
  std::string text = "[";
  for (size_t d = 0; d < extent.size(); ++d) {
    if (d > 0) text += ", ";
    const int64_t begin = d < first.size() ? first[d] : 0;
    int64_t end = 0;
    // A hostile box may not fit in 64 bits; the message must not overflow to say so.
    const bool fits = !__builtin_add_overflow(begin, extent[d], &end);
    text += std::to_string(begin) + ":" + (fits ? std::to_string(end) : std::string("overflow"));
  }
  return text + "]";
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    text += (d > 0 ? ", " : "") + std::to_string(shape[d]);
  }
  return text + "]";
}

// "tensor 'w' slice 2 (box [4:7, 0:8] by rank 1)": slice k is the name's k-th entry.
std::string SliceName(const TensorEntry& tensor, size_t k) {
  return "tensor " + QuoteName(tensor.name) + " slice " + std::to_string(k) + " (box " +
         BoxText(tensor.box_offset, tensor.shape) + " by rank " +
         std::to_string(tensor.writer_rank) + ")";
}

// One slice on its own: a box of the right rank inside a global shape whose byte size fits,
// written by a rank of the job into that rank's data files.
Status CheckSlice(const Index& index, const TensorEntry& tensor, size_t k,
                  const std::string& prefix) {
  const std::string what = SliceName(tensor, k);
  const size_t rank = tensor.shape.size();
  if (tensor.global_shape.size() != rank || tensor.box_offset.size() != rank) {
    return Status::Corruption(prefix + what + " has shape rank " + std::to_string(rank) +
                              " but global shape rank " +
                              std::to_string(tensor.global_shape.size()) + " and box offset rank " +
                              std::to_string(tensor.box_offset.size()));
  }
  const int64_t global = NumElements(tensor.global_shape);
  if (global < 0 || static_cast<uint64_t>(global) > UINT64_MAX / DTypeSize(tensor.dtype)) {
    return Status::Corruption(prefix + what + " has a negative or overflowing global shape " +
                              ShapeText(tensor.global_shape));
  }
  for (size_t d = 0; d < rank; ++d) {
    const int64_t first = tensor.box_offset[d];
    if (first < 0 || first > tensor.global_shape[d] ||
        tensor.shape[d] > tensor.global_shape[d] - first) {
      return Status::Corruption(prefix + what + " leaves the global shape " +
                                ShapeText(tensor.global_shape) + " in dimension " +
                                std::to_string(d));
    }
  }
  if (tensor.writer_rank >= index.world_size) {
    return Status::Corruption(prefix + what + " names writer rank " +
                              std::to_string(tensor.writer_rank) + " but the world size is " +
                              std::to_string(index.world_size));
  }
  const uint32_t files_per_rank = index.num_data_files / index.world_size;
  for (size_t i = 0; i < tensor.chunks.size(); ++i) {
    const uint32_t file = tensor.chunks[i].file_index;
    if (file / files_per_rank != tensor.writer_rank) {
      return Status::Corruption(prefix + what + " chunk " + std::to_string(i) +
                                " is in data file " + std::to_string(file) + ", written by rank " +
                                std::to_string(file / files_per_rank) + ", not by its writer");
    }
  }
  return Status::OK();
}

int64_t End(const TensorEntry& t, size_t d) { return t.box_offset[d] + t.shape[d]; }

bool Overlap(const TensorEntry& a, const TensorEntry& b) {
  for (size_t d = 0; d < a.shape.size(); ++d) {
    if (std::max(a.box_offset[d], b.box_offset[d]) >= std::min(End(a, d), End(b, d))) return false;
  }
  return true;
}

// Most pairs of slices the overlap sweep compares for one name before it gives up (a hostile
// index can make the sweep quadratic; a real job's slices never reach the sweep, CornersTile
// proves their tiling first).
constexpr uint64_t kMaxSweepComparisons = 1ull << 24;
// Most dimensions in which CornersTile handles slices that do not span the whole global extent
// (2^this corners per slice).
constexpr size_t kMaxCornerDims = 4;

struct CornerHash {
  size_t operator()(const std::array<int64_t, kMaxCornerDims>& c) const {
    uint64_t h = 0x9E3779B97F4A7C15ULL;
    for (int64_t v : c) h = (h ^ static_cast<uint64_t>(v)) * 0xBF58476D1CE4E5B9ULL;
    return static_cast<size_t>(h ^ (h >> 31));
  }
};

// Whether the non-empty slices `live` (positions into `slices`), all inside the global shape,
// cover every element of it an odd number of times: true exactly when every corner of a slice
// appears an even number of times among all slices' corners, except the global box's corners,
// once each (the lattice's mixed difference of a box's indicator is ±1 at its 2^d corners and
// is invertible, so corner parities fix coverage parities). With elements adding up to the
// global shape's, odd coverage everywhere is coverage exactly once: a tiling, in
// O(slices × 2^d) instead of a search for overlapping pairs. False also when the slices are
// cut in more than kMaxCornerDims dimensions (the caller then searches).
bool CornersTile(const Index& index, const std::vector<size_t>& slices,
                 const std::vector<size_t>& live) {
  const TensorEntry& first = index.tensors[slices[0]];
  std::vector<size_t> cut;  // dimensions in which some slice is not the whole extent
  for (size_t d = 0; d < first.global_shape.size(); ++d) {
    for (size_t k : live) {
      const TensorEntry& t = index.tensors[slices[k]];
      if (t.box_offset[d] != 0 || t.shape[d] != first.global_shape[d]) {
        cut.push_back(d);
        break;
      }
    }
  }
  if (cut.size() > kMaxCornerDims) return false;
  std::unordered_set<std::array<int64_t, kMaxCornerDims>, CornerHash> odd;
  odd.reserve(live.size() << cut.size());
  auto toggle = [&](const std::vector<int64_t>& lo, const std::vector<int64_t>& extent) {
    for (uint32_t mask = 0; mask < (1u << cut.size()); ++mask) {
      std::array<int64_t, kMaxCornerDims> corner{};
      for (size_t j = 0; j < cut.size(); ++j) {
        const size_t d = cut[j];
        corner[j] = lo[d] + ((mask >> j) & 1 ? extent[d] : 0);
      }
      if (!odd.insert(corner).second) odd.erase(corner);
    }
  };
  for (size_t k : live) {
    const TensorEntry& t = index.tensors[slices[k]];
    toggle(t.box_offset, t.shape);
  }
  toggle(std::vector<int64_t>(first.global_shape.size(), 0), first.global_shape);
  return odd.empty();
}

// The slices of one name (indices into index.tensors, in index order, each already through
// CheckSlice): one dtype and global shape, one slice per writer rank, no two sharing an element,
// and with `tiling`, every element of the global shape in a slice.
Status CheckSlicesOfOneName(const Index& index, const std::vector<size_t>& slices, bool tiling,
                            const std::string& prefix) {
  const TensorEntry& first = index.tensors[slices[0]];
  std::vector<uint32_t> ranks;
  ranks.reserve(slices.size());
  for (size_t k = 1; k < slices.size(); ++k) {
    const TensorEntry& t = index.tensors[slices[k]];
    if (t.dtype != first.dtype || t.global_shape != first.global_shape) {
      return Status::Corruption(prefix + SliceName(t, k) + " is " +
                                std::string(DTypeName(t.dtype)) + " of global shape " +
                                ShapeText(t.global_shape) + " but slice 0 is " +
                                std::string(DTypeName(first.dtype)) + " of global shape " +
                                ShapeText(first.global_shape));
    }
  }
  // Several entries per rank would make the overlap search quadratic in a hostile index.
  std::vector<std::pair<uint32_t, size_t>> by_rank;
  by_rank.reserve(slices.size());
  for (size_t k = 0; k < slices.size(); ++k) {
    by_rank.emplace_back(index.tensors[slices[k]].writer_rank, k);
  }
  std::sort(by_rank.begin(), by_rank.end());
  for (size_t i = 1; i < by_rank.size(); ++i) {
    if (by_rank[i].first == by_rank[i - 1].first) {
      return Status::Corruption(
          prefix + SliceName(index.tensors[slices[by_rank[i - 1].second]], by_rank[i - 1].second) +
          " and slice " + std::to_string(by_rank[i].second) + " have the same writer rank");
    }
  }
  const size_t rank = first.shape.size();
  auto at = [&](size_t k) -> const TensorEntry& { return index.tensors[slices[k]]; };
  std::vector<size_t> live;  // positions k of slices with at least one element
  uint64_t covered = 0;      // their elements; inside the global shape, so no overflow until
                             // more than its elements are claimed, which stops the sum
  const uint64_t global = static_cast<uint64_t>(NumElements(first.global_shape));
  for (size_t k = 0; k < slices.size(); ++k) {
    const uint64_t elements = static_cast<uint64_t>(NumElements(at(k).shape));
    if (elements == 0) continue;
    live.push_back(k);
    if (covered <= global) covered += elements;
  }
  // The quick proof of a tiling; when it does not hold, the sweep below says what is wrong.
  if (tiling && covered == global && CornersTile(index, slices, live)) return Status::OK();

  // Sweep along the dimension with the most distinct offsets: slices leave the active set once
  // the sweep passes their end, so a slice is compared only with those it could touch there.
  size_t sweep = 0;
  size_t most = 0;
  for (size_t d = 0; d < rank; ++d) {
    std::vector<int64_t> offsets;
    offsets.reserve(live.size());
    for (size_t k : live) offsets.push_back(at(k).box_offset[d]);
    std::sort(offsets.begin(), offsets.end());
    const size_t distinct =
        static_cast<size_t>(std::unique(offsets.begin(), offsets.end()) - offsets.begin());
    if (distinct > most) {
      most = distinct;
      sweep = d;
    }
  }
  auto start = [&](size_t k) { return rank == 0 ? 0 : at(k).box_offset[sweep]; };
  std::stable_sort(live.begin(), live.end(),
                   [&](size_t a, size_t b) { return start(a) < start(b); });
  std::vector<size_t> active;
  uint64_t comparisons = 0;
  for (size_t k : live) {
    if (rank > 0) {
      std::erase_if(active, [&](size_t a) { return End(at(a), sweep) <= start(k); });
    }
    comparisons += active.size();
    if (comparisons > kMaxSweepComparisons) {
      // Only a hostile index gets here (a real job's slices pass CornersTile): bounded work.
      return Status::Corruption(
          prefix + "tensor " + QuoteName(first.name) + ": its " + std::to_string(slices.size()) +
          " slices do not tile its global shape " + ShapeText(first.global_shape) +
          " (too many to name the slices that overlap or the gap)");
    }
    for (size_t a : active) {
      if (Overlap(at(a), at(k))) {
        const size_t lo = std::min(a, k);
        const size_t hi = std::max(a, k);
        return Status::Corruption(prefix + SliceName(at(lo), lo) + " and slice " +
                                  std::to_string(hi) + " (box " +
                                  BoxText(at(hi).box_offset, at(hi).shape) +
                                  ") overlap; every element must be written once");
      }
    }
    active.push_back(k);
  }
  // Inside the global shape and without overlap, the slices tile it exactly when their
  // elements add up to its own.
  if (tiling && covered != global) {
    return Status::Corruption(
        prefix + "tensor " + QuoteName(first.name) + ": its " + std::to_string(slices.size()) +
        " slices cover " + std::to_string(covered) + " of the " + std::to_string(global) +
        " elements of its global shape " + ShapeText(first.global_shape) + " (a gap)");
  }
  return Status::OK();
}

}  // namespace

Status CheckSlices(const Index& index, bool tiling, const std::string& prefix) {
  std::unordered_map<std::string_view, std::vector<size_t>> by_name;
  std::vector<std::string_view> order;
  for (size_t i = 0; i < index.tensors.size(); ++i) {
    const TensorEntry& tensor = index.tensors[i];
    std::vector<size_t>& slices = by_name[tensor.name];
    if (slices.empty()) order.push_back(tensor.name);
    Status status = CheckSlice(index, tensor, slices.size(), prefix);
    if (!status.ok()) return status;
    slices.push_back(i);
  }
  for (std::string_view name : order) {
    Status status = CheckSlicesOfOneName(index, by_name[name], tiling, prefix);
    if (!status.ok()) return status;
  }
  return Status::OK();
}

}  // namespace asyncckpt::format
