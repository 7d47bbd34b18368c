// CommitDirectory, RemoveDirectoryDurably and QuarantineDirectory (see durable_directory.h for
// the contract).

#include "src/state/durable_directory.h"

#include <cerrno>
#include <vector>

#include "src/state/checkpoint_names.h"
#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {
namespace {

bool IsExchangeUnsupported(const io::IoStatus& status) {
  const int e = status.error_number();
  return e == ENOSYS || e == EINVAL || e == EOPNOTSUPP;
}

// The fallback of CommitDirectory where RENAME_EXCHANGE is unsupported; on success *old_path is
// where the previous copy now lives.
Status ReplaceByTwoRenames(io::FileSystem& fs, const std::string& parent,
                           const std::string& tmp_path, const std::string& final_path,
                           const std::string& final_name, std::string* old_path) {
  *old_path = JoinCheckpointPath(parent, DeletingDirName(final_name));
  RETURN_IF_ERROR(ToStatus(fs.rename(final_path, *old_path)));
  const io::IoStatus moved = fs.rename(tmp_path, final_path);
  if (!moved.ok()) {
    const io::IoStatus restored = fs.rename(*old_path, final_path);
    if (!restored.ok()) {
      LogError("could not put " + final_path + " back from " + *old_path + ": " +
               restored.message());
    }
    return ToStatus(moved);
  }
  return Status::OK();
}

}  // namespace

Result<std::string> RenameForDeletion(io::FileSystem& fs, const std::string& parent,
                                      const std::string& name) {
  RETURN_IF_ERROR(ValidateCheckpointName(name));
  const std::string path = JoinCheckpointPath(parent, name);
  std::string doomed = JoinCheckpointPath(parent, DeletingDirName(name));
  RETURN_IF_ERROR(ToStatus(fs.rename(path, doomed)));
  // Until the rename is durable a crash may bring `name` back, so its files must stay whole.
  RETURN_IF_ERROR(ToStatus(fs.sync_dir(parent.empty() ? "." : parent)));
  return doomed;
}

Status RemoveDirectoryDurably(io::FileSystem& fs, const std::string& parent,
                              const std::string& name) {
  ASSIGN_OR_RETURN(const std::string doomed, RenameForDeletion(fs, parent, name));
  return ToStatus(fs.remove_tree(doomed));
}

Result<std::string> QuarantineDirectory(io::FileSystem& fs, const std::string& parent,
                                        const std::string& name) {
  RETURN_IF_ERROR(ValidateCheckpointName(name));
  const std::string quarantined = QuarantineDirName(name);
  RETURN_IF_ERROR(ToStatus(
      fs.rename(JoinCheckpointPath(parent, name), JoinCheckpointPath(parent, quarantined))));
  RETURN_IF_ERROR(ToStatus(fs.sync_dir(parent.empty() ? "." : parent)));
  return quarantined;
}

Status CommitDirectory(io::FileSystem& fs, const std::string& parent, const std::string& tmp_name,
                       const std::string& final_name) {
  RETURN_IF_ERROR(ValidateCheckpointName(tmp_name));
  RETURN_IF_ERROR(ValidateCheckpointName(final_name));
  const std::string tmp_path = JoinCheckpointPath(parent, tmp_name);
  const std::string final_path = JoinCheckpointPath(parent, final_name);
  RETURN_IF_ERROR(ToStatus(fs.sync_dir(tmp_path)));
  io::EntryType type = io::EntryType::kNone;
  RETURN_IF_ERROR(ToStatus(fs.entry_type(final_path, &type, io::Symlinks::kFollow)));
  std::string old_path;  // where the previous copy lives once replaced
  if (type == io::EntryType::kNone) {
    RETURN_IF_ERROR(ToStatus(fs.rename(tmp_path, final_path)));
  } else {
    const io::IoStatus swapped = fs.exchange(tmp_path, final_path);
    if (swapped.ok()) {
      old_path = JoinCheckpointPath(parent, DeletingDirName(final_name));
      if (!fs.rename(tmp_path, old_path).ok()) old_path = tmp_path;  // as disposable there
    } else if (IsExchangeUnsupported(swapped)) {
      RETURN_IF_ERROR(ReplaceByTwoRenames(fs, parent, tmp_path, final_path, final_name, &old_path));
    } else {
      return ToStatus(swapped);
    }
  }
  RETURN_IF_ERROR(ToStatus(fs.sync_dir(parent.empty() ? "." : parent)));
  if (!old_path.empty()) {
    const io::IoStatus removed = fs.remove_tree(old_path);
    if (!removed.ok()) {
      LogWarning("committed " + final_path + " but could not remove its previous copy (the next " +
                 "start removes it): " + removed.message());
    }
  }
  return Status::OK();
}

uint64_t DirectoryBytes(io::FileSystem& fs, const std::string& path) {
  std::vector<std::string> names;
  if (!fs.list_dir(path, &names).ok()) return 0;
  uint64_t total = 0;
  for (const std::string& name : names) {
    uint64_t size = 0;
    io::EntryType type = io::EntryType::kNone;
    const std::string file = JoinCheckpointPath(path, name);
    if (fs.entry_type(file, &type).ok() && type == io::EntryType::kFile &&
        fs.file_size(file, &size).ok()) {
      total += size;
    }
  }
  return total;
}

}  // namespace asyncckpt
