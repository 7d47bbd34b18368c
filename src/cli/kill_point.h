#pragma once

// train-sim --kill_at (testing): a file system that SIGKILLs its own process just before one
// chosen operation, so that a test can stop a job at an exact step of a commit, a state-file
// update or a removal (on one rank of a job) instead of at a moment picked by a timer.

#include <memory>
#include <string>

#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"

namespace asyncckpt::cli {

/// Where --kill_at stops a process: "<rank>:<operation>:<name prefix>".
struct KillPoint {
  /// The rank that dies (0 for a process of its own).
  int rank = 0;
  /// "rename" (rename and exchange: the name the entry gets), "remove" (remove_file,
  /// remove_tree) or "create" (open for writing, create_dir).
  std::string operation;
  /// The operation is hit when the last component of its path starts with this.
  std::string name_prefix;
};

/// Parses --kill_at's value; InvalidArgument quoting it when it is not of that form.
Result<KillPoint> ParseKillPoint(const std::string& text);

/// Whether `point` hits `operation` on `path` (the last component compared).
bool KillPointHits(const KillPoint& point, const std::string& operation, const std::string& path);

/// Forwards every operation to `target` (borrowed) and, at the first one `point` hits, writes
/// "train-sim: --kill_at <point>: killed before <operation> <path>" on stderr and raises
/// SIGKILL, so that nothing after it happens, as in a crash.
std::unique_ptr<io::FileSystem> NewKillPointFileSystem(io::FileSystem* target, KillPoint point);

}  // namespace asyncckpt::cli
