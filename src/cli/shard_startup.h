#pragma once

// The start-up check of a train-sim --shard job: every rank's usage error reaches rank 0, and
// the options every rank must share (save schedule, steps, seed, sizes) are compared once,
// naming the option and each rank's value, before any rank touches the checkpoints.

#include <string>
#include <utility>
#include <vector>

#include "asyncckpt/coordinator.h"
#include "asyncckpt/status.h"
#include "src/cli/train_sim_flags.h"

namespace asyncckpt::cli {

/// The options every rank of a job must give alike, as (flag, value) with values normalised
/// (a size in bytes, a number), so that "1MiB" and "1048576" agree.
std::vector<std::pair<std::string, std::string>> SharedOptions(const TrainSimConfig& config);

/// What differs between rank 0's options and `others` (rank r's at others[r]; empty entries are
/// skipped): one line per option, naming it and each differing rank's value. Empty when all
/// agree.
std::string DescribeDisagreement(
    const std::vector<std::vector<std::pair<std::string, std::string>>>& ranks);

/// Collective: gathers every rank's outcome of checking its flags (`config`) and its shared
/// options. InvalidArgument, the same on every rank, listing each rank's usage error (ranks
/// with the same message together) or, when all are valid, the options that differ.
Status AgreeOnConfig(Coordinator& coordinator, const Result<TrainSimConfig>& config);

}  // namespace asyncckpt::cli
