#include "src/state/checkpoint_state.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <system_error>
#include <unordered_set>

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
constexpr std::string_view kDeletingInfix = ".deleting-";

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

// True when `name` is "<prefix><infix><hex>".
bool IsMarkedOf(std::string_view name, std::string_view prefix, std::string_view infix) {
  if (name.size() <= prefix.size() + infix.size()) return false;
  if (name.substr(0, prefix.size()) != prefix) return false;
  name.remove_prefix(prefix.size());
  if (name.substr(0, infix.size()) != infix) return false;
  return AllOf(name.substr(infix.size()), IsHexDigit);
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

}  // namespace

std::string DescribeEntryType(io::EntryType type) {
  switch (type) {
    case io::EntryType::kNone:
      return "missing";
    case io::EntryType::kFile:
      return "a file";
    case io::EntryType::kDirectory:
      return "a directory";
    case io::EntryType::kSymlink:
      return "a symlink";
    case io::EntryType::kFifo:
      return "a FIFO";
    case io::EntryType::kDevice:
      return "a device";
    case io::EntryType::kSocket:
      return "a socket";
    case io::EntryType::kOther:
      break;
  }
  return "a special file";
}

namespace {

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
    // A set, not a search of the list: a file of the largest accepted size holds some 400000
    // names, and a search per name took most of an hour.
    if (!listed_.insert(name).second) {
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
  std::unordered_set<std::string> listed_;  // all_model_checkpoint_paths so far
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
  *old_path = JoinCheckpointPath(parent, DeletingDirName(final_name));
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
  std::unordered_set<std::string_view> listed;  // linear in the list, as the parser
  listed.reserve(paths.size());
  for (const std::string& path : paths) {
    RETURN_IF_ERROR(ValidateCheckpointName(path));
    if (!listed.insert(path).second) {
      return Status::InvalidArgument("checkpoint '" + path + "' listed twice");
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
  // Only a regular file is opened: a FIFO or a device would block the open or the read.
  io::EntryType type = io::EntryType::kNone;
  RETURN_IF_ERROR(ToStatus(fs.entry_type(path, &type)));
  if (type == io::EntryType::kNone) return Status::NotFound("no state file " + path);
  if (type != io::EntryType::kFile) {
    // The message reads as the backends' open does ("<path> is a FIFO, not a regular file").
    return Status::Corruption("the state file " + path + " is " + DescribeEntryType(type) +
                              ", not a regular file");
  }
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
    // Best effort: a leftover is also removed by CheckpointManager::Start at the next start.
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
  const std::string state_path = JoinCheckpointPath(dir, state_file_name);
  Result<CheckpointState> read = ReadCheckpointState(*fs, dir, state_file_name);
  if (read.status().code() == StatusCode::kNotFound) {
    return Status::NotFound("no state file " + state_path +
                            ": nothing was committed in this directory, or the file was deleted "
                            "(a saver starting here rebuilds it from the checkpoints on disk)");
  }
  RETURN_IF_ERROR(read.status());
  const CheckpointState& state = *read;
  if (state.model_checkpoint_path.empty()) {
    return Status::NotFound("state file " + state_path +
                            " is empty: it names no checkpoint (a saver starting here rebuilds "
                            "it from the checkpoints on disk)");
  }
  const std::string path = JoinCheckpointPath(dir, state.model_checkpoint_path);
  RETURN_IF_ERROR(ToStatus(fs->stat(path, &exists, &is_dir)));
  if (!exists || !is_dir) {
    return Status::NotFound("state file " + state_path + " names " + state.model_checkpoint_path +
                            " as the latest checkpoint, but " + path +
                            (exists ? " is not a directory" : " does not exist") +
                            " (a saver starting here drops it from the list)");
  }
  return path;
}

std::string TempDirName(const std::string& final_name) {
  return final_name + std::string(kTmpInfix) + RandomHex16();
}

std::string DeletingDirName(const std::string& name) {
  return name + std::string(kDeletingInfix) + RandomHex16();
}

std::optional<int64_t> CheckpointStep(std::string_view name, std::string_view basename) {
  if (basename.empty() || name.size() <= basename.size() + 1) return std::nullopt;
  if (name.substr(0, basename.size()) != basename || name[basename.size()] != '-') {
    return std::nullopt;
  }
  const std::string_view digits = name.substr(basename.size() + 1);
  if (!AllOf(digits, IsDecimalDigit) || (digits.size() > 1 && digits[0] == '0')) {
    return std::nullopt;
  }
  int64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return step;
}

Status RemoveDirectoryDurably(io::FileSystem& fs, const std::string& parent,
                              const std::string& name) {
  RETURN_IF_ERROR(ValidateCheckpointName(name));
  const std::string path = JoinCheckpointPath(parent, name);
  const std::string doomed = JoinCheckpointPath(parent, DeletingDirName(name));
  RETURN_IF_ERROR(ToStatus(fs.rename(path, doomed)));
  // Until the rename is durable a crash may bring `name` back, so its files must stay whole.
  RETURN_IF_ERROR(ToStatus(fs.sync_dir(parent.empty() ? "." : parent)));
  return ToStatus(fs.remove_tree(doomed));
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
      LogLine("committed " + final_path + " but could not remove its previous copy (the next " +
              "start removes it): " + removed.message());
    }
  }
  return Status::OK();
}

Result<ValidCheckpoint> IndexFileExists(io::FileSystem& fs, const std::string& checkpoint_path) {
  const std::string index_path = JoinCheckpointPath(checkpoint_path, "index");
  io::EntryType type = io::EntryType::kNone;
  RETURN_IF_ERROR(ToStatus(fs.entry_type(index_path, &type)));
  if (type == io::EntryType::kNone) {
    return Status::NotFound("checkpoint " + checkpoint_path + " has no index file");
  }
  if (type != io::EntryType::kFile) {
    return Status::Corruption("index " + index_path + " is " + DescribeEntryType(type) +
                              ", not a regular file");
  }
  return ValidCheckpoint{};
}

namespace {

// What a validator's answer means for a directory: complete, known to be incomplete (it may be
// removed), or unknown (an I/O error, another format version: never removed).
enum class Verdict { kComplete, kIncomplete, kUnknown };

Verdict Classify(const Status& status) {
  if (status.ok()) return Verdict::kComplete;
  if (status.code() == StatusCode::kNotFound || status.code() == StatusCode::kCorruption) {
    return Verdict::kIncomplete;
  }
  return Verdict::kUnknown;
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text.empty() ? "none" : text;
}

std::set<int64_t> StepsNamedBy(const CheckpointState& state, const std::string& basename) {
  std::set<int64_t> steps;
  for (const std::string& name : state.all_model_checkpoint_paths) {
    if (auto step = CheckpointStep(name, basename)) steps.insert(*step);
  }
  return steps;
}

// The steps of the real "<basename>-<step>" directories holding an index file: the partner's
// checkpoints as far as a listing can tell, for when its state file cannot say.
std::set<int64_t> StepsOnDisk(io::FileSystem& fs, const std::string& dir,
                              const std::string& basename) {
  std::set<int64_t> steps;
  std::vector<std::string> names;
  if (!fs.list_dir(dir, &names).ok()) return steps;
  for (const std::string& name : names) {
    const std::optional<int64_t> step = CheckpointStep(name, basename);
    if (step && IndexFileExists(fs, JoinCheckpointPath(dir, name)).ok()) steps.insert(*step);
  }
  return steps;
}

// The newest `count` steps that `ours` and `theirs` both hold (all of them when count <= 0).
std::set<int64_t> NewestCommonSteps(const std::set<int64_t>& ours, const std::set<int64_t>& theirs,
                                    int count) {
  std::set<int64_t> common;
  for (auto it = ours.rbegin(); it != ours.rend(); ++it) {
    if (count > 0 && common.size() >= static_cast<size_t>(count)) break;
    if (theirs.contains(*it)) common.insert(*it);
  }
  return common;
}

// One checkpoint of the manager's list while start-up rebuilds it.
struct Listed {
  std::string name;
  int64_t step = 0;
  double timestamp = 0;
};

// CheckpointManager::Start's work, step by step (see its contract). It removes leftovers and
// unlisted debris as it goes; the listed checkpoints that turn out incomplete are only
// collected, because the state file on disk still names them until the caller rewrites it.
class StartupPass {
 public:
  StartupPass(io::FileSystem& fs, const CheckpointManagerOptions& options,
              const CheckpointValidator& validator, StartupReport* report)
      : fs_(fs), options_(options), validator_(validator), report_(*report) {}

