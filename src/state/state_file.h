#pragma once

// The `checkpoint` state file: its text form (TensorFlow's CheckpointState text proto), checked
// on both sides, and its atomic read and rewrite. GetCheckpointState and LatestCheckpoint of
// include/asyncckpt/state.h are defined in state_file.cc.

#include <cstdint>
#include <string>
#include <string_view>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"
#include "asyncckpt/status.h"

namespace asyncckpt {

/// The largest state file that is read; a larger one is Corruption (a hostile or wrong file).
inline constexpr uint64_t kMaxCheckpointStateFileBytes = uint64_t{16} << 20;

/// The text form of `state` (TensorFlow's CheckpointState text proto), fields in proto order,
/// timestamps with enough digits to round-trip. The state must pass ValidateCheckpointState.
std::string SerializeCheckpointState(const CheckpointState& state);

/// OK when `state` can be written and read back: valid names, no duplicates, the model path last
/// in the list (or the list empty), timestamps empty or one per path, all finite.
/// InvalidArgument otherwise.
Status ValidateCheckpointState(const CheckpointState& state);

/// Parses the text form. Tolerates any field order and blank lines; anything else that is not
/// well formed (unknown or repeated field, bad quoting, a non-numeric timestamp, a bad name, a
/// duplicate, timestamps not one per path, the model path not last) is Corruption with a message
/// "<source>:<line>: <what>". A list with no timestamps gets timestamps of 0 (as TensorFlow); an
/// empty list with a model path set becomes [model path].
Result<CheckpointState> ParseCheckpointState(std::string_view text, const std::string& source);

/// Reads and parses `dir`/`state_file_name`. NotFound when it does not exist, Corruption when it
/// is larger than kMaxCheckpointStateFileBytes or does not parse, IOError when it cannot be read.
Result<CheckpointState> ReadCheckpointState(io::FileSystem& fs, const std::string& dir,
                                            const std::string& state_file_name);

/// Replaces `dir`/`state_file_name` atomically: writes "<state_file_name>.tmp-<random>", syncs
/// it, renames it over the state file, syncs `dir`. After a failure the previous state file is
/// intact (the temporary is removed when possible; CheckpointManager::Start removes what a
/// crash leaves). InvalidArgument when the state fails ValidateCheckpointState.
Status WriteCheckpointState(io::FileSystem& fs, const std::string& dir,
                            const CheckpointState& state,
                            const std::string& state_file_name = kCheckpointStateFileName);

}  // namespace asyncckpt
