// CheckpointManager outside its start-up pass: construction, RecordCommitted and retention
// (max_to_keep, keep_checkpoint_every_n_hours, pairing), pins, and the crash-safe deletion of
// what retention drops (see checkpoint_state.h). Start is in startup_pass.cc.

#include "src/state/checkpoint_state.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>

#include "src/state/pairing.h"
#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

using state_internal::LockPairing;
using state_internal::NewestCommonSteps;
using state_internal::StepsNamedBy;

CheckpointManager::CheckpointManager(io::FileSystem* fs, CheckpointManagerOptions options,
                                     Clock clock)
    : fs_(fs),
      dir_(std::move(options.checkpoint_dir)),
      basename_(std::move(options.basename)),
      max_to_keep_(options.max_to_keep),
      keep_every_n_hours_(options.keep_checkpoint_every_n_hours),
      keep_period_(options.keep_period),
      best_mode_(options.best_mode),
      state_file_name_(std::move(options.state_file_name)),
      validator_(std::move(options.validator)),
      partner_(std::move(options.partner)) {
  if (keep_every_n_hours_ > 0) next_preserve_time_ = clock() + keep_every_n_hours_ * 3600.0;
}

CheckpointManager::CheckpointManager(io::FileSystem* fs, std::string checkpoint_dir,
                                     std::string basename, int max_to_keep,
                                     double keep_checkpoint_every_n_hours, Clock clock,
                                     std::string state_file_name)
    : CheckpointManager(fs,
                        CheckpointManagerOptions{
                            .checkpoint_dir = std::move(checkpoint_dir),
                            .basename = std::move(basename),
                            .state_file_name = std::move(state_file_name),
                            .max_to_keep = max_to_keep,
                            .keep_checkpoint_every_n_hours = keep_checkpoint_every_n_hours,
                        },
                        std::move(clock)) {}

CheckpointManager::~CheckpointManager() { RemoveRenamed(); }

Status CheckpointManager::RecordCommitted(const std::string& name, double timestamp,
                                          std::optional<double> score, OwnDrop own) {
  const Status recorded = RecordCommittedLeavingRemovals(name, timestamp, score, own);
  RemoveRenamed();
  return recorded;
}

Status CheckpointManager::RecordCommittedLeavingRemovals(const std::string& name, double timestamp,
                                                         std::optional<double> score, OwnDrop own) {
  RETURN_IF_ERROR(ValidateCheckpointName(name).WithContext("recording a committed checkpoint"));
  if (!CheckpointStep(name, basename_)) {
    return Status::InvalidArgument("recording a committed checkpoint: '" + name +
                                   "' is not of the form " + basename_ + "-<step>");
  }
  std::lock_guard lock(mu_);
  std::erase_if(entries_, [&](const Entry& e) { return e.name == name; });
  // A name committed again is live again: an earlier drop of it must not delete the new copy.
  std::erase(unwritten_deletions_, name);
  deferred_deletions_.erase(name);
  entries_.push_back({name, timestamp, score});
  {
    // Reading the partner's list and writing ours is one step for the pair (see the class
    // comment); the deletions that follow touch only what our state file no longer names.
    std::unique_lock<std::mutex> pairing = LockPairing(!partner_.basename.empty());
    const std::set<int64_t> partner_steps = PartnerStepsLocked();
    const std::string kept = own == OwnDrop::kAtNextCommit ? name : std::string();
    for (std::string& dropped : ApplyRetentionLocked(partner_steps, kept)) {
      unwritten_deletions_.push_back(std::move(dropped));
    }
    RETURN_IF_ERROR(WriteCheckpointState(*fs_, dir_, StateLocked(), state_file_name_));
  }
  DeleteDroppedLocked(/*leave_removals=*/true);
  return Status::OK();
}

std::string CheckpointManager::Describe(const std::string& name) const {
  const std::optional<int64_t> step = CheckpointStep(name, basename_);
  const std::string path = JoinCheckpointPath(dir_, name);
  return step ? "step " + std::to_string(*step) + " (" + path + ")" : path;
}

bool CheckpointManager::RemoveRenamed(const std::function<bool(const std::string& path)>& keep) {
  std::vector<std::pair<std::string, std::string>> renamed;
  {
    std::lock_guard lock(mu_);
    renamed.swap(renamed_);
  }
  for (const auto& [name, path] : renamed) {
    if (keep && keep(path)) continue;
    std::string failure;
    try {
      const io::IoStatus removed = fs_->remove_tree(path);
      if (!removed.ok()) failure = removed.message();
    } catch (const std::exception& e) {
      failure = std::string("threw: ") + e.what();
    }
    if (!failure.empty()) {
      ++retention_failures_;
      LogWarning("retention could not remove " + path +
                 " (out of the committed namespace already; the next start retries): " + failure);
      continue;
    }
    LogInfo("retention removed " + Describe(name));
  }
  return !renamed.empty();
}

bool CheckpointManager::HasRenamed() const {
  std::lock_guard lock(mu_);
  return !renamed_.empty();
}

