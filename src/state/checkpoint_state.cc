#include "src/state/checkpoint_state.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <system_error>

#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {
namespace {

constexpr std::string_view kModelPathField = "model_checkpoint_path";
constexpr std::string_view kAllPathsField = "all_model_checkpoint_paths";
constexpr std::string_view kAllTimestampsField = "all_model_checkpoint_timestamps";
constexpr std::string_view kLastPreservedField = "last_preserved_timestamp";
constexpr std::string_view kTmpInfix = ".tmp-";

std::string_view Trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\r\f\v";
  const size_t begin = s.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  const size_t end = s.find_last_not_of(kSpace);
  return s.substr(begin, end - begin + 1);
}

bool IsHexDigit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

bool AllOf(std::string_view s, bool (*pred)(char)) {
  return !s.empty() && std::all_of(s.begin(), s.end(), pred);
}

bool IsDecimalDigit(char c) { return c >= '0' && c <= '9'; }

// True when `name` is "<prefix>.tmp-<hex>".
bool IsTmpOf(std::string_view name, std::string_view prefix) {
  if (name.size() <= prefix.size() + kTmpInfix.size()) return false;
  if (name.substr(0, prefix.size()) != prefix) return false;
  name.remove_prefix(prefix.size());
  if (name.substr(0, kTmpInfix.size()) != kTmpInfix) return false;
  return AllOf(name.substr(kTmpInfix.size()), IsHexDigit);
}

std::string RandomHex16() {
  std::random_device device;
  const uint64_t value = (uint64_t{device()} << 32) ^ uint64_t { device() };
  char buffer[17];
  std::snprintf(buffer, sizeof(buffer), "%016llx", static_cast<unsigned long long>(value));
  return std::string(buffer, 16);
}

std::string FormatDouble(double value) {
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  if (ec != std::errc()) return std::to_string(value);  // cannot happen with 64 bytes
  return std::string(buffer, end);
}

std::optional<double> ParseDouble(std::string_view text) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

// Why a name cannot be a directory entry, or empty when it can.
std::string NameProblem(std::string_view name) {
  if (name.empty()) return "empty checkpoint name";
  if (name.find('/') != std::string_view::npos) return "checkpoint name contains '/'";
  if (name.find("..") != std::string_view::npos || name == ".") {
    return "checkpoint name contains '..' or is '.'";
  }
  for (char c : name) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f || c == '"' || c == '\\') {
      return "checkpoint name contains a control byte, '\"' or '\\'";
    }
  }
  return {};
}

bool IsExchangeUnsupported(const io::IoStatus& status) {
  const int e = status.error_number();
  return e == ENOSYS || e == EINVAL || e == EOPNOTSUPP;
}

// Parses the text form line by line; keeps the line of each field for the final checks.
class StateParser {
 public:
  explicit StateParser(const std::string& source) : source_(source) {}

  Result<CheckpointState> Parse(std::string_view text) {
    int line_number = 0;
    while (!text.empty()) {
      ++line_number;
      const size_t eol = text.find('\n');
      const std::string_view line = text.substr(0, eol);
      text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
      RETURN_IF_ERROR(ParseLine(Trim(line), line_number));
    }
    RETURN_IF_ERROR(Finish());
    return std::move(state_);
  }

 private:
  Status Error(int line, const std::string& what) const {
    return Status::Corruption(source_ + ":" + std::to_string(line) + ": " + what);
  }

