#pragma once

// Restore into device memory at the disk's speed: each device tensor is cut into pieces of whole
// rows (dimension 0), each piece is read and verified into one of a few pinned bounce buffers,
// and its host-to-device copy runs while the next piece is read into the other buffer.

#include <cstdint>
#include <functional>
#include <vector>

#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"

namespace asyncckpt::reader {

/// Bytes of one bounce buffer: a piece holds at most this many bytes, or one row when a row is
/// larger.
inline constexpr uint64_t kDevicePieceBytes = 128ull << 20;
/// Bounce buffers per device: one being read into while the other is copied to the device.
inline constexpr int kDeviceBounceBuffers = 2;

/// One piece of a device tensor: a box of whole rows, and where its bytes go on the device.
struct DevicePiece {
  /// The tensor (borrowed from the registry).
  const TensorRef* ref = nullptr;
  /// The box's first index (global, for a shard) and shape.
  std::vector<int64_t> first;
  /// See first.
  std::vector<int64_t> shape;
  /// Offset of the piece in the tensor's device buffer.
  uint64_t offset = 0;
  /// Its bytes.
  uint64_t bytes = 0;
};

/// The pieces of every non-empty tensor of `registry` that lives on a device (not the host), in
/// registry order, each of at most `piece_bytes` unless one row is larger.
std::vector<DevicePiece> PlanDevicePieces(const TensorRegistry& registry, uint64_t piece_bytes);

/// Reads (and verifies) a piece into a host buffer of piece.bytes.
using ReadPieceFn = std::function<Status(const DevicePiece& piece, uint8_t* host)>;

/// Restores `pieces` through kDeviceBounceBuffers pinned buffers per device: read one, start its
/// copy to the device, read the next meanwhile; a buffer is reused only once its copy is done.
/// Returns the first failure, after every copy started has finished.
Status RestoreDevicePieces(const std::vector<DevicePiece>& pieces, const ReadPieceFn& read);

}  // namespace asyncckpt::reader
