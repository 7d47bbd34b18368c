// Deciding whether a checkpoint is complete (see checkpoint_validator.h).

#include "src/state/checkpoint_validator.h"

#include <exception>
#include <new>

#include "src/format/index_file.h"
#include "src/state/checkpoint_names.h"
#include "src/state/retention_score.h"
#include "src/util/io_status.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

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

Result<ValidCheckpoint> ValidateCheckpointDirectory(io::FileSystem& fs,
                                                    const std::string& checkpoint_path) {
  try {
    ASSIGN_OR_RETURN(const format::Index index,
                     format::LoadIndexCheckingDataFiles(fs, checkpoint_path));
    // A score that does not parse cannot rank: unscored, the checkpoint is never dropped.
    const Result<std::optional<double>> score = RetentionScore(index.metadata.user);
    return ValidCheckpoint{.wall_time = index.metadata.wall_time,
                           .step = index.metadata.step,
                           .score = score.ok() ? *score : std::nullopt};
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("out of memory validating checkpoint " + checkpoint_path);
  } catch (const std::exception& e) {
    return Status::Internal("validating checkpoint " + checkpoint_path + ": " + e.what());
  }
}

namespace state_internal {

Verdict Classify(const Status& status) {
  if (status.ok()) return Verdict::kComplete;
  if (status.code() == StatusCode::kNotFound || status.code() == StatusCode::kCorruption) {
    return Verdict::kIncomplete;
  }
  if (status.code() == StatusCode::kFailedPrecondition) return Verdict::kNewer;
  return Verdict::kUnknown;
}

Result<ValidCheckpoint> ValidateNamed(const CheckpointValidator& validator, const std::string& path,
                                      int64_t step) {
  Result<ValidCheckpoint> valid = validator(path);
  if (valid.ok() && valid->step && *valid->step != step) {
    return Status::Corruption(path + " holds the state of step " + std::to_string(*valid->step) +
                              ", not of step " + std::to_string(step) + " as its name says");
  }
  return valid;
}

}  // namespace state_internal

}  // namespace asyncckpt
