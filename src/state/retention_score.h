#pragma once

// A checkpoint's score for best-N retention (BestMode): carried from the save to the commit, and
// from the checkpoint's index back to a later start, as the user-metadata entry
// kRetentionScoreKey, so that the state file stays TensorFlow's CheckpointState text format.

#include <map>
#include <optional>
#include <string>

#include "asyncckpt/state.h"
#include "asyncckpt/status.h"

namespace asyncckpt {

/// The score that `user_metadata` holds under kRetentionScoreKey: nullopt when it holds none;
/// InvalidArgument naming the key and the text when the value is not a finite decimal number
/// (the whole text, no spaces): a save is refused before anything is written.
Result<std::optional<double>> RetentionScore(
    const std::map<std::string, std::string>& user_metadata);

}  // namespace asyncckpt