  Status ParseLine(std::string_view line, int number) {
    if (line.empty()) return Status::OK();
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) return Error(number, "expected '<field>: <value>'");
    const std::string_view field = Trim(line.substr(0, colon));
    const std::string_view value = Trim(line.substr(colon + 1));
    if (field == kModelPathField) return ParseModelPath(value, number);
    if (field == kAllPathsField) return ParseListPath(value, number);
    if (field == kAllTimestampsField) return ParseTimestamp(value, number);
    if (field == kLastPreservedField) return ParseLastPreserved(value, number);
    return Error(number, "unknown field '" + std::string(field) + "'");
  }

  Result<std::string> ParseName(std::string_view value, int number) const {
    if (value.size() < 2 || value.front() != '"' || value.back() != '"') {
      return Error(number, "expected a quoted name, got '" + std::string(value) + "'");
    }
    const std::string_view name = value.substr(1, value.size() - 2);
    if (name.find('"') != std::string_view::npos || name.find('\\') != std::string_view::npos) {
      return Error(number, "bad quoting in '" + std::string(value) + "'");
    }
    const std::string problem = NameProblem(name);
    if (!problem.empty()) return Error(number, problem + ": '" + std::string(name) + "'");
    return std::string(name);
  }

  Status ParseModelPath(std::string_view value, int number) {
    if (model_line_ != 0) return Error(number, "model_checkpoint_path repeated");
    ASSIGN_OR_RETURN(state_.model_checkpoint_path, ParseName(value, number));
    model_line_ = number;
    return Status::OK();
  }

  Status ParseListPath(std::string_view value, int number) {
    ASSIGN_OR_RETURN(std::string name, ParseName(value, number));
    if (std::find(state_.all_model_checkpoint_paths.begin(),
                  state_.all_model_checkpoint_paths.end(),
                  name) != state_.all_model_checkpoint_paths.end()) {
      return Error(number, "checkpoint '" + name + "' listed twice");
    }
    state_.all_model_checkpoint_paths.push_back(std::move(name));
    if (first_path_line_ == 0) first_path_line_ = number;
    return Status::OK();
  }

  Status ParseTimestamp(std::string_view value, int number) {
    const std::optional<double> timestamp = ParseDouble(value);
    if (!timestamp) return Error(number, "bad timestamp '" + std::string(value) + "'");
    state_.all_model_checkpoint_timestamps.push_back(*timestamp);
    if (first_timestamp_line_ == 0) first_timestamp_line_ = number;
    return Status::OK();
  }

  Status ParseLastPreserved(std::string_view value, int number) {
    if (last_preserved_line_ != 0) return Error(number, "last_preserved_timestamp repeated");
    const std::optional<double> timestamp = ParseDouble(value);
    if (!timestamp) return Error(number, "bad timestamp '" + std::string(value) + "'");
    state_.last_preserved_timestamp = *timestamp;
    last_preserved_line_ = number;
    return Status::OK();
  }

  Status Finish() {
    auto& paths = state_.all_model_checkpoint_paths;
    auto& timestamps = state_.all_model_checkpoint_timestamps;
    if (paths.empty() && !state_.model_checkpoint_path.empty()) {
      paths.push_back(state_.model_checkpoint_path);
    }
    if (!paths.empty() && state_.model_checkpoint_path != paths.back()) {
      const int line = model_line_ != 0 ? model_line_ : first_path_line_;
      return Error(line, "model_checkpoint_path '" + state_.model_checkpoint_path +
                             "' is not the last of all_model_checkpoint_paths ('" + paths.back() +
                             "')");
    }
    if (timestamps.empty()) {
      timestamps.assign(paths.size(), 0.0);
    } else if (timestamps.size() != paths.size()) {
      return Error(first_timestamp_line_,
                   std::to_string(timestamps.size()) + " all_model_checkpoint_timestamps for " +
                       std::to_string(paths.size()) + " all_model_checkpoint_paths");
    }
    return Status::OK();
  }

  const std::string& source_;
  CheckpointState state_;
  int model_line_ = 0;
  int first_path_line_ = 0;
  int first_timestamp_line_ = 0;
  int last_preserved_line_ = 0;
};

Status WriteWholeFile(io::FileSystem& fs, const std::string& path, const std::string& text) {
  std::unique_ptr<io::File> file;
  io::OpenOptions options;
  options.write = true;
  options.create = true;
  options.truncate = true;
  RETURN_IF_ERROR(ToStatus(fs.open(path, options, &file)));
  RETURN_IF_ERROR(ToStatus(file->write_at(0, text.data(), text.size())));
  return ToStatus(file->sync());
}

