#pragma once

// The checks of a sharded index's slices, which the index parser (format.cc) runs on every
// sharded index and part it parses. Everyone else includes src/format/format.h.

#include <string>

#include "asyncckpt/status.h"
#include "src/format/index.h"

namespace asyncckpt::format {

/// Checks every slice of a sharded index on its own (inside its global shape, written by a rank
/// < world_size into that rank's data files), then every name's slices together (one dtype and
/// global shape, at most one per writer rank, none overlapping, and with `tiling` together
/// covering the global shape). Corruption prefixed with `prefix`, naming the tensor and slice.
Status CheckSlices(const Index& index, bool tiling, const std::string& prefix);

}  // namespace asyncckpt::format
