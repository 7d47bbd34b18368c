#pragma once

// Which checkpoint directories are complete, by their index and data files: the savers'
// validator. It and CommittedCheckpointSteps (asyncckpt/state.h) are the state unit's only
// users of the format (src/format/index_file.h).

#include <string>

#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"
#include "src/state/checkpoint_state.h"

namespace asyncckpt {

/// The savers' CheckpointValidator: OK (with the metadata's wall time and step) when
/// `checkpoint_path` holds a regular "index" file of at most format::kMaxIndexBytes that decodes,
/// and every chunk it names lies inside its data files (their sizes, not their bytes, are checked).
/// NotFound or Corruption when it does not; FailedPrecondition for an intact index of another
/// format version; IOError when a file cannot be read; ResourceExhausted when the index cannot
/// be held in memory. Never opens anything but the index, never follows a symlinked index.
Result<ValidCheckpoint> ValidateCheckpointDirectory(io::FileSystem& fs,
                                                    const std::string& checkpoint_path);

}  // namespace asyncckpt