// The fallback of CommitDirectory where RENAME_EXCHANGE is unsupported; on success *old_path is
// where the previous copy now lives.
Status ReplaceByTwoRenames(io::FileSystem& fs, const std::string& parent,
                           const std::string& tmp_path, const std::string& final_path,
                           const std::string& final_name, std::string* old_path) {
  *old_path = JoinCheckpointPath(parent, TempDirName(final_name));
  RETURN_IF_ERROR(ToStatus(fs.rename(final_path, *old_path)));
  const io::IoStatus moved = fs.rename(tmp_path, final_path);
  if (!moved.ok()) {
    const io::IoStatus restored = fs.rename(*old_path, final_path);
    if (!restored.ok()) {
      LogLine("could not put " + final_path + " back from " + *old_path + ": " +
              restored.message());
    }
    return ToStatus(moved);
  }
  return Status::OK();
}

}  // namespace

Status ValidateCheckpointName(std::string_view name) {
  const std::string problem = NameProblem(name);
  if (problem.empty()) return Status::OK();
  return Status::InvalidArgument(problem + ": '" + std::string(name) + "'");
}

std::string JoinCheckpointPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string SerializeCheckpointState(const CheckpointState& state) {
  std::string text;
  if (!state.model_checkpoint_path.empty()) {
    text += std::string(kModelPathField) + ": \"" + state.model_checkpoint_path + "\"\n";
  }
  for (const std::string& path : state.all_model_checkpoint_paths) {
    text += std::string(kAllPathsField) + ": \"" + path + "\"\n";
  }
  for (double timestamp : state.all_model_checkpoint_timestamps) {
    text += std::string(kAllTimestampsField) + ": " + FormatDouble(timestamp) + "\n";
  }
  if (state.last_preserved_timestamp != 0) {
    text += std::string(kLastPreservedField) + ": " + FormatDouble(state.last_preserved_timestamp) +
            "\n";
  }
  return text;
}

Status ValidateCheckpointState(const CheckpointState& state) {
  const auto& paths = state.all_model_checkpoint_paths;
  const auto& timestamps = state.all_model_checkpoint_timestamps;
  if (!state.model_checkpoint_path.empty()) {
    RETURN_IF_ERROR(ValidateCheckpointName(state.model_checkpoint_path));
  }
  for (size_t i = 0; i < paths.size(); ++i) {
    RETURN_IF_ERROR(ValidateCheckpointName(paths[i]));
    if (std::find(paths.begin(), paths.begin() + i, paths[i]) != paths.begin() + i) {
      return Status::InvalidArgument("checkpoint '" + paths[i] + "' listed twice");
    }
  }
  if (!paths.empty() && paths.back() != state.model_checkpoint_path) {
    return Status::InvalidArgument("model_checkpoint_path '" + state.model_checkpoint_path +
                                   "' is not the last of all_model_checkpoint_paths");
  }
  if (!timestamps.empty() && timestamps.size() != paths.size()) {
    return Status::InvalidArgument(std::to_string(timestamps.size()) + " timestamps for " +
                                   std::to_string(paths.size()) + " checkpoint paths");
  }
  const auto not_finite = [](double t) { return !std::isfinite(t); };
  if (std::any_of(timestamps.begin(), timestamps.end(), not_finite) ||
      !std::isfinite(state.last_preserved_timestamp)) {
    return Status::InvalidArgument("checkpoint state holds a timestamp that is not finite");
  }
  return Status::OK();
}

Result<CheckpointState> ParseCheckpointState(std::string_view text, const std::string& source) {
  return StateParser(source).Parse(text);
}

