#pragma once

// The tail of every save, in one place: make a fully written temporary checkpoint directory
// durable, commit it under its final name, record it in the state file, apply retention; or,
// when anything before the commit fails, remove the temporary directory.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"
#include "src/state/checkpoint_state.h"

namespace asyncckpt {

/// A data file of the checkpoint being committed, still open from its writes.
struct DataFileToSeal {
  /// The open file (closed by CommitCheckpoint once synced).
  std::unique_ptr<io::File> file;
  /// Its size once the padding of the last O_DIRECT write is trimmed.
  uint64_t size = 0;
  /// Bytes written, padding included; the file is truncated to `size` when they differ.
  uint64_t written = 0;
};

/// What CommitCheckpoint needs. The temporary directory holds the data files, all written.
struct CommitRequest {
  /// The checkpoint directory (the parent of both names).
  std::string checkpoint_dir;
  /// The temporary directory's name in checkpoint_dir (TempDirName(final_name)).
  std::string tmp_name;
  /// The committed name ("<basename>-<step>").
  std::string final_name;
  /// The data files, trimmed and synced here.
  std::vector<DataFileToSeal> data_files;
  /// The manifest's file name inside the directory ("index") and its bytes, written last.
  std::string index_name;
  /// The encoded manifest.
  std::span<const uint8_t> index_bytes;
  /// The checkpoint's timestamp for the state file (seconds since the epoch).
  double wall_time = 0;
  /// Its score for best-N retention (RetentionScore of its metadata); nullopt: unscored.
  std::optional<double> score = std::nullopt;
};

/// How a commit ended.
struct CommitResult {
  /// OK when committed and recorded; else the first failure, naming the checkpoint.
  Status status;
  /// True once the directory is visible under final_name (also when only the state file
  /// update failed afterwards).
  bool committed = false;
};

/// Trims `data.file` to `data.size` when padding was written past it, then syncs it.
Status SealDataFile(DataFileToSeal& data);

/// Trims and syncs every data file, writes and syncs the index, then CommitDirectory (sync the
/// directory, rename it into place, sync the parent), then
/// manager.RecordCommittedLeavingRemovals (state file, and retention up to renaming what it
/// dropped to ".deleting-": the caller reports the save, then calls manager.RemoveRenamed). A
/// failure before the rename removes the temporary directory (a failure to remove it is logged; the
/// next start removes it), so nothing half-written stays visible and earlier checkpoints are
/// untouched. Never throws. Runs wholly on the calling thread.
CommitResult CommitCheckpoint(io::FileSystem& fs, CheckpointManager& manager,
                              CommitRequest request);

/// Removes the temporary directory `checkpoint_dir`/`tmp_name` of a failed save when it exists;
/// a failure is logged, never returned (the next start removes what is left). Never throws.
void RemoveFailedSave(io::FileSystem& fs, const std::string& checkpoint_dir,
                      const std::string& tmp_name);

}  // namespace asyncckpt