  Status Run() {
    std::vector<std::string> names;
    RETURN_IF_ERROR(ToStatus(fs_.list_dir(options_.checkpoint_dir, &names))
                        .WithContext("listing checkpoint_dir at start-up"));
    std::sort(names.begin(), names.end());
    RemoveLeftovers(names);
    RETURN_IF_ERROR(LoadStateFile());
    CollectUnlisted(names);
    RelistOrRemoveUnlisted();
    return Status::OK();
  }

  // The list after start-up, oldest first.
  const std::vector<Listed>& list() const { return list_; }
  double last_preserved_timestamp() const { return last_preserved_; }
  // True when the state file must be rewritten to say what list() says.
  bool changed() const {
    return !report_.dropped.empty() || !report_.relisted.empty() ||
           (!state_parsed_ && !list_.empty());
  }
  // Listed in the old state file but incomplete: removed once the new one is written.
  const std::vector<std::string>& listed_incomplete() const { return listed_incomplete_; }
  // Why the state file could not be trusted, or empty.
  const std::string& state_problem() const { return state_problem_; }
  // True when there was a state file, usable or not.
  bool state_file_present() const { return state_file_present_; }

 private:
  std::string Path(const std::string& name) const {
    return JoinCheckpointPath(options_.checkpoint_dir, name);
  }

