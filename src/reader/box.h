#pragma once

// The geometry of a box read: which bytes of which slice of a tensor a box [offset, offset +
// shape) needs, and where they go in the box's row-major buffer; and the checks of a box request
// against its tensor and of a registry against the checkpoint. The reader (reader.cc) plans its
// chunk reads from these.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "asyncckpt/reader.h"
#include "asyncckpt/status.h"
#include "src/format/format.h"

namespace asyncckpt::reader {

/// 'name', for messages.
std::string Quote(const std::string& name);
/// "[2, 3]": a shape, for messages.
std::string DescribeShape(const std::vector<int64_t>& shape);
/// "[4:7, 0:8]": a box as first:end per dimension, for messages.
std::string DescribeBox(const std::vector<int64_t>& first, const std::vector<int64_t>& shape);

/// A box of one tensor to read, and where to.
struct BoxRequest {
  const std::string* name = nullptr;
  const std::vector<int64_t>* first = nullptr;
  const std::vector<int64_t>* shape = nullptr;
  uint8_t* dst = nullptr;
  size_t dst_bytes = 0;
  bool whole = false;  // read(): the whole tensor, for its messages
};

/// Checks a box request against its tensor (which exists), in the checkpoint at
/// `checkpoint_path`: rank, bounds, the destination's size. InvalidArgument naming the tensor.
Status CheckBox(const BoxRequest& request, const TensorInfo& info,
                const std::string& checkpoint_path);

/// Checks that every tensor of `registry` is in `reader`'s checkpoint with its dtype and shape (a
/// shard's global shape). InvalidArgument listing every mismatch.
Status CheckRegistry(const CheckpointReader& reader, const TensorRegistry& registry);

/// The part of one slice that a box needs, and where it goes in the box's row-major buffer.
// The slice's raw bytes are seen as rows: a row holds the slice's dimensions from `k` on, where
// every dimension after k is whole in both the slice and the box, so that the box's bytes in a
// row it touches are one run, [run_begin, run_begin + run_bytes) of the row, contiguous in the
// destination too. The outer dimensions [0, k) say which rows the box touches.
struct SliceCut {
  size_t entry = 0;                  // index into Index::tensors
  std::vector<int64_t> outer_shape;  // the slice's dimensions [0, k)
  std::vector<int64_t> first;        // the box's first row index in each, slice coordinates
  std::vector<int64_t> extent;       // the box's extent in each
  std::vector<uint64_t> dst_stride;  // destination bytes per step in each
  uint64_t row_bytes = 0;
  uint64_t run_begin = 0;
  uint64_t run_bytes = 0;
  uint64_t band_begin = 0;  // rows that can hold box bytes: those of the box's rows in dim 0
  uint64_t band_end = 0;
  uint8_t* dst_base = nullptr;  // where the box's first byte in this slice goes
};

/// The cut of slice `t` by the box [box_first, box_first + box_shape) whose bytes go to `dst`,
// or nothing when they share no element. The box lies inside t's global shape (checked).
std::optional<SliceCut> CutSlice(size_t entry, const format::TensorEntry& t,
                                 const std::vector<int64_t>& box_first,
                                 const std::vector<int64_t>& box_shape, uint8_t* dst);

/// Calls fn(slice_byte, length, destination) for every piece of the slice's bytes [a, b) that
// belongs to the box, in order, until fn returns false. Work: one step per row of [a, b)
// inside the box's band.
template <typename Fn>
void ForEachPiece(const SliceCut& cut, uint64_t a, uint64_t b, Fn&& fn) {
  if (b <= a) return;
  const uint64_t r0 = std::max(a / cut.row_bytes, cut.band_begin);
  const uint64_t r1 = std::min((b - 1) / cut.row_bytes + 1, cut.band_end);
  const size_t k = cut.outer_shape.size();
  for (uint64_t r = r0; r < r1; ++r) {
    uint64_t rest = r;
    uint8_t* dst = cut.dst_base;
    bool inside = true;
    for (size_t d = k; d-- > 0;) {
      const uint64_t dim = static_cast<uint64_t>(cut.outer_shape[d]);
      const int64_t index = static_cast<int64_t>(rest % dim);
      rest /= dim;
      if (index < cut.first[d] || index >= cut.first[d] + cut.extent[d]) {
        inside = false;
        break;
      }
      dst += static_cast<uint64_t>(index - cut.first[d]) * cut.dst_stride[d];
    }
    if (!inside) continue;
    const uint64_t begin = r * cut.row_bytes + cut.run_begin;
    const uint64_t from = std::max(begin, a);
    const uint64_t to = std::min(begin + cut.run_bytes, b);
    if (from < to && !fn(from, to - from, dst + (from - begin))) return;
  }
}

}  // namespace asyncckpt::reader
