#include "src/engine/spare_files.h"

#include <utility>
#include <vector>

#include "src/format/format.h"
#include "src/state/checkpoint_names.h"
#include "src/util/log.h"

namespace asyncckpt {

SpareFiles::SpareFiles(io::FileSystem* fs) : fs_(fs) {}

SpareFiles::~SpareFiles() {
  if (spare_) Remove(*spare_);
}

void SpareFiles::NoteSave(uint32_t count) {
  std::lock_guard lock(mu_);
  count_ = count;
}

bool SpareFiles::Adopt(const std::string& tree) {
  uint32_t count = 0;
  {
    std::lock_guard lock(mu_);
    if (count_ == 0 || spare_ || adopting_) return false;
    count = count_;
    adopting_ = true;
  }
  bool adopted = HoldsAll(tree, count);
  if (adopted) {
    // The index and metadata go: what stays is data no reader would take for a checkpoint.
    std::vector<std::string> entries;
    adopted = fs_->list_dir(tree, &entries).ok();
    for (const std::string& entry : entries) {
      if (!adopted) break;
      bool data_file = false;
      for (uint32_t i = 0; i < count && !data_file; ++i) {
        data_file = entry == format::DataFileName(i, count);
      }
      if (!data_file) adopted = fs_->remove_tree(JoinCheckpointPath(tree, entry)).ok();
    }
  }
  std::lock_guard lock(mu_);
  adopting_ = false;
  if (adopted) {
    spare_ = tree;
    LogInfo("kept the data files of " + tree +
            " for the next save to write over (an in-memory file system)");
  }
  return adopted;
}

void SpareFiles::RemoveOrKeep(CheckpointManager& manager) {
  manager.RemoveRenamed([this](const std::string& tree) { return Adopt(tree); });
}

bool SpareFiles::TakeInto(const std::string& dir, uint32_t count) {
  std::string tree;
  {
    std::lock_guard lock(mu_);
    if (!spare_ || count_ != count) return false;
    tree = std::move(*spare_);
    spare_.reset();
  }
  bool moved = true;
  for (uint32_t i = 0; i < count && moved; ++i) {
    const std::string name = format::DataFileName(i, count);
    moved = fs_->rename(JoinCheckpointPath(tree, name), JoinCheckpointPath(dir, name)).ok();
  }
  Remove(tree);
  return moved;
}

std::optional<std::string> SpareFiles::held() const {
  std::lock_guard lock(mu_);
  return spare_;
}

bool SpareFiles::HoldsAll(const std::string& tree, uint32_t count) const {
  for (uint32_t i = 0; i < count; ++i) {
    io::EntryType type = io::EntryType::kNone;
    const std::string path = JoinCheckpointPath(tree, format::DataFileName(i, count));
    if (!fs_->entry_type(path, &type).ok() || type != io::EntryType::kFile) return false;
  }
  return true;
}

void SpareFiles::Remove(const std::string& tree) const {
  const io::IoStatus removed = fs_->remove_tree(tree);
  if (!removed.ok()) {
    LogWarning("could not remove the spare data files " + tree +
               " (the next start removes them): " + removed.message());
  }
}

}  // namespace asyncckpt