  void Fail(const std::string& what) {
    LogLine(what);
    report_.failures.push_back(what);
  }

  Result<ValidCheckpoint> Validate(const std::string& name) const {
    return validator_ ? validator_(Path(name)) : IndexFileExists(fs_, Path(name));
  }

  // A half-written save, an old copy of a re-save, an interrupted deletion, a state-file
  // temporary: never anything of value.
  bool IsLeftover(const std::string& name, bool* is_directory_kind) const {
    if (IsMarkedOf(name, options_.state_file_name, kTmpInfix)) {
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

  void RemoveLeftovers(const std::vector<std::string>& names) {
    for (const std::string& name : names) {
      bool directory_kind = false;
      if (!IsLeftover(name, &directory_kind)) continue;
      io::EntryType type = io::EntryType::kNone;
      io::IoStatus status = fs_.entry_type(Path(name), &type);
      if (status.ok() && type == io::EntryType::kNone) continue;
      const io::EntryType expected =
          directory_kind ? io::EntryType::kDirectory : io::EntryType::kFile;
      if (status.ok() && type != expected) {
        LogLine("start-up left " + Path(name) + " alone: it is " + DescribeEntryType(type) +
                ", which this library never writes under that name");
        continue;
      }
      if (status.ok())
        status = directory_kind ? fs_.remove_tree(Path(name)) : fs_.remove_file(Path(name));
      if (!status.ok()) {
        Fail("start-up could not remove " + Path(name) + ": " + status.message());
        continue;
      }
      LogLine("removed " + Path(name) + ", left by an interrupted save or deletion");
      report_.removed.push_back(name);
    }
  }

  void Drop(const std::string& name, const std::string& why) {
    LogLine("state file " + Path(options_.state_file_name) + " named " + name + ", which " + why +
            "; dropped it from the list");
    report_.dropped.push_back(name);
  }

  Status LoadStateFile() {
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

  void LoadListed(const std::string& name, double timestamp) {
    listed_names_.insert(name);
    const std::optional<int64_t> step = CheckpointStep(name, options_.basename);
    if (!step) {
      return Drop(name, "is not a checkpoint of this saver (" + options_.basename +
                            "-<step>); it is left untouched");
    }
    io::EntryType type = io::EntryType::kNone;
    const io::IoStatus typed = fs_.entry_type(Path(name), &type);
    if (!typed.ok()) {
      // Cannot tell: keep it listed, as it was.
      Fail("start-up could not inspect " + Path(name) + ": " + typed.message());
      list_.push_back({name, *step, timestamp});
      return;
    }
    if (type == io::EntryType::kNone) return Drop(name, "does not exist");
    if (type != io::EntryType::kDirectory) {
      return Drop(name, "is " + DescribeEntryType(type) +
                            ", not a checkpoint directory; it is left untouched");
    }
    const Result<ValidCheckpoint> valid = Validate(name);
    switch (Classify(valid.status())) {
      case Verdict::kComplete:
        list_.push_back({name, *step, timestamp});
        return;
      case Verdict::kIncomplete:
        listed_incomplete_.push_back(name);
        return Drop(name, "is incomplete (" + valid.status().message() + ")");
      case Verdict::kUnknown:
        Fail("start-up cannot tell whether " + Path(name) +
             " is complete; it stays listed: " + valid.status().ToString());
        list_.push_back({name, *step, timestamp});
        return;
    }
  }

  // Every unlisted "<basename>-<step>" real directory: complete ones are collected, incomplete
  // ones removed, undecidable ones left alone.
  void CollectUnlisted(const std::vector<std::string>& names) {
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
          LogLine("start-up left " + Path(name) + " alone: it is " + DescribeEntryType(type) +
                  ", not a checkpoint directory");
        }
        continue;
      }
      const Result<ValidCheckpoint> valid = Validate(name);
      switch (Classify(valid.status())) {
        case Verdict::kComplete:
          unlisted_complete_.push_back({name, *step, valid->wall_time});
          break;
        case Verdict::kIncomplete:
          Remove(name, "an incomplete checkpoint (" + valid.status().message() + ")");
          break;
        case Verdict::kUnknown:
          Fail("start-up cannot tell whether " + Path(name) +
               " is complete; left alone: " + valid.status().ToString());
          break;
      }
    }
  }

