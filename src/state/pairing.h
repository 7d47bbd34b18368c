#pragma once

// Pairing: the rules by which one saver's retention keeps the checkpoints of another saver in
// the same directory (the model's and the input pipeline's checkpoints of one job) in step,
// shared by CheckpointManager's retention (checkpoint_state.cc) and its start-up pass
// (startup_pass.cc). The contract is in the "Pairing" paragraph of CheckpointManager.

#include <cstdint>
#include <mutex>
#include <set>
#include <string>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"

namespace asyncckpt::state_internal {

/// The steps of the "<basename>-<step>" names that `state` lists.
std::set<int64_t> StepsNamedBy(const CheckpointState& state, const std::string& basename);

/// The steps of the real "<basename>-<step>" directories holding an index file: the partner's
/// checkpoints as far as a listing can tell, for when its state file cannot say.
std::set<int64_t> StepsOnDisk(io::FileSystem& fs, const std::string& dir,
                              const std::string& basename);

/// The newest `count` steps that `ours` and `theirs` both hold (all of them when count <= 0).
std::set<int64_t> NewestCommonSteps(const std::set<int64_t>& ours, const std::set<int64_t>& theirs,
                                    int count);

/// Serializes the retention passes of paired managers in this process: each pass reads the
/// partner's state file and writes its own, and two passes interleaved there could each drop
/// the pair the other keeps. One mutex for every pair: a pass holds it for a state-file write.
/// Unpaired (`paired` false): an empty lock, nothing is serialized.
std::unique_lock<std::mutex> LockPairing(bool paired);

}  // namespace asyncckpt::state_internal