Result<CheckpointState> ReadCheckpointState(io::FileSystem& fs, const std::string& dir,
                                            const std::string& state_file_name) {
  const std::string path = JoinCheckpointPath(dir, state_file_name);
  uint64_t size = 0;
  const io::IoStatus sized = fs.file_size(path, &size);
  if (sized.error_number() == ENOENT) return Status::NotFound("no state file " + path);
  RETURN_IF_ERROR(ToStatus(sized));
  if (size > kMaxCheckpointStateFileBytes) {
    return Status::Corruption(path + ": state file of " + std::to_string(size) +
                              " bytes exceeds the limit of " +
                              std::to_string(kMaxCheckpointStateFileBytes));
  }
  std::unique_ptr<io::File> file;
  RETURN_IF_ERROR(ToStatus(fs.open(path, io::OpenOptions{}, &file)));
  std::string text(size, '\0');
  RETURN_IF_ERROR(ToStatus(file->read_at(0, text.data(), text.size())));
  return ParseCheckpointState(text, path);
}

Status WriteCheckpointState(io::FileSystem& fs, const std::string& dir,
                            const CheckpointState& state, const std::string& state_file_name) {
  RETURN_IF_ERROR(ValidateCheckpointName(state_file_name));
  RETURN_IF_ERROR(ValidateCheckpointState(state).WithContext(
      "writing " + JoinCheckpointPath(dir, state_file_name)));
  const std::string final_path = JoinCheckpointPath(dir, state_file_name);
  const std::string tmp_path = JoinCheckpointPath(dir, TempDirName(state_file_name));
  Status status = WriteWholeFile(fs, tmp_path, SerializeCheckpointState(state));
  if (status.ok()) status = ToStatus(fs.rename(tmp_path, final_path));
  if (!status.ok()) {
    // Best effort: a leftover is also removed by RemoveStaleTemporaries at the next start.
    (void)fs.remove_file(tmp_path);
    return status;
  }
  return ToStatus(fs.sync_dir(dir.empty() ? "." : dir));
}

Result<CheckpointState> GetCheckpointState(const std::string& dir,
                                           const std::string& state_file_name, io::FileSystem* fs) {
  std::unique_ptr<io::FileSystem> posix;
  if (fs == nullptr) fs = (posix = io::NewPosixFileSystem()).get();
  return ReadCheckpointState(*fs, dir, state_file_name);
}

Result<std::string> LatestCheckpoint(const std::string& dir, const std::string& state_file_name,
                                     io::FileSystem* fs) {
  std::unique_ptr<io::FileSystem> posix;
  if (fs == nullptr) fs = (posix = io::NewPosixFileSystem()).get();
  bool exists = false;
  bool is_dir = false;
  RETURN_IF_ERROR(ToStatus(fs->stat(dir, &exists, &is_dir)));
  if (!exists) return Status::NotFound("checkpoint directory " + dir + " does not exist");
  if (!is_dir) return Status::NotFound("checkpoint directory " + dir + " is not a directory");
  ASSIGN_OR_RETURN(const CheckpointState state, ReadCheckpointState(*fs, dir, state_file_name));
  const std::string state_path = JoinCheckpointPath(dir, state_file_name);
  if (state.model_checkpoint_path.empty()) {
    return Status::NotFound("state file " + state_path + " names no checkpoint");
  }
  const std::string path = JoinCheckpointPath(dir, state.model_checkpoint_path);
  RETURN_IF_ERROR(ToStatus(fs->stat(path, &exists, &is_dir)));
  if (!exists || !is_dir) {
    return Status::NotFound("state file " + state_path + " names " + state.model_checkpoint_path +
                            " but " + path + " is not a directory");
  }
  return path;
}

std::string TempDirName(const std::string& final_name) {
  return final_name + std::string(kTmpInfix) + RandomHex16();
}

