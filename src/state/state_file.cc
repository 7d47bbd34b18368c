// The `checkpoint` state file: text form, parser, read and atomic rewrite (see state_file.h),
// and the public GetCheckpointState and LatestCheckpoint.

#include "src/state/state_file.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <memory>
#include <optional>
#include <system_error>
#include <unordered_set>

#include "src/state/checkpoint_names.h"
#include "src/util/io_status.h"
#include "src/util/status_macros.h"

namespace asyncckpt {
namespace {

using state_internal::NameProblem;

constexpr std::string_view kModelPathField = "model_checkpoint_path";
constexpr std::string_view kAllPathsField = "all_model_checkpoint_paths";
constexpr std::string_view kAllTimestampsField = "all_model_checkpoint_timestamps";
constexpr std::string_view kLastPreservedField = "last_preserved_timestamp";

std::string_view Trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\r\f\v";
  const size_t begin = s.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  const size_t end = s.find_last_not_of(kSpace);
  return s.substr(begin, end - begin + 1);
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
    return Error(number, "unknown field " + QuoteForMessage(field));
  }

  Result<std::string> ParseName(std::string_view value, int number) const {
    if (value.size() < 2 || value.front() != '"' || value.back() != '"') {
      return Error(number, "expected a quoted name, got " + QuoteForMessage(value));
    }
    const std::string_view name = value.substr(1, value.size() - 2);
    if (name.find('"') != std::string_view::npos || name.find('\\') != std::string_view::npos) {
      return Error(number, "bad quoting in " + QuoteForMessage(value));
    }
    const std::string problem = NameProblem(name);
    if (!problem.empty()) return Error(number, problem + ": " + QuoteForMessage(name));
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
    if (!timestamp) return Error(number, "bad timestamp " + QuoteForMessage(value));
    state_.all_model_checkpoint_timestamps.push_back(*timestamp);
    if (first_timestamp_line_ == 0) first_timestamp_line_ = number;
    return Status::OK();
  }

  Status ParseLastPreserved(std::string_view value, int number) {
    if (last_preserved_line_ != 0) return Error(number, "last_preserved_timestamp repeated");
    const std::optional<double> timestamp = ParseDouble(value);
    if (!timestamp) return Error(number, "bad timestamp " + QuoteForMessage(value));
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

}  // namespace

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
  io::EntryType type = io::EntryType::kNone;
  RETURN_IF_ERROR(ToStatus(fs->entry_type(dir, &type, io::Symlinks::kFollow)));
  if (type == io::EntryType::kNone) {
    return Status::NotFound("checkpoint directory " + QuoteForMessage(dir) + " does not exist");
  }
  if (type != io::EntryType::kDirectory) {
    return Status::NotFound("checkpoint directory " + QuoteForMessage(dir) + " is not a directory");
  }
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
  RETURN_IF_ERROR(ToStatus(fs->entry_type(path, &type, io::Symlinks::kFollow)));
  const bool exists = type != io::EntryType::kNone;
  if (type != io::EntryType::kDirectory) {
    return Status::NotFound("state file " + state_path + " names " + state.model_checkpoint_path +
                            " as the latest checkpoint, but " + path +
                            (exists ? " is not a directory" : " does not exist") +
                            " (a saver starting here drops it from the list)");
  }
  return path;
}

}  // namespace asyncckpt