  void Remove(const std::string& name, const std::string& what) {
    const Status removed = RemoveDirectoryDurably(fs_, options_.checkpoint_dir, name);
    if (!removed.ok()) {
      Fail("start-up could not remove " + Path(name) + ", " + what + ": " + removed.ToString());
      return;
    }
    LogLine("removed " + Path(name) + ", " + what);
    report_.removed.push_back(name);
  }

  // The partner's steps: from its state file, else from the directories a listing shows.
  // Over-counting only keeps more (at most max_to_keep pairs), so no validation is needed.
  std::set<int64_t> PartnerSteps() const {
    const CheckpointPartner& partner = options_.partner;
    Result<CheckpointState> read =
        ReadCheckpointState(fs_, options_.checkpoint_dir, partner.state_file_name);
    if (read.ok()) return StepsNamedBy(*read, partner.basename);
    return StepsOnDisk(fs_, options_.checkpoint_dir, partner.basename);
  }

  void RelistOrRemoveUnlisted() {
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
      if (inside || room || paired.contains(entry.step)) {
        relist.push_back(entry);
      } else if (options_.keep_checkpoint_every_n_hours > 0) {
        LogLine("start-up kept " + Path(entry.name) +
                " on disk unlisted: it is older than the retained checkpoints, and "
                "keep_checkpoint_every_n_hours may have preserved it");
        report_.kept_unlisted.push_back(entry.name);
      } else {
        Remove(entry.name, "a complete checkpoint older than the retained ones, no longer listed");
      }
    }
    std::reverse(relist.begin(), relist.end());  // oldest first
    for (Listed& entry : relist) {
      report_.relisted.push_back(entry.name);
      const auto at = std::find_if(list_.begin(), list_.end(),
                                   [&](const Listed& listed) { return listed.step > entry.step; });
      list_.insert(at, std::move(entry));
    }
  }