Status CommitDirectory(io::FileSystem& fs, const std::string& parent, const std::string& tmp_name,
                       const std::string& final_name) {
  RETURN_IF_ERROR(ValidateCheckpointName(tmp_name));
  RETURN_IF_ERROR(ValidateCheckpointName(final_name));
  const std::string tmp_path = JoinCheckpointPath(parent, tmp_name);
  const std::string final_path = JoinCheckpointPath(parent, final_name);
  RETURN_IF_ERROR(ToStatus(fs.sync_dir(tmp_path)));
  bool exists = false;
  bool is_dir = false;
  RETURN_IF_ERROR(ToStatus(fs.stat(final_path, &exists, &is_dir)));
  std::string old_path;  // where the previous copy lives once replaced
  if (!exists) {
    RETURN_IF_ERROR(ToStatus(fs.rename(tmp_path, final_path)));
  } else {
    const io::IoStatus swapped = fs.exchange(tmp_path, final_path);
    if (swapped.ok()) {
      old_path = tmp_path;
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
      LogLine("committed " + final_path +
              " but could not remove its previous copy: " + removed.message());
    }
  }
  return Status::OK();
}

// ---- CheckpointManager -------------------------------------------------------------------------

CheckpointManager::CheckpointManager(io::FileSystem* fs, std::string checkpoint_dir,
                                     std::string basename, int max_to_keep,
                                     double keep_checkpoint_every_n_hours, Clock clock,
                                     std::string state_file_name)
    : fs_(fs),
      dir_(std::move(checkpoint_dir)),
      basename_(std::move(basename)),
      max_to_keep_(max_to_keep),
      keep_every_n_hours_(keep_checkpoint_every_n_hours),
      state_file_name_(std::move(state_file_name)) {
  if (keep_every_n_hours_ > 0) next_preserve_time_ = clock() + keep_every_n_hours_ * 3600.0;
}

Status CheckpointManager::Recover() {
  std::lock_guard lock(mu_);
  Result<CheckpointState> read = ReadCheckpointState(*fs_, dir_, state_file_name_);
  if (read.status().code() == StatusCode::kNotFound) return Status::OK();
  RETURN_IF_ERROR(read.status());
  const CheckpointState& state = *read;
  std::vector<Entry> entries;
  for (size_t i = 0; i < state.all_model_checkpoint_paths.size(); ++i) {
    const std::string& name = state.all_model_checkpoint_paths[i];
    bool exists = false;
    bool is_dir = false;
    RETURN_IF_ERROR(ToStatus(fs_->stat(JoinCheckpointPath(dir_, name), &exists, &is_dir)));
    if (exists && is_dir) entries.push_back({name, state.all_model_checkpoint_timestamps[i]});
  }
  const bool dropped = entries.size() != state.all_model_checkpoint_paths.size();
  entries_ = std::move(entries);
  last_preserved_timestamp_ = state.last_preserved_timestamp;
  if (!dropped) return Status::OK();
  return WriteCheckpointState(*fs_, dir_, StateLocked(), state_file_name_);
}

bool CheckpointManager::IsStaleTemporary(const std::string& name) const {
  if (IsTmpOf(name, state_file_name_)) return true;
  const size_t tmp = name.rfind(kTmpInfix);
  if (tmp == std::string::npos) return false;
  const std::string_view checkpoint = std::string_view(name).substr(0, tmp);
  const std::string prefix = basename_ + "-";
  if (checkpoint.size() <= prefix.size() || checkpoint.substr(0, prefix.size()) != prefix) {
    return false;
  }
  return AllOf(checkpoint.substr(prefix.size()), IsDecimalDigit) && IsTmpOf(name, checkpoint);
}

