// The start-up pass: StartupPass, and CheckpointManager::Start, which runs it and then rewrites
// the state file and removes what the old one named but is incomplete (see startup_pass.h).

#include "src/state/startup_pass.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>

#include "src/state/pairing.h"
#include "src/state/sharded_commit.h"
#include "src/state/state_claims.h"
#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {
namespace state_internal {

Status StartupPass::Run() {
  std::vector<std::string> names;
  RETURN_IF_ERROR(ToStatus(fs_.list_dir(options_.checkpoint_dir, &names))
                      .WithContext("listing checkpoint_dir at start-up"));
  std::sort(names.begin(), names.end());
  // Refusals first, so that a refused start leaves the directory as it found it.
  RETURN_IF_ERROR(CheckBasenameUnclaimed(fs_, options_.checkpoint_dir, options_.basename,
                                         options_.state_file_name));
  RETURN_IF_ERROR(RefuseNewer(names));
  RemoveLeftovers(names);
  for (const std::string& name : names) {
    if (IsQuarantinedCheckpoint(name, options_.basename)) report_.quarantined.push_back(name);
  }
  RETURN_IF_ERROR(LoadStateFile());
  CollectUnlisted(names);
  RelistOrRemoveUnlisted();
  return Status::OK();
}

void StartupPass::Quarantine(const std::string& name, const std::string& why) {
  const Result<std::string> moved = QuarantineDirectory(fs_, options_.checkpoint_dir, name);
  if (!moved.ok()) {
    const std::string what = Path(name) + " is damaged (" + why +
                             ") and start-up could not quarantine it: " + moved.status().ToString();
    LogError(what);
    report_.failures.push_back(what);
    return;
  }
  LogError("checkpoint " + Path(name) + " is damaged (" + why + "); quarantined it as " +
           Path(*moved) +
           ", kept for inspection and never removed automatically (see docs/durability.md)");
  report_.quarantined.push_back(*moved);
}

void StartupPass::QuarantineListed() {
  for (const auto& [name, why] : listed_damaged_) Quarantine(name, why);
  listed_damaged_.clear();
  std::sort(report_.quarantined.begin(), report_.quarantined.end());
}

void StartupPass::Fail(const std::string& what) {
  LogWarning(what);
  report_.failures.push_back(what);
}

Result<ValidCheckpoint> StartupPass::Validate(const std::string& name, int64_t step) {
  const auto known = validated_.find(name);
  if (known != validated_.end()) return known->second;
  Result<ValidCheckpoint> valid =
      validator_ ? ValidateNamed(validator_, Path(name), step) : IndexFileExists(fs_, Path(name));
  validated_.emplace(name, valid);
  return valid;
}

Status StartupPass::RefuseNewer(const std::vector<std::string>& names) {
  std::string newer;
  for (const std::string& name : names) {
    const std::optional<int64_t> step = CheckpointStep(name, options_.basename);
    io::EntryType type = io::EntryType::kNone;
    if (!step || !fs_.entry_type(Path(name), &type).ok() || type != io::EntryType::kDirectory) {
      continue;
    }
    const Result<ValidCheckpoint> valid = Validate(name, *step);
    if (Classify(valid.status()) != Verdict::kNewer) continue;
    newer += (newer.empty() ? "" : "; ") + Path(name) + " (" + valid.status().message() + ")";
  }
  if (newer.empty()) return Status::OK();
  return Status::FailedPrecondition(
      "start-up of the " + options_.basename + " checkpoints in " + options_.checkpoint_dir +
      " refuses to run: a newer release of asyncckpt wrote " + newer +
      ". Nothing was changed: resuming an older step in its place would lose it. Run a release "
      "that reads it, or move it out of the directory");
}

bool StartupPass::IsLeftover(const std::string& name, bool* is_directory_kind) const {
  if (IsMarkedOf(name, options_.state_file_name, kTmpInfix) ||
      IsShardEndedFileName(name, options_.basename)) {
    *is_directory_kind = false;
    return true;
  }
  *is_directory_kind = true;
  for (std::string_view infix : {kTmpInfix, kDeletingInfix}) {
    const size_t at = name.rfind(infix);
    if (at == std::string::npos) continue;
    const std::string_view checkpoint = std::string_view(name).substr(0, at);
    const std::string prefix = options_.basename + "-";
    if (checkpoint.size() > prefix.size() && checkpoint.substr(0, prefix.size()) == prefix &&
        AllOf(checkpoint.substr(prefix.size()), IsDecimalDigit) &&
        IsMarkedOf(name, checkpoint, infix)) {
      return true;
    }
  }
  return false;
}

void StartupPass::RemoveLeftovers(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    bool directory_kind = false;
    if (!IsLeftover(name, &directory_kind)) continue;
    io::EntryType type = io::EntryType::kNone;
    io::IoStatus status = fs_.entry_type(Path(name), &type);
    if (status.ok() && type == io::EntryType::kNone) continue;
    const io::EntryType expected =
        directory_kind ? io::EntryType::kDirectory : io::EntryType::kFile;
    if (status.ok() && type != expected) {
      LogWarning("start-up left " + Path(name) + " alone: it is " + DescribeEntryType(type) +
                 ", which this library never writes under that name");
      continue;
    }
    if (status.ok())
      status = directory_kind ? fs_.remove_tree(Path(name)) : fs_.remove_file(Path(name));
    if (!status.ok()) {
      Fail("start-up could not remove " + Path(name) + ": " + status.message());
      continue;
    }
    LogInfo("removed " + Path(name) +
            (IsShardEndedFileName(name, options_.basename)
                 ? ", an earlier multi-process job's end marker"
                 : ", left by an interrupted save or deletion"));
    report_.removed.push_back(name);
  }
}

