#include "src/engine/spare_files.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "src/format/format.h"
#include "src/state/checkpoint_names.h"
#include "src/util/log.h"

namespace asyncckpt {

SpareFiles::SpareFiles(io::FileSystem* fs, std::string checkpoint_dir)
    : fs_(fs), dir_(std::move(checkpoint_dir)) {}

SpareFiles::~SpareFiles() {
  if (spare_) Remove(*spare_);
}

void SpareFiles::NoteSave(const std::string& final_name, std::vector<uint64_t> sizes) {
  std::vector<std::string> names;
  const auto count = static_cast<uint32_t>(sizes.size());
  for (uint32_t i = 0; i < count; ++i) names.push_back(format::DataFileName(i, count));
  std::lock_guard lock(mu_);
  noted_name_ = final_name;
  names_ = std::move(names);
  sizes_ = std::move(sizes);
}

bool SpareFiles::Adopt(const std::string& tree) {
  std::vector<std::string> names;
  {
    std::lock_guard lock(mu_);
    if (names_.empty() || spare_ || making_) return false;
    names = names_;
    making_ = true;
  }
  bool adopted = HoldsAll(tree, names);
  if (adopted) {
    // The index and metadata go: what stays is data no reader would take for a checkpoint.
    std::vector<std::string> entries;
    adopted = fs_->list_dir(tree, &entries).ok();
    for (const std::string& entry : entries) {
      if (!adopted) break;
      if (std::find(names.begin(), names.end(), entry) != names.end()) continue;
      adopted = fs_->remove_tree(JoinCheckpointPath(tree, entry)).ok();
    }
  }
  std::lock_guard lock(mu_);
  making_ = false;
  if (adopted) {
    spare_ = tree;
    LogInfo("kept the data files of " + tree +
            " for the next save to write over (an in-memory file system)");
  }
  return adopted;
}

bool SpareFiles::Wanted() const {
  std::lock_guard lock(mu_);
  return !names_.empty() && !spare_ && !making_ && !replenish_failed_;
}

void SpareFiles::Replenish() {
  std::vector<std::string> names;
  std::vector<uint64_t> sizes;
  std::string tree;
  {
    std::lock_guard lock(mu_);
    if (names_.empty() || spare_ || making_ || replenish_failed_) return;
    names = names_;
    sizes = sizes_;
    tree = JoinCheckpointPath(dir_, DeletingDirName(noted_name_));
    making_ = true;
  }
  io::IoStatus status = fs_->create_dir(tree);
  for (size_t i = 0; i < names.size() && status.ok(); ++i) {
    std::unique_ptr<io::File> file;
    status = fs_->open(JoinCheckpointPath(tree, names[i]), {.write = true, .create = true}, &file);
    if (status.ok() && sizes[i] > 0) status = file->allocate(0, sizes[i]);
  }
  std::lock_guard lock(mu_);
  making_ = false;
  if (status.ok()) {
    spare_ = tree;
    return;
  }
  replenish_failed_ = true;
  LogWarning("no spare data files for the next saves (" + status.message() +
             "): they write new files, which is slower on an in-memory file system");
  Remove(tree);
}

void SpareFiles::RemoveOrKeep(CheckpointManager& manager) {
  manager.RemoveRenamed([this](const std::string& tree) { return Adopt(tree); });
  Replenish();
}

bool SpareFiles::TakeInto(const std::string& dir, uint32_t count) {
  std::string tree;
  std::vector<std::string> names;
  {
    std::lock_guard lock(mu_);
    if (!spare_ || names_.size() != count) return false;
    tree = std::move(*spare_);
    spare_.reset();
    names = names_;
  }
  bool moved = true;
  for (const std::string& name : names) {
    moved = fs_->rename(JoinCheckpointPath(tree, name), JoinCheckpointPath(dir, name)).ok();
    if (!moved) break;
  }
  Remove(tree);
  return moved;
}

bool SpareFiles::HoldsAll(const std::string& tree, const std::vector<std::string>& names) const {
  return std::all_of(names.begin(), names.end(), [&](const std::string& name) {
    io::EntryType type = io::EntryType::kNone;
    return fs_->entry_type(JoinCheckpointPath(tree, name), &type).ok() &&
           type == io::EntryType::kFile;
  });
}

void SpareFiles::Remove(const std::string& tree) const {
  const io::IoStatus removed = fs_->remove_tree(tree);
  if (!removed.ok()) {
    LogWarning("could not remove the spare data files " + tree +
               " (the next start removes them): " + removed.message());
  }
}

}  // namespace asyncckpt
