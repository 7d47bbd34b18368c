// Restore into device memory through pinned bounce buffers (see device_restore.h).

#include "src/reader/device_restore.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>

#include "asyncckpt/device.h"
#include "src/util/status_macros.h"

namespace asyncckpt::reader {

namespace {

// Row bytes of `ref` (its element's bytes for a vector; the whole tensor for a scalar).
uint64_t RowBytes(const TensorRef& ref) {
  if (ref.shape.empty() || ref.shape[0] <= 0) return ref.bytes;
  return ref.bytes / static_cast<uint64_t>(ref.shape[0]);
}

// A device's bounce buffers and the copy in flight from each.
struct Bounce {
  std::vector<PinnedBuffer> buffers;
  std::vector<std::unique_ptr<CopyFence>> fences;
  size_t next = 0;
};

// Waits for the copy out of `slot`, if any; its failure.
Status Drain(Bounce& bounce, size_t slot) {
  if (!bounce.fences[slot]) return Status::OK();
  Status status = bounce.fences[slot]->wait();
  bounce.fences[slot].reset();
  return status;
}

}  // namespace

std::vector<DevicePiece> PlanDevicePieces(const TensorRegistry& registry, uint64_t piece_bytes) {
  std::vector<DevicePiece> pieces;
  for (const TensorRef& ref : registry.tensors()) {
    if (ref.device == nullptr || ref.device->kind() == DeviceKind::kHost || ref.bytes == 0) {
      continue;
    }
    std::vector<int64_t> first =
        IsShard(ref) ? ref.global_offset : std::vector<int64_t>(ref.shape.size(), 0);
    if (ref.shape.empty()) {
      pieces.push_back({&ref, first, ref.shape, 0, ref.bytes});
      continue;
    }
    const uint64_t row = RowBytes(ref);
    const int64_t rows_per_piece = static_cast<int64_t>(std::max<uint64_t>(1, piece_bytes / row));
    for (int64_t r = 0; r < ref.shape[0]; r += rows_per_piece) {
      DevicePiece piece{&ref, first, ref.shape, static_cast<uint64_t>(r) * row, 0};
      piece.first[0] += r;
      piece.shape[0] = std::min(rows_per_piece, ref.shape[0] - r);
      piece.bytes = static_cast<uint64_t>(piece.shape[0]) * row;
      pieces.push_back(std::move(piece));
    }
  }
  return pieces;
}

Status RestoreDevicePieces(const std::vector<DevicePiece>& pieces, const ReadPieceFn& read) {
  uint64_t largest = 0;
  for (const DevicePiece& piece : pieces) largest = std::max(largest, piece.bytes);
  std::map<Device*, Bounce> bounces;
  Status status;
  for (const DevicePiece& piece : pieces) {
    Device& device = *piece.ref->device;
    Bounce& bounce = bounces[&device];
    if (bounce.buffers.empty()) {
      for (int i = 0; i < kDeviceBounceBuffers && status.ok(); ++i) {
        Result<PinnedBuffer> buffer = device.allocate_pinned(largest);
        if (!buffer.ok()) status = buffer.status().WithContext("restore's bounce buffers");
        if (buffer.ok()) bounce.buffers.push_back(std::move(buffer).value());
      }
      bounce.fences.resize(bounce.buffers.size());
    }
    if (!status.ok()) break;
    const size_t slot = bounce.next++ % bounce.buffers.size();
    status = Drain(bounce, slot);
    if (!status.ok()) break;
    auto* host = static_cast<uint8_t*>(bounce.buffers[slot].data());
    status = read(piece, host);
    if (!status.ok()) break;
    auto* dst = static_cast<uint8_t*>(piece.ref->data) + piece.offset;
    auto fence = device.copy_from_host_async(host, dst, piece.bytes);
    if (!fence.ok()) {
      status = fence.status().WithContext("restoring tensor '" + piece.ref->name + "' to " +
                                          device.name());
      break;
    }
    bounce.fences[slot] = std::move(fence).value();
  }
  // Every copy lands (or fails) before its buffer is freed.
  for (auto& [device, bounce] : bounces) {
    for (size_t slot = 0; slot < bounce.fences.size(); ++slot) {
      Status drained = Drain(bounce, slot);
      if (status.ok() && !drained.ok()) {
        status = drained.WithContext("restoring to " + device->name());
      }
    }
  }
  return status;
}

}  // namespace asyncckpt::reader