void StartupPass::Drop(const std::string& name, const std::string& why) {
  LogWarning("state file " + Path(options_.state_file_name) + " named " + name + ", which " + why +
             "; dropped it from the list");
  report_.dropped.push_back(name);
}

Status StartupPass::LoadStateFile() {
  Result<CheckpointState> read =
      ReadCheckpointState(fs_, options_.checkpoint_dir, options_.state_file_name);
  const std::string state_path = Path(options_.state_file_name);
  if (read.status().code() == StatusCode::kNotFound) {
    state_problem_ = "there is no state file " + state_path;
    return Status::OK();
  }
  state_file_present_ = true;
  if (read.status().code() == StatusCode::kCorruption) {
    state_problem_ = read.status().message();
    return Status::OK();
  }
  RETURN_IF_ERROR(read.status().WithContext("reading the state file at start-up"));
  state_parsed_ = true;
  last_preserved_ = read->last_preserved_timestamp;
  const CheckpointState& state = *read;
  for (size_t i = 0; i < state.all_model_checkpoint_paths.size(); ++i) {
    LoadListed(state.all_model_checkpoint_paths[i], state.all_model_checkpoint_timestamps[i]);
  }
  if (state.all_model_checkpoint_paths.empty()) {
    state_problem_ = "state file " + state_path + " names no checkpoint";
  } else if (list_.empty()) {
    state_problem_ = "state file " + state_path + " names no complete checkpoint";
  }
  return Status::OK();
}

void StartupPass::LoadListed(const std::string& name, double timestamp) {
  listed_names_.insert(name);
  const std::optional<int64_t> step = CheckpointStep(name, options_.basename);
  if (!step) {
    const size_t dash = name.rfind('-');
    if (dash != std::string::npos && dash > 0 &&
        CheckpointStep(name, std::string_view(name).substr(0, dash))) {
      // Another saver's checkpoint in a state file it shares with this one: kept as it is.
      foreign_.push_back({name, 0, timestamp, std::nullopt});
      return;
    }
    return Drop(name, "is not a checkpoint of this saver (" + options_.basename +
                          "-<step>); it is left untouched");
  }
  io::EntryType type = io::EntryType::kNone;
  const io::IoStatus typed = fs_.entry_type(Path(name), &type);
  if (!typed.ok()) {
    // Cannot tell: keep it listed, as it was.
    Fail("start-up could not inspect " + Path(name) + ": " + typed.message());
    list_.push_back({name, *step, timestamp, std::nullopt});
    return;
  }
  if (type == io::EntryType::kNone) return Drop(name, "does not exist");
  if (type != io::EntryType::kDirectory) {
    return Drop(name, "is " + DescribeEntryType(type) +
                          ", not a checkpoint directory; it is left untouched");
  }
  const Result<ValidCheckpoint> valid = Validate(name, *step);
  switch (Classify(valid.status())) {
    case Verdict::kComplete:
      list_.push_back({name, *step, timestamp, valid->score});
      return;
    case Verdict::kIncomplete:
      listed_damaged_.emplace_back(name, valid.status().message());
      return Drop(name, "is damaged (" + valid.status().message() + "); it is quarantined");
    case Verdict::kNewer:  // refused by RefuseNewer before this
    case Verdict::kUnknown:
      Fail("start-up cannot tell whether " + Path(name) +
           " is complete; it stays listed: " + valid.status().ToString());
      list_.push_back({name, *step, timestamp, std::nullopt});
      return;
  }
}

