#pragma once

// Inside the format unit: what the index parser (format.cc) and the checks of a sharded index
// (sharded_index.cc) share. Everyone else includes src/format/format.h, which declares
// ParseIndexPart and MergeShardedParts.

#include <string>
#include <string_view>

#include "asyncckpt/status.h"
#include "src/format/format.h"

namespace asyncckpt::format {

/// 'name' for a message, cut short so that a hostile 64 KiB name cannot flood a log.
std::string QuoteName(std::string_view name);

/// Checks every slice of a sharded index on its own (inside its global shape, written by a rank
/// < world_size into that rank's data files), then every name's slices together (one dtype and
/// global shape, at most one per writer rank, none overlapping, and with `tiling` together
/// covering the global shape). Corruption prefixed with `prefix`, naming the tensor and slice.
Status CheckSlices(const Index& index, bool tiling, const std::string& prefix);

}  // namespace asyncckpt::format