  io::FileSystem& fs_;
  const CheckpointManagerOptions& options_;
  const CheckpointValidator& validator_;
  StartupReport& report_;

  bool state_file_present_ = false;
  bool state_parsed_ = false;
  std::string state_problem_;
  double last_preserved_ = 0;
  std::vector<Listed> list_;
  std::set<std::string> listed_names_;
  std::vector<std::string> listed_incomplete_;
  std::vector<Listed> unlisted_complete_;
};

}  // namespace

// ---- CheckpointManager -------------------------------------------------------------------------

namespace {

// Serializes the retention passes of paired managers in this process: each pass reads the
// partner's state file and writes its own, and two passes interleaved there could each drop
// the pair the other keeps. One mutex for every pair: a pass holds it for a state-file write.
std::mutex& PairingMutex() {
  static std::mutex mutex;
  return mutex;
}

std::unique_lock<std::mutex> LockPairing(bool paired) {
  if (!paired) return {};
  return std::unique_lock<std::mutex>(PairingMutex());
}

}  // namespace

CheckpointManager::CheckpointManager(io::FileSystem* fs, CheckpointManagerOptions options,
                                     Clock clock)
    : fs_(fs),
      dir_(std::move(options.checkpoint_dir)),
      basename_(std::move(options.basename)),
      max_to_keep_(options.max_to_keep),
      keep_every_n_hours_(options.keep_checkpoint_every_n_hours),
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

Result<StartupReport> CheckpointManager::Start() {
  std::lock_guard lock(mu_);
  const CheckpointManagerOptions options{
      .checkpoint_dir = dir_,
      .basename = basename_,
      .state_file_name = state_file_name_,
      .max_to_keep = max_to_keep_,
      .keep_checkpoint_every_n_hours = keep_every_n_hours_,
      .partner = partner_,
  };
  StartupReport report;
  std::unique_lock<std::mutex> pairing = LockPairing(!partner_.basename.empty());
  StartupPass pass(*fs_, options, validator_, &report);
  RETURN_IF_ERROR(pass.Run());
  entries_.clear();
  for (const Listed& entry : pass.list()) entries_.push_back({entry.name, entry.timestamp});
  last_preserved_timestamp_ = pass.last_preserved_timestamp();
  if (!pass.state_problem().empty() && !entries_.empty()) {
    report.rebuilt_because = pass.state_problem();
    std::vector<std::string> names;
    for (const Entry& entry : entries_) names.push_back(entry.name);
    LogLine("WARNING: " + pass.state_problem() + "; rebuilt the list of " + basename_ +
            " checkpoints in " + dir_ + " from the complete ones on disk: " + JoinNames(names));
  } else if (!pass.state_problem().empty() && pass.state_file_present()) {
    LogLine("WARNING: " + pass.state_problem() + ", and none is on disk: starting with no " +
            basename_ + " checkpoint in " + dir_);
  }
  if (pass.changed()) {
    const Status written = WriteCheckpointState(*fs_, dir_, StateLocked(), state_file_name_);
    if (!written.ok()) {
      const std::string what =
          "start-up could not rewrite the state file (the next save does): " + written.ToString();
      LogLine(what);
      report.failures.push_back(what);
      return report;  // the old state file may still name what is incomplete: keep it
    }
  }
  for (const std::string& name : pass.listed_incomplete()) {
    const Status removed = RemoveDirectoryDurably(*fs_, dir_, name);
    if (removed.ok()) {
      LogLine("removed " + JoinCheckpointPath(dir_, name) + ", an incomplete checkpoint");
      report.removed.push_back(name);
    } else {
      const std::string what =
          "start-up could not remove " + JoinCheckpointPath(dir_, name) + ": " + removed.ToString();
      LogLine(what);
      report.failures.push_back(what);
    }
  }
  std::sort(report.removed.begin(), report.removed.end());
  return report;
}