void StartupPass::CollectUnlisted(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    const std::optional<int64_t> step = CheckpointStep(name, options_.basename);
    if (!step || listed_names_.contains(name)) continue;
    io::EntryType type = io::EntryType::kNone;
    const io::IoStatus typed = fs_.entry_type(Path(name), &type);
    if (!typed.ok()) {
      Fail("start-up could not inspect " + Path(name) + ": " + typed.message());
      continue;
    }
    if (type != io::EntryType::kDirectory) {
      if (type != io::EntryType::kNone) {
        LogWarning("start-up left " + Path(name) + " alone: it is " + DescribeEntryType(type) +
                   ", not a checkpoint directory");
      }
      continue;
    }
    const Result<ValidCheckpoint> valid = Validate(name, *step);
    switch (Classify(valid.status())) {
      case Verdict::kComplete:
        unlisted_complete_.push_back({name, *step, valid->wall_time, valid->score});
        break;
      case Verdict::kIncomplete:
        Quarantine(name, valid.status().message());
        break;
      case Verdict::kNewer:  // refused by RefuseNewer before this
      case Verdict::kUnknown:
        Fail("start-up cannot tell whether " + Path(name) +
             " is complete; left alone: " + valid.status().ToString());
        break;
    }
  }
}

void StartupPass::Remove(const std::string& name, const std::string& what) {
  const Status removed = RemoveDirectoryDurably(fs_, options_.checkpoint_dir, name);
  if (!removed.ok()) {
    Fail("start-up could not remove " + Path(name) + ", " + what + ": " + removed.ToString());
    return;
  }
  LogInfo("removed " + Path(name) + ", " + what);
  report_.removed.push_back(name);
}

std::set<int64_t> StartupPass::PartnerSteps() const {
  const CheckpointPartner& partner = options_.partner;
  Result<CheckpointState> read =
      ReadCheckpointState(fs_, options_.checkpoint_dir, partner.state_file_name);
  if (read.ok()) return StepsNamedBy(*read, partner.basename);
  return StepsOnDisk(fs_, options_.checkpoint_dir, partner.basename);
}

void StartupPass::RelistOrRemoveUnlisted() {
  std::sort(unlisted_complete_.begin(), unlisted_complete_.end(),
            [](const Listed& a, const Listed& b) { return a.step > b.step; });
  std::set<int64_t> paired;
  if (!options_.partner.basename.empty() && !unlisted_complete_.empty()) {
    std::set<int64_t> ours;
    for (const Listed& entry : list_) ours.insert(entry.step);
    for (const Listed& entry : unlisted_complete_) ours.insert(entry.step);
    paired = NewestCommonSteps(ours, PartnerSteps(), options_.max_to_keep);
  }
  std::optional<int64_t> oldest_listed;
  for (const Listed& entry : list_) {
    if (!oldest_listed || entry.step < *oldest_listed) oldest_listed = entry.step;
  }
  const size_t keep = static_cast<size_t>(std::max(options_.max_to_keep, 0));
  std::vector<Listed> relist;
  for (const Listed& entry : unlisted_complete_) {
    const bool inside = oldest_listed && entry.step > *oldest_listed;
    const bool room = keep == 0 || list_.size() + relist.size() < keep;
    // keep_period's checkpoints are never dropped, and under a best mode any one may rank among
    // the best: retention at the next save decides, not the age of an unlisted one.
    const bool protected_by_rule =
        (options_.keep_period > 0 && entry.step % options_.keep_period == 0) ||
        options_.best_mode != BestMode::kNone;
    if (inside || room || protected_by_rule || paired.contains(entry.step)) {
      relist.push_back(entry);
    } else if (options_.keep_checkpoint_every_n_hours > 0) {
      LogInfo("start-up kept " + Path(entry.name) +
              " on disk unlisted: it is older than the retained checkpoints, and "
              "keep_checkpoint_every_n_hours may have preserved it");
      report_.kept_unlisted.push_back(entry.name);
    } else {
      Remove(entry.name, "a complete checkpoint older than the retained ones, no longer listed");
    }
  }
  std::reverse(relist.begin(), relist.end());  // oldest first
  for (Listed& entry : relist) {
    LogWarning("start-up listed " + Path(entry.name) + " again in " +
               Path(options_.state_file_name) + ": it is complete but was not listed");
    report_.relisted.push_back(entry.name);
    const auto at = std::find_if(list_.begin(), list_.end(),
                                 [&](const Listed& listed) { return listed.step > entry.step; });
    list_.insert(at, std::move(entry));
  }
}

}  // namespace state_internal

