#pragma once

// Reading the index of a checkpoint directory through io::FileSystem: the one loader the reader
// and the savers' start-up validator share, and the check of a whole checkpoint's index against
// the sizes of its data files.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"
#include "src/format/format.h"

namespace asyncckpt::format {

/// `checkpoint_path` + "/index".
std::string IndexPath(const std::string& checkpoint_path);

/// Reads and parses the index of the checkpoint directory `checkpoint_path` (ParseIndex). The
/// index must be a regular file, never a symlink (not followed) nor a FIFO (never opened), of at
/// most kMaxIndexBytes, sized through its open handle. NotFound when there is none; Corruption
/// naming the file and what is wrong; FailedPrecondition for an intact index (its checksum right)
/// of another format version or with unknown header flags, a newer release's checkpoint
/// (ParseIndex); IOError when it
/// cannot be read; ResourceExhausted when it cannot be held in memory.
Result<Index> LoadIndex(io::FileSystem& fs, const std::string& checkpoint_path);

/// LoadIndex, then every chunk checked against the sizes of the data files (CheckChunkLocations),
/// which are sized, never opened: a data file that is missing or not a regular file is
/// Corruption naming it. The errors of LoadIndex otherwise.
Result<Index> LoadIndexCheckingDataFiles(io::FileSystem& fs, const std::string& checkpoint_path);

/// Checks that every chunk lies inside its data file, whose sizes are `data_file_sizes`
/// (one per data file; a file may be longer than its last chunk), and that no two chunks share a
/// stored byte (the writer never does; shared bytes would let a small file claim many times its
/// size). Corruption naming `path`, the data file, the tensor and the chunk (both chunks for an
/// overlap).
Status CheckChunkLocations(const Index& index, std::string_view path,
                           std::span<const uint64_t> data_file_sizes);

}  // namespace asyncckpt::format