std::set<int64_t> CheckpointManager::PartnerStepsLocked() {
  if (partner_.basename.empty() || max_to_keep_ <= 0) return {};
  Result<CheckpointState> read = ReadCheckpointState(*fs_, dir_, partner_.state_file_name);
  if (read.ok()) {
    partner_steps_ = StepsNamedBy(*read, partner_.basename);
  } else if (read.status().code() == StatusCode::kNotFound) {
    partner_steps_.clear();  // the partner has committed nothing yet
  } else {
    LogWarning(
        "retention could not read the partner's state file; protecting the pairs it listed "
        "before: " +
        read.status().ToString());
  }
  return partner_steps_;
}

std::vector<std::string> CheckpointManager::ApplyRetentionLocked(
    const std::set<int64_t>& partner_steps, const std::string& kept_name) {
  std::vector<std::string> to_delete;
  if (max_to_keep_ <= 0 || entries_.size() <= static_cast<size_t>(max_to_keep_)) return to_delete;
  std::set<int64_t> ours;
  for (const Entry& entry : entries_) {
    if (auto step = CheckpointStep(entry.name, basename_)) ours.insert(*step);
  }
  const std::set<int64_t> paired = NewestCommonSteps(ours, partner_steps, max_to_keep_);
  const std::vector<bool> ranked = KeptByRankLocked();
  std::vector<Entry> kept;
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry& entry = entries_[i];
    const std::optional<int64_t> step = CheckpointStep(entry.name, basename_);
    const bool periodic = keep_period_ > 0 && step && *step % keep_period_ == 0;
    if (ranked[i] || periodic || (step && paired.contains(*step)) || entry.name == kept_name) {
      kept.push_back(std::move(entry));
    } else if (keep_every_n_hours_ > 0 && entry.timestamp >= next_preserve_time_) {
      last_preserved_timestamp_ = entry.timestamp;
      next_preserve_time_ += keep_every_n_hours_ * 3600.0;
    } else {
      to_delete.push_back(std::move(entry.name));
    }
  }
  entries_ = std::move(kept);
  return to_delete;
}

std::vector<bool> CheckpointManager::KeptByRankLocked() const {
  const size_t keep = static_cast<size_t>(max_to_keep_);
  std::vector<bool> kept(entries_.size(), false);
  if (best_mode_ == BestMode::kNone) {
    std::fill(kept.end() - static_cast<std::ptrdiff_t>(keep), kept.end(), true);
    return kept;
  }
  std::vector<size_t> scored;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].score) {
      scored.push_back(i);
    } else {
      kept[i] = true;  // Orbax's keep_checkpoints_without_metrics
    }
  }
  // Worst first. Stable, so that of equal scores the later listed ends nearer the best end, as
  // in Orbax's sorted() (whose reverse=True for "min" keeps equal items in order, too).
  const bool highest = best_mode_ == BestMode::kMax;
  std::stable_sort(scored.begin(), scored.end(), [&](size_t a, size_t b) {
    return highest ? *entries_[a].score < *entries_[b].score
                   : *entries_[a].score > *entries_[b].score;
  });
  for (size_t r = scored.size() > keep ? scored.size() - keep : 0; r < scored.size(); ++r) {
    kept[scored[r]] = true;
  }
  return kept;
}

void CheckpointManager::DeleteDroppedLocked(bool leave_removals) {
  for (const std::string& name : std::exchange(unwritten_deletions_, {})) {
    if (pins_.contains(name)) {
      deferred_deletions_.insert(name);
      continue;
    }
    DeleteCheckpointLocked(name, leave_removals);
  }
}

void CheckpointManager::DeleteCheckpointLocked(const std::string& name, bool leave_removals) {
  const std::string path = JoinCheckpointPath(dir_, name);
  io::EntryType type = io::EntryType::kNone;
  io::IoStatus typed = fs_->entry_type(path, &type);
  if (typed.ok() && type == io::EntryType::kNone) return;  // already gone
  if (typed.ok() && type != io::EntryType::kDirectory) {
    LogWarning("retention left " + path + " alone: it is " + DescribeEntryType(type) +
               ", not a checkpoint directory this library wrote");
    return;
  }
  io::EntryType index_type = io::EntryType::kNone;
  if (typed.ok()) typed = fs_->entry_type(JoinCheckpointPath(path, "index"), &index_type);
  if (typed.ok() && index_type != io::EntryType::kFile) {
    LogWarning("retention left " + path +
               " alone: it holds no index file, so this library did not write it as it is");
    return;
  }
  Status removed = ToStatus(typed);
  if (typed.ok() && leave_removals) {
    Result<std::string> renamed = RenameForDeletion(*fs_, dir_, name);
    if (renamed.ok()) {
      renamed_.emplace_back(name, std::move(renamed).value());
      return;
    }
    removed = renamed.status();
  } else if (typed.ok()) {
    removed = RemoveDirectoryDurably(*fs_, dir_, name);
  }
  if (!removed.ok()) {
    ++retention_failures_;
    LogWarning(
        "retention could not remove " + path +
        " (the save that dropped it is committed; the next start retries): " + removed.ToString());
    return;
  }
  LogInfo("retention removed " + Describe(name));
}