Status CheckpointManager::RecordCommitted(const std::string& name, double timestamp) {
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
  entries_.push_back({name, timestamp});
  {
    // Reading the partner's list and writing ours is one step for the pair (see the class
    // comment); the deletions that follow touch only what our state file no longer names.
    std::unique_lock<std::mutex> pairing = LockPairing(!partner_.basename.empty());
    const std::set<int64_t> partner_steps = PartnerStepsLocked();
    for (std::string& dropped : ApplyRetentionLocked(partner_steps)) {
      unwritten_deletions_.push_back(std::move(dropped));
    }
    RETURN_IF_ERROR(WriteCheckpointState(*fs_, dir_, StateLocked(), state_file_name_));
  }
  DeleteDroppedLocked();
  return Status::OK();
}

std::set<int64_t> CheckpointManager::PartnerStepsLocked() {
  if (partner_.basename.empty() || max_to_keep_ <= 0) return {};
  Result<CheckpointState> read = ReadCheckpointState(*fs_, dir_, partner_.state_file_name);
  if (read.ok()) {
    partner_steps_ = StepsNamedBy(*read, partner_.basename);
  } else if (read.status().code() == StatusCode::kNotFound) {
    partner_steps_.clear();  // the partner has committed nothing yet
  } else {
    LogLine(
        "retention could not read the partner's state file; protecting the pairs it listed "
        "before: " +
        read.status().ToString());
  }
  return partner_steps_;
}

