#pragma once

// What `asyncckpt train-sim` will hold in memory, part by part, checked against what the machine
// can give before anything is allocated: a state that cannot fit is a clear error naming the
// flag and the value the user gave, not an uncaught std::bad_alloc halfway through start-up.

#include <cstdint>
#include <string>
#include <vector>

#include "asyncckpt/status.h"

namespace asyncckpt::cli {

/// One part of what train-sim holds in memory.
struct MemoryPart {
  /// What it is, e.g. "state" or "pinned staging".
  std::string what;
  /// The flags that size it, as the user gave them, e.g. "--model_bytes 1TiB".
  std::string flags;
  /// Its size in bytes.
  uint64_t bytes = 0;
};

/// Memory this process may still take, and where that figure comes from.
struct AvailableMemory {
  /// Bytes.
  uint64_t bytes = 0;
  /// Where the figure comes from, for messages: "MemAvailable in /proc/meminfo", "--max_memory".
  std::string source;
};

/// The memory the machine can give now: MemAvailable from /proc/meminfo (sysinfo's free and
/// buffer RAM where that cannot be read), lowered to what is left under the cgroup v2 limit
/// (memory.max less memory.current) when one is set. An address-space limit (ulimit -v) is not
/// taken into account.
AvailableMemory MachineAvailableMemory();

/// The sum of the parts' bytes, saturating at UINT64_MAX.
uint64_t TotalBytes(const std::vector<MemoryPart>& parts);

/// OK when the parts fit in `available`. Otherwise InvalidArgument naming the flags of the
/// largest part as given, what every part needs (with its flags where they differ from the
/// largest part's), the total and what is available (with its source), followed by `hint` (a
/// way to make it fit, or empty).
Status CheckMemoryFits(const std::vector<MemoryPart>& parts, const AvailableMemory& available,
                       const std::string& hint);

}  // namespace asyncckpt::cli