namespace {

// "1536 bytes (1.5 KiB)": a byte count for a log line.
std::string FormatByteCount(uint64_t bytes) {
  std::string text = std::to_string(bytes) + " bytes";
  if (bytes < 1024) return text;
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(units)) {
    value /= 1024;
    ++unit;
  }
  char figure[32];
  std::snprintf(figure, sizeof(figure), " (%.1f %s)", value, units[unit]);
  return text + figure;
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text.empty() ? "none" : text;
}

}  // namespace

using state_internal::Listed;
using state_internal::LockPairing;
using state_internal::StartupPass;

Result<StartupReport> CheckpointManager::Start() {
  std::lock_guard lock(mu_);
  const CheckpointManagerOptions options{
      .checkpoint_dir = dir_,
      .basename = basename_,
      .state_file_name = state_file_name_,
      .max_to_keep = max_to_keep_,
      .keep_checkpoint_every_n_hours = keep_every_n_hours_,
      .keep_period = keep_period_,
      .best_mode = best_mode_,
      .partner = partner_,
  };
  StartupReport report;
  std::unique_lock<std::mutex> pairing = LockPairing(!partner_.basename.empty());
  StartupPass pass(*fs_, options, validator_, &report);
  RETURN_IF_ERROR(pass.Run());
  entries_.clear();
  for (const Listed& entry : pass.list()) {
    entries_.push_back({entry.name, entry.timestamp, entry.score});
  }
  foreign_.clear();
  for (const Listed& entry : pass.foreign()) {
    foreign_.push_back({entry.name, entry.timestamp, std::nullopt});
  }
  last_preserved_timestamp_ = pass.last_preserved_timestamp();
  if (!pass.state_problem().empty() && !entries_.empty()) {
    report.rebuilt_because = pass.state_problem();
    std::vector<std::string> names;
    for (const Entry& entry : entries_) names.push_back(entry.name);
    LogWarning("" + pass.state_problem() + "; rebuilt the list of " + basename_ +
               " checkpoints in " + dir_ + " from the complete ones on disk: " + JoinNames(names));
  } else if (!pass.state_problem().empty() && pass.state_file_present()) {
    LogWarning("" + pass.state_problem() + ", and none is on disk: starting with no " + basename_ +
               " checkpoint in " + dir_);
  }
  if (pass.changed()) {
    const Status written = WriteCheckpointState(*fs_, dir_, StateLocked(), state_file_name_);
    if (!written.ok()) {
      const std::string what =
          "start-up could not rewrite the state file (the next save does): " + written.ToString();
      LogWarning(what);
      report.failures.push_back(what);
    }
  }
  // After the rewrite, so that the state file names them for as short a time as possible; even
  // when it failed, since a rename loses nothing and a reader validates what it is named.
  pass.QuarantineListed();
  std::sort(report.removed.begin(), report.removed.end());
  for (const std::string& name : report.quarantined) {
    report.quarantined_bytes += DirectoryBytes(*fs_, JoinCheckpointPath(dir_, name));
  }
  if (!report.quarantined.empty()) {
    LogWarning(std::to_string(report.quarantined.size()) + " quarantined " + basename_ +
               " checkpoint" + (report.quarantined.size() == 1 ? "" : "s") + " in " + dir_ +
               " hold " + FormatByteCount(report.quarantined_bytes) + ": " +
               JoinNames(report.quarantined) +
               ". Kept for inspection and never removed automatically; `asyncckpt gc " + dir_ +
               " --remove-quarantined` removes them (see docs/durability.md)");
  }
  return report;
}

}  // namespace asyncckpt
