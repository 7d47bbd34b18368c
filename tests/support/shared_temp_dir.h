#pragma once

// A temporary directory every rank of a multi-process test shares: rank 0 makes it, the others
// learn its path by broadcast (the ranks of these tests run on one machine).

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "asyncckpt/coordinator.h"
#include "asyncckpt/status.h"
#include "src/util/status_macros.h"

namespace asyncckpt::testing_support {

/// A fresh directory under the system's temporary directory named `<prefix>-XXXXXX`, made by
/// rank 0; every rank gets its path.
inline Result<std::string> SharedTempDir(Coordinator& coordinator, const std::string& prefix) {
  std::vector<uint8_t> path;
  if (coordinator.rank() == 0) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      return Status::Internal("mkdtemp " + pattern + " failed");
    }
    path.assign(pattern.begin(), pattern.end());
  }
  RETURN_IF_ERROR(coordinator.broadcast(path, 0));
  return std::string(path.begin(), path.end());
}

}  // namespace asyncckpt::testing_support
