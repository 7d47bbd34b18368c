// ValidateSaverOptions: every range of SaverOptions, checked once, where the options enter the
// library (a saver's Create); below that the values are trusted.

#include "asyncckpt/saver_options.h"

#include <cmath>
#include <string>

#include "src/state/checkpoint_names.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

Status ValidateSaverOptions(const SaverOptions& options) {
  if (options.checkpoint_dir.empty()) {
    return Status::InvalidArgument("checkpoint_dir must be set");
  }
  if (options.save_steps.has_value() == options.save_secs.has_value()) {
    return Status::InvalidArgument("Exactly one of save_steps or save_secs should be set.");
  }
  if (options.save_steps && *options.save_steps <= 0) {
    return Status::InvalidArgument("save_steps must be positive, got " +
                                   std::to_string(*options.save_steps));
  }
  if (options.save_secs && (!(*options.save_secs > 0) || std::isinf(*options.save_secs))) {
    return Status::InvalidArgument("save_secs must be positive and finite, got " +
                                   std::to_string(*options.save_secs));
  }
  if (options.basename.empty()) {
    // "-3" would be no checkpoint name any reader parses back: saved, then never found again.
    return Status::InvalidArgument("basename must not be empty: checkpoints are <basename>-<step>");
  }
  RETURN_IF_ERROR(ValidateCheckpointName(options.basename + "-0")
                      .WithContext("basename " + QuoteForMessage(options.basename) +
                                   " is not a plain file name"));
  if (options.max_to_keep < 0) {
    return Status::InvalidArgument("max_to_keep must be >= 0 (0 keeps all), got " +
                                   std::to_string(options.max_to_keep));
  }
  if (!options.paired_input_basename.empty()) {
    RETURN_IF_ERROR(ValidateCheckpointName(options.paired_input_basename + "-0")
                        .WithContext("paired_input_basename '" + options.paired_input_basename +
                                     "' is not a plain file name"));
    if (options.paired_input_basename == options.basename) {
      return Status::InvalidArgument("paired_input_basename '" + options.paired_input_basename +
                                     "' must differ from basename");
    }
  }
  if (!(options.keep_checkpoint_every_n_hours >= 0)) {
    return Status::InvalidArgument("keep_checkpoint_every_n_hours must be >= 0");
  }
  if (options.keep_period < 0) {
    return Status::InvalidArgument(
        "keep_period must be >= 0 (0 keeps no step for its number), got " +
        std::to_string(options.keep_period));
  }
  if (options.best_mode != BestMode::kNone && options.max_to_keep <= 0) {
    return Status::InvalidArgument(
        "best_mode needs max_to_keep > 0 (how many of the best checkpoints to keep), got "
        "max_to_keep " +
        std::to_string(options.max_to_keep));
  }
  if (options.best_mode != BestMode::kNone && options.best_mode != BestMode::kMax &&
      options.best_mode != BestMode::kMin) {
    return Status::InvalidArgument("best_mode must be kNone, kMax or kMin");
  }
  if (options.user_metadata.contains(kRetentionScoreKey)) {
    return Status::InvalidArgument(std::string("user_metadata must not hold ") +
                                   kRetentionScoreKey +
                                   ": a checkpoint's score is given with its own save");
  }
  if (options.chunk_bytes < kMinChunkBytes || options.chunk_bytes > kMaxChunkBytes) {
    return Status::InvalidArgument(
        "chunk_bytes must be in [" + std::to_string(kMinChunkBytes) + ", " +
        std::to_string(kMaxChunkBytes) + "] (4 KiB to 1 GiB), got " +
        std::to_string(options.chunk_bytes) +
        ": every chunk takes at least one 4 KiB page of pinned staging and, under O_DIRECT, of "
        "its data file, so smaller chunks would each be padded to 4 KiB");
  }
  if (options.num_data_files == 0 || options.num_data_files > kMaxNumDataFiles) {
    return Status::InvalidArgument("num_data_files must be in [1, " +
                                   std::to_string(kMaxNumDataFiles) + "], got " +
                                   std::to_string(options.num_data_files));
  }
  RETURN_IF_ERROR(ValidateQueueDepth(options.queue_depth));
  if (options.background_threads > kMaxBackgroundThreads) {
    return Status::InvalidArgument(
        "background_threads must be <= " + std::to_string(kMaxBackgroundThreads) + ", got " +
        std::to_string(options.background_threads));
  }
  if (!options.clock) return Status::InvalidArgument("clock must be set");
  if (!(options.coordination_timeout_secs > 0) ||
      !std::isfinite(options.coordination_timeout_secs)) {
    return Status::InvalidArgument(
        "coordination_timeout_secs must be a positive number of "
        "seconds, got " +
        std::to_string(options.coordination_timeout_secs));
  }
  if (options.coordinator != nullptr) {
    const int rank = options.coordinator->rank();
    const int size = options.coordinator->size();
    if (size < 1 || rank < 0 || rank >= size) {
      return Status::InvalidArgument("coordinator says rank " + std::to_string(rank) + " of " +
                                     std::to_string(size) + " processes");
    }
    if (size > 1 && options.on_busy == OnBusy::kSkip) {
      // A save skipped on one rank would leave the others' parts waiting for it: the save of
      // that step would fail on every rank.
      return Status::InvalidArgument(
          "on_busy kSkip is not supported in a multi-process job (" + std::to_string(size) +
          " processes): a save skipped by one rank fails on all; use OnBusy::kWait");
    }
  }
  return ValidateCompressionOptions(options.compression);
}

}  // namespace asyncckpt