Result<std::vector<std::string>> CheckpointManager::RemoveStaleTemporaries() {
  std::lock_guard lock(mu_);
  std::vector<std::string> names;
  RETURN_IF_ERROR(ToStatus(fs_->list_dir(dir_, &names)));
  std::sort(names.begin(), names.end());
  std::vector<std::string> removed;
  Status first_failure;
  for (const std::string& name : names) {
    if (!IsStaleTemporary(name)) continue;
    const std::string path = JoinCheckpointPath(dir_, name);
    bool exists = false;
    bool is_dir = false;
    io::IoStatus status = fs_->stat(path, &exists, &is_dir);
    if (status.ok() && exists) status = is_dir ? fs_->remove_tree(path) : fs_->remove_file(path);
    if (status.ok()) {
      removed.push_back(name);
    } else if (first_failure.ok()) {
      first_failure = ToStatus(status);
    }
  }
  if (!first_failure.ok()) return first_failure;
  return removed;
}

Status CheckpointManager::RecordCommitted(const std::string& name, double timestamp) {
  RETURN_IF_ERROR(ValidateCheckpointName(name).WithContext("recording a committed checkpoint"));
  std::lock_guard lock(mu_);
  std::erase_if(entries_, [&](const Entry& e) { return e.name == name; });
  // A name committed again is live again: an earlier drop of it must not delete the new copy.
  std::erase(unwritten_deletions_, name);
  deferred_deletions_.erase(name);
  entries_.push_back({name, timestamp});
  for (std::string& dropped : ApplyRetentionLocked()) {
    unwritten_deletions_.push_back(std::move(dropped));
  }
  RETURN_IF_ERROR(WriteCheckpointState(*fs_, dir_, StateLocked(), state_file_name_));
  return DeleteDroppedLocked();
}

std::vector<std::string> CheckpointManager::ApplyRetentionLocked() {
  std::vector<std::string> to_delete;
  if (max_to_keep_ <= 0) return to_delete;
  while (entries_.size() > static_cast<size_t>(max_to_keep_)) {
    Entry oldest = std::move(entries_.front());
    entries_.erase(entries_.begin());
    if (keep_every_n_hours_ > 0 && oldest.timestamp >= next_preserve_time_) {
      last_preserved_timestamp_ = oldest.timestamp;
      next_preserve_time_ += keep_every_n_hours_ * 3600.0;
      continue;
    }
    to_delete.push_back(std::move(oldest.name));
  }
  return to_delete;
}

Status CheckpointManager::DeleteDroppedLocked() {
  Status first_failure;
  for (const std::string& name : std::exchange(unwritten_deletions_, {})) {
    if (pins_.contains(name)) {
      deferred_deletions_.insert(name);
      continue;
    }
    Status deleted = DeleteCheckpointLocked(name);
    if (!deleted.ok() && first_failure.ok()) first_failure = std::move(deleted);
  }
  return first_failure;
}

Status CheckpointManager::DeleteCheckpointLocked(const std::string& name) {
  const io::IoStatus removed = fs_->remove_tree(JoinCheckpointPath(dir_, name));
  if (removed.error_number() == ENOENT) return Status::OK();
  return ToStatus(removed).WithContext("retention deleting checkpoint " + name);
}

void CheckpointManager::Pin(const std::string& name) {
  std::lock_guard lock(mu_);
  ++pins_[name];
}

void CheckpointManager::Unpin(const std::string& name) {
  std::lock_guard lock(mu_);
  auto pin = pins_.find(name);
  if (pin == pins_.end()) {
    LogLine("Unpin of checkpoint " + name + " in " + dir_ + " that is not pinned");
    return;
  }
  if (--pin->second > 0) return;
  pins_.erase(pin);
  if (deferred_deletions_.erase(name) == 0) return;
  const Status deleted = DeleteCheckpointLocked(name);
  if (!deleted.ok()) LogLine(deleted.ToString());
}

CheckpointState CheckpointManager::StateLocked() const {
  CheckpointState state;
  for (const Entry& entry : entries_) {
    state.all_model_checkpoint_paths.push_back(entry.name);
    state.all_model_checkpoint_timestamps.push_back(entry.timestamp);
  }
  if (!entries_.empty()) state.model_checkpoint_path = entries_.back().name;
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

}  // namespace asyncckpt
