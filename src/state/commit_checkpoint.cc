#include "src/state/commit_checkpoint.h"

#include <exception>

#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

Status SealDataFile(DataFileToSeal& data) {
  if (data.written != data.size) RETURN_IF_ERROR(ToStatus(data.file->truncate(data.size)));
  return ToStatus(data.file->sync());
}

namespace {

Status WriteIndex(io::FileSystem& fs, const std::string& dir, const CommitRequest& request) {
  io::OpenOptions options{.write = true, .create = true, .truncate = true};
  std::unique_ptr<io::File> file;
  RETURN_IF_ERROR(ToStatus(fs.open(dir + "/" + request.index_name, options, &file)));
  RETURN_IF_ERROR(
      ToStatus(file->write_at(0, request.index_bytes.data(), request.index_bytes.size())));
  return ToStatus(file->sync());
}

// Everything before the rename: a failure here leaves nothing visible.
Status MakeDurable(io::FileSystem& fs, CommitRequest& request) {
  const std::string dir = JoinCheckpointPath(request.checkpoint_dir, request.tmp_name);
  for (DataFileToSeal& data : request.data_files) RETURN_IF_ERROR(SealDataFile(data));
  request.data_files.clear();  // closed before the directory moves
  return WriteIndex(fs, dir, request);
}

CommitResult Commit(io::FileSystem& fs, CheckpointManager& manager, CommitRequest& request) {
  CommitResult result;
  result.status = MakeDurable(fs, request);
  if (result.status.ok()) {
    result.status =
        CommitDirectory(fs, request.checkpoint_dir, request.tmp_name, request.final_name);
  }
  if (!result.status.ok()) return result;
  result.committed = true;
  result.status =
      manager.RecordCommittedLeavingRemovals(request.final_name, request.wall_time, request.score);
  return result;
}

}  // namespace

CommitResult CommitCheckpoint(io::FileSystem& fs, CheckpointManager& manager,
                              CommitRequest request) {
  CommitResult result;
  try {
    result = Commit(fs, manager, request);
  } catch (const std::exception& e) {
    result.status = Status::Internal(std::string("commit threw: ") + e.what());
  } catch (...) {
    result.status = Status::Internal("commit threw a non-standard exception");
  }
  if (!result.committed) {
    request.data_files.clear();
    RemoveFailedSave(fs, request.checkpoint_dir, request.tmp_name);
  }
  result.status = result.status.WithContext(request.final_name);
  return result;
}

void RemoveFailedSave(io::FileSystem& fs, const std::string& checkpoint_dir,
                      const std::string& tmp_name) {
  const std::string tmp_path = JoinCheckpointPath(checkpoint_dir, tmp_name);
  try {
    io::EntryType type = io::EntryType::kNone;
    if (!fs.entry_type(tmp_path, &type, io::Symlinks::kFollow).ok() ||
        type == io::EntryType::kNone) {
      return;
    }
    const io::IoStatus removed = fs.remove_tree(tmp_path);
    if (!removed.ok()) {
      LogWarning("could not remove " + tmp_path + " of a failed save: " + removed.message());
    }
  } catch (const std::exception& e) {
    LogWarning("removing " + tmp_path + " of a failed save threw: " + e.what());
  } catch (...) {
    LogWarning("removing " + tmp_path + " of a failed save threw");
  }
}

}  // namespace asyncckpt
