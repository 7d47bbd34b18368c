// The basenames a directory's state files claim (see state_claims.h).

#include "src/state/state_claims.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <memory>
#include <optional>
#include <string_view>

#include "src/state/checkpoint_names.h"
#include "src/state/state_file.h"
#include "src/util/io_status.h"
#include "src/util/status_macros.h"

namespace asyncckpt {
namespace {

// The fields a state file may begin with (blank lines aside); what SerializeCheckpointState
// writes first, and what TensorFlow writes.
constexpr std::array<std::string_view, 2> kFirstFields = {"model_checkpoint_path:",
                                                          "all_model_checkpoint_paths:"};

// True when the regular file `path` begins as a state file does. Reads at most 64 bytes: a
// dataset or a log beside the checkpoints is never read whole.
bool BeginsAsStateFile(io::FileSystem& fs, const std::string& path) {
  std::unique_ptr<io::File> file;
  if (!fs.open(path, io::OpenOptions{}, &file).ok()) return false;
  uint64_t size = 0;
  if (!file->size(&size).ok()) return false;
  std::string head(static_cast<size_t>(std::min<uint64_t>(size, 64)), '\0');
  if (!file->read_at(0, head.data(), head.size()).ok()) return false;
  const size_t begin = head.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return false;
  const std::string_view text = std::string_view(head).substr(begin);
  return std::any_of(kFirstFields.begin(), kFirstFields.end(),
                     [&](std::string_view field) { return text.starts_with(field); });
}

// The basename of "<basename>-<step>", or nullopt for a name of another form.
std::optional<std::string> BasenameOf(const std::string& name) {
  const size_t dash = name.rfind('-');
  if (dash == std::string::npos || dash == 0) return std::nullopt;
  const std::string basename = name.substr(0, dash);
  if (!CheckpointStep(name, basename)) return std::nullopt;
  return basename;
}

}  // namespace

Result<std::map<std::string, std::vector<StateFileClaim>>> FindStateFileClaims(
    io::FileSystem& fs, const std::string& dir) {
  std::map<std::string, std::vector<StateFileClaim>> claims;
  std::vector<std::string> names;
  const io::IoStatus listed = fs.list_dir(dir, &names);
  if (listed.error_number() == ENOENT) return claims;
  RETURN_IF_ERROR(ToStatus(listed).WithContext("listing " + dir + " for its state files"));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (name.ends_with(".lock") || name.find(state_internal::kTmpInfix) != std::string::npos ||
        BasenameOf(name)) {
      continue;
    }
    const std::string path = JoinCheckpointPath(dir, name);
    io::EntryType type = io::EntryType::kNone;
    if (!fs.entry_type(path, &type).ok() || type != io::EntryType::kFile) continue;
    if (!BeginsAsStateFile(fs, path)) continue;
    Result<CheckpointState> state = ReadCheckpointState(fs, dir, name);
    if (!state.ok()) continue;
    std::map<std::string, std::string> newest;  // basename -> the last entry of it listed
    for (const std::string& entry : state->all_model_checkpoint_paths) {
      if (std::optional<std::string> basename = BasenameOf(entry)) newest[*basename] = entry;
    }
    for (auto& [basename, checkpoint] : newest) {
      claims[basename].push_back({name, std::move(checkpoint)});
    }
  }
  return claims;
}

Status CheckBasenameUnclaimed(io::FileSystem& fs, const std::string& dir,
                              const std::string& basename, const std::string& state_file_name) {
  ASSIGN_OR_RETURN(const auto claims, FindStateFileClaims(fs, dir));
  const auto found = claims.find(basename);
  if (found == claims.end()) return Status::OK();
  for (const StateFileClaim& claim : found->second) {
    if (claim.state_file == state_file_name) continue;
    return Status::FailedPrecondition(
        "basename '" + basename + "' of state file " + JoinCheckpointPath(dir, state_file_name) +
        " belongs to state file " + JoinCheckpointPath(dir, claim.state_file) + ", which lists " +
        claim.checkpoint +
        ": a saver keeps only the checkpoints of its own state file, and retention would delete "
        "the other's. Give this saver another basename (or the other's state file), or another "
        "checkpoint_dir");
  }
  return Status::OK();
}

}  // namespace asyncckpt
