#pragma once

// ExistsAndIsDir: the two questions the io tests ask of a path, answered through
// FileSystem::entry_type with a final symlink followed.

#include <string>

#include "asyncckpt/file_system.h"

namespace asyncckpt::io {

/// Whether `path` exists and whether it is a directory, a final symlink followed.
inline IoStatus ExistsAndIsDir(FileSystem& fs, const std::string& path, bool* exists,
                               bool* is_dir) {
  EntryType type = EntryType::kNone;
  IoStatus status = fs.entry_type(path, &type, Symlinks::kFollow);
  *exists = type != EntryType::kNone;
  *is_dir = type == EntryType::kDirectory;
  return status;
}

}  // namespace asyncckpt::io
