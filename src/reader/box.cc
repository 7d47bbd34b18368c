// The geometry of a box read (CutSlice) and the checks of what a read or restore asks for
// (CheckBox, CheckRegistry).

#include "src/reader/box.h"

namespace asyncckpt::reader {

std::string Quote(const std::string& name) { return "'" + name + "'"; }

std::string DescribeShape(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// "[4:7, 0:8]": a box as first:end per dimension.
std::string DescribeBox(const std::vector<int64_t>& first, const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size() && i < first.size(); ++i) {
    int64_t end = 0;
    const bool fits = !__builtin_add_overflow(first[i], shape[i], &end);
    out += (i ? ", " : "") + std::to_string(first[i]) + ":" +
           (fits ? std::to_string(end) : std::string("overflow"));
  }
  return out + "]";
}

Status CheckBox(const BoxRequest& request, const TensorInfo& info,
                const std::string& checkpoint_path) {
  const std::vector<int64_t>& first = *request.first;
  const std::vector<int64_t>& shape = *request.shape;
  const std::string what = "tensor " + Quote(info.name) + " in " + checkpoint_path;
  if (first.size() != info.shape.size() || shape.size() != info.shape.size()) {
    return Status::InvalidArgument("a box with offset of rank " + std::to_string(first.size()) +
                                   " and shape of rank " + std::to_string(shape.size()) +
                                   " does not fit " + what + " of shape " +
                                   DescribeShape(info.shape));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (first[d] < 0 || shape[d] < 0 || first[d] > info.shape[d] ||
        shape[d] > info.shape[d] - first[d]) {
      return Status::InvalidArgument("box " + DescribeBox(first, shape) + " leaves " + what +
                                     " of shape " + DescribeShape(info.shape) + " in dimension " +
                                     std::to_string(d));
    }
  }
  // Inside the shape, the box's bytes fit as the tensor's do.
  const uint64_t bytes = static_cast<uint64_t>(NumElements(shape)) * DTypeSize(info.dtype);
  if (request.dst_bytes != bytes) {
    return Status::InvalidArgument(
        (request.whole ? what : "box " + DescribeBox(first, shape) + " of " + what) + " holds " +
        std::to_string(bytes) + " bytes; the destination has " + std::to_string(request.dst_bytes));
  }
  if (bytes > 0 && request.dst == nullptr) {
    return Status::InvalidArgument("null destination for tensor " + Quote(info.name));
  }
  return Status::OK();
}

std::optional<SliceCut> CutSlice(size_t entry, const format::TensorEntry& t,
                                 const std::vector<int64_t>& box_first,
                                 const std::vector<int64_t>& box_shape, uint8_t* dst) {
  const size_t rank = t.shape.size();
  const uint64_t elem = DTypeSize(t.dtype);
  std::vector<int64_t> lo(rank), extent(rank);
  for (size_t d = 0; d < rank; ++d) {
    lo[d] = std::max(t.box_offset[d], box_first[d]);
    const int64_t hi = std::min(t.box_offset[d] + t.shape[d], box_first[d] + box_shape[d]);
    if (hi <= lo[d]) return std::nullopt;
    extent[d] = hi - lo[d];
  }
  std::vector<uint64_t> box_stride(rank, 1);  // elements
  for (size_t d = rank; d-- > 1;) {
    box_stride[d - 1] = box_stride[d] * static_cast<uint64_t>(box_shape[d]);
  }
  SliceCut cut;
  cut.entry = entry;
  size_t k = rank == 0 ? 0 : rank - 1;
  while (k > 0 && extent[k] == t.shape[k] && extent[k] == box_shape[k]) --k;
  uint64_t inner = elem;  // bytes of one step in dimension k
  for (size_t d = k + 1; d < rank; ++d) inner *= static_cast<uint64_t>(t.shape[d]);
  if (rank == 0) {
    cut.row_bytes = cut.run_bytes = elem;
  } else {
    cut.row_bytes = static_cast<uint64_t>(t.shape[k]) * inner;
    cut.run_begin = static_cast<uint64_t>(lo[k] - t.box_offset[k]) * inner;
    cut.run_bytes = static_cast<uint64_t>(extent[k]) * inner;
  }
  for (size_t d = 0; d < k; ++d) {
    cut.outer_shape.push_back(t.shape[d]);
    cut.first.push_back(lo[d] - t.box_offset[d]);
    cut.extent.push_back(extent[d]);
    cut.dst_stride.push_back(box_stride[d] * elem);
  }
  if (k == 0) {
    cut.band_end = 1;
  } else {
    uint64_t rows_per_step = 1;  // rows per index of dimension 0
    for (size_t d = 1; d < k; ++d) rows_per_step *= static_cast<uint64_t>(t.shape[d]);
    cut.band_begin = static_cast<uint64_t>(cut.first[0]) * rows_per_step;
    cut.band_end = static_cast<uint64_t>(cut.first[0] + cut.extent[0]) * rows_per_step;
  }
  uint64_t dst_offset = 0;
  for (size_t d = 0; d < rank; ++d) {
    dst_offset += static_cast<uint64_t>(lo[d] - box_first[d]) * box_stride[d];
  }
  cut.dst_base = dst + dst_offset * elem;
  return cut;
}

Status CheckRegistry(const CheckpointReader& reader, const TensorRegistry& registry) {
  std::string problems;
  for (const TensorRef& ref : registry.tensors()) {
    const TensorInfo* info = reader.find(ref.name);
    std::string problem;
    if (info == nullptr) {
      problem = "tensor " + Quote(ref.name) + " is not in the checkpoint";
    } else if (info->dtype != ref.dtype) {
      problem = "tensor " + Quote(ref.name) + " is " + std::string(DTypeName(ref.dtype)) +
                " in the registry but " + std::string(DTypeName(info->dtype)) +
                " in the checkpoint";
    } else if (IsShard(ref) && info->shape != ref.global_shape) {
      problem = "tensor " + Quote(ref.name) + " is a shard of global shape " +
                DescribeShape(ref.global_shape) + " in the registry but has global shape " +
                DescribeShape(info->shape) + " in the checkpoint";
    } else if (!IsShard(ref) && info->shape != ref.shape) {
      problem = "tensor " + Quote(ref.name) + " has shape " + DescribeShape(ref.shape) +
                " in the registry but " + DescribeShape(info->shape) + " in the checkpoint";
    }
    if (!problem.empty()) problems += (problems.empty() ? "" : "; ") + problem;
  }
  if (problems.empty()) return Status::OK();
  return Status::InvalidArgument("cannot restore from " + reader.path() + ": " + problems);
}

}  // namespace asyncckpt::reader