std::vector<std::string> CheckpointManager::ApplyRetentionLocked(
    const std::set<int64_t>& partner_steps) {
  std::vector<std::string> to_delete;
  if (max_to_keep_ <= 0 || entries_.size() <= static_cast<size_t>(max_to_keep_)) return to_delete;
  std::set<int64_t> ours;
  for (const Entry& entry : entries_) {
    if (auto step = CheckpointStep(entry.name, basename_)) ours.insert(*step);
  }
  const std::set<int64_t> paired = NewestCommonSteps(ours, partner_steps, max_to_keep_);
  const size_t newest_from = entries_.size() - static_cast<size_t>(max_to_keep_);
  std::vector<Entry> kept;
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry& entry = entries_[i];
    const std::optional<int64_t> step = CheckpointStep(entry.name, basename_);
    if (i >= newest_from || (step && paired.contains(*step))) {
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

void CheckpointManager::DeleteDroppedLocked() {
  for (const std::string& name : std::exchange(unwritten_deletions_, {})) {
    if (pins_.contains(name)) {
      deferred_deletions_.insert(name);
      continue;
    }
    DeleteCheckpointLocked(name);
  }
}

void CheckpointManager::DeleteCheckpointLocked(const std::string& name) {
  const std::string path = JoinCheckpointPath(dir_, name);
  io::EntryType type = io::EntryType::kNone;
  io::IoStatus typed = fs_->entry_type(path, &type);
  if (typed.ok() && type == io::EntryType::kNone) return;  // already gone
  if (typed.ok() && type != io::EntryType::kDirectory) {
    LogLine("retention left " + path + " alone: it is " + DescribeEntryType(type) +
            ", not a checkpoint directory this library wrote");
    return;
  }
  io::EntryType index_type = io::EntryType::kNone;
  if (typed.ok()) typed = fs_->entry_type(JoinCheckpointPath(path, "index"), &index_type);
  if (typed.ok() && index_type != io::EntryType::kFile) {
    LogLine("retention left " + path +
            " alone: it holds no index file, so this library did not write it as it is");
    return;
  }
  const Status removed = typed.ok() ? RemoveDirectoryDurably(*fs_, dir_, name) : ToStatus(typed);
  if (!removed.ok()) {
    ++retention_failures_;
    LogLine(
        "retention could not remove " + path +
        " (the save that dropped it is committed; the next start retries): " + removed.ToString());
    return;
  }
  LogLine("retention removed " + path);
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
  DeleteCheckpointLocked(name);
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

int64_t CheckpointManager::retention_failures() const { return retention_failures_.load(); }

// ---- committed steps, for readers ---------------------------------------------------------------

namespace {

// Why the state file's list of `basename` cannot be used, or empty when it can; *steps gets
// its steps. An error when a named checkpoint cannot be inspected.
Result<std::string> StateFileProblem(io::FileSystem& fs, const std::string& dir,
                                     const std::string& basename,
                                     const std::string& state_file_name,
                                     const CheckpointValidator& validator,
                                     std::vector<int64_t>* steps) {
  const std::string state_path = JoinCheckpointPath(dir, state_file_name);
  Result<CheckpointState> read = ReadCheckpointState(fs, dir, state_file_name);
  if (read.status().code() == StatusCode::kNotFound) return "there is no state file " + state_path;
  if (read.status().code() == StatusCode::kCorruption) return read.status().message();
  RETURN_IF_ERROR(read.status());
  for (const std::string& name : read->all_model_checkpoint_paths) {
    const std::optional<int64_t> step = CheckpointStep(name, basename);
    if (!step) continue;  // not a checkpoint of this basename: nothing to say about it
    const std::string path = JoinCheckpointPath(dir, name);
    io::EntryType type = io::EntryType::kNone;
    RETURN_IF_ERROR(ToStatus(fs.entry_type(path, &type)));
    if (type != io::EntryType::kDirectory) {
      return "state file " + state_path + " names " + name + ", which is " +
             DescribeEntryType(type);
    }
    const Result<ValidCheckpoint> valid = validator(path);
    if (Classify(valid.status()) == Verdict::kIncomplete) {
      return "state file " + state_path + " names " + name + ", which is incomplete (" +
             valid.status().message() + ")";
    }
    RETURN_IF_ERROR(valid.status());
    steps->push_back(*step);
  }
  if (steps->empty()) return "state file " + state_path + " names no checkpoint of " + basename;
  return std::string();
}

}  // namespace

Result<std::vector<int64_t>> ListCommittedSteps(io::FileSystem& fs, const std::string& dir,
                                                const std::string& basename,
                                                const std::string& state_file_name,
                                                const CheckpointValidator& validator) {
  const CheckpointValidator check =
      validator ? validator : [&fs](const std::string& path) { return IndexFileExists(fs, path); };
  std::vector<int64_t> steps;
  ASSIGN_OR_RETURN(const std::string problem,
                   StateFileProblem(fs, dir, basename, state_file_name, check, &steps));
  if (problem.empty()) {
    std::sort(steps.begin(), steps.end());
    return steps;
  }
  steps.clear();
  std::vector<std::string> names;
  const io::IoStatus listed = fs.list_dir(dir, &names);
  if (listed.error_number() == ENOENT) return steps;
  RETURN_IF_ERROR(ToStatus(listed));
  for (const std::string& name : names) {
    const std::optional<int64_t> step = CheckpointStep(name, basename);
    if (!step) continue;
    const std::string path = JoinCheckpointPath(dir, name);
    io::EntryType type = io::EntryType::kNone;
    if (!fs.entry_type(path, &type).ok() || type != io::EntryType::kDirectory) continue;
    const Result<ValidCheckpoint> valid = check(path);
    if (valid.ok()) {
      steps.push_back(*step);
    } else if (Classify(valid.status()) == Verdict::kUnknown) {
      LogLine("cannot tell whether " + path +
              " is complete; not counted: " + valid.status().ToString());
    }
  }
  std::sort(steps.begin(), steps.end());
  if (!steps.empty()) {
    LogLine("WARNING: " + problem + "; using the " + std::to_string(steps.size()) + " complete " +
            basename + " checkpoints found in " + dir + " instead (newest: step " +
            std::to_string(steps.back()) + ")");
  }
  return steps;
}

}  // namespace asyncckpt