namespace {

// The rename and the log line of a quarantine after restore found `name` damaged.
Result<std::string> MoveDamaged(io::FileSystem& fs, const std::string& dir, const std::string& name,
                                const std::string& why) {
  const std::string path = JoinCheckpointPath(dir, name);
  Result<std::string> moved = QuarantineDirectory(fs, dir, name);
  if (!moved.ok()) {
    LogError("checkpoint " + path + " is damaged (" + why + ") and could not be quarantined: " +
             moved.status().ToString() + "; it is no longer listed, so no resume picks it");
    return moved.status();
  }
  LogError("checkpoint " + path + " is damaged (" + why + "); quarantined it as " +
           JoinCheckpointPath(dir, *moved) +
           ", kept for inspection and never removed automatically (see docs/durability.md)");
  return moved;
}

}  // namespace

Result<std::string> QuarantineListedCheckpoint(io::FileSystem& fs, const std::string& dir,
                                               const std::string& state_file_name,
                                               const std::string& name, const std::string& why) {
  RETURN_IF_ERROR(ValidateCheckpointName(name).WithContext("quarantining a checkpoint"));
  Result<CheckpointState> read = ReadCheckpointState(fs, dir, state_file_name);
  if (read.ok()) {
    CheckpointState state = std::move(read).value();
    auto& paths = state.all_model_checkpoint_paths;
    auto& timestamps = state.all_model_checkpoint_timestamps;
    const auto at = std::find(paths.begin(), paths.end(), name);
    if (at != paths.end()) {
      if (timestamps.size() == paths.size())
        timestamps.erase(timestamps.begin() + (at - paths.begin()));
      paths.erase(at);
      state.model_checkpoint_path = paths.empty() ? std::string() : paths.back();
      const Status written = WriteCheckpointState(fs, dir, state, state_file_name);
      if (!written.ok()) {
        LogWarning("could not drop " + name + " from " + JoinCheckpointPath(dir, state_file_name) +
                   " (the next start does): " + written.ToString());
      }
    }
  }
  return MoveDamaged(fs, dir, name, why);
}

Result<std::string> CheckpointManager::Quarantine(const std::string& name, const std::string& why) {
  RETURN_IF_ERROR(ValidateCheckpointName(name).WithContext("quarantining a checkpoint"));
  if (!CheckpointStep(name, basename_)) {
    return Status::InvalidArgument("quarantining a checkpoint: '" + name + "' is not of the form " +
                                   basename_ + "-<step>");
  }
  std::lock_guard lock(mu_);
  const size_t before = entries_.size();
  std::erase_if(entries_, [&](const Entry& e) { return e.name == name; });
  std::erase(unwritten_deletions_, name);
  deferred_deletions_.erase(name);
  if (entries_.size() != before) {
    std::unique_lock<std::mutex> pairing = LockPairing(!partner_.basename.empty());
    const Status written = WriteCheckpointState(*fs_, dir_, StateLocked(), state_file_name_);
    if (!written.ok()) {
      LogWarning("could not drop " + name + " from " + JoinCheckpointPath(dir_, state_file_name_) +
                 " (the next save or start does): " + written.ToString());
    }
  }
  return MoveDamaged(*fs_, dir_, name, why);
}

void CheckpointManager::Pin(const std::string& name) {
  std::lock_guard lock(mu_);
  ++pins_[name];
}

void CheckpointManager::Unpin(const std::string& name) {
  std::lock_guard lock(mu_);
  auto pin = pins_.find(name);
  if (pin == pins_.end()) {
    LogError("Unpin of checkpoint " + name + " in " + dir_ + " that is not pinned");
    return;
  }
  if (--pin->second > 0) return;
  pins_.erase(pin);
  if (deferred_deletions_.erase(name) == 0) return;
  DeleteCheckpointLocked(name);
}

CheckpointState CheckpointManager::StateLocked() const {
  CheckpointState state;
  for (const Entry& entry : foreign_) {
    state.all_model_checkpoint_paths.push_back(entry.name);
    state.all_model_checkpoint_timestamps.push_back(entry.timestamp);
  }
  for (const Entry& entry : entries_) {
    state.all_model_checkpoint_paths.push_back(entry.name);
    state.all_model_checkpoint_timestamps.push_back(entry.timestamp);
  }
  if (!entries_.empty()) {
    state.model_checkpoint_path = entries_.back().name;
  } else if (!foreign_.empty()) {
    state.model_checkpoint_path = foreign_.back().name;
  }
  state.last_preserved_timestamp = last_preserved_timestamp_;
  return state;
}

CheckpointState CheckpointManager::state() const {
  std::lock_guard lock(mu_);
  return StateLocked();
}

std::vector<std::string> CheckpointManager::retained() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const Entry& entry : entries_) names.push_back(entry.name);
  return names;
}

int64_t CheckpointManager::retention_failures() const { return retention_failures_.load(); }

}  // namespace asyncckpt
