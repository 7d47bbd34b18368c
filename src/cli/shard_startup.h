#pragma once

// The start-up check of a train-sim --shard job: every rank's usage error reaches rank 0, and
// every option that shapes the state or the job's course (the model, the save schedule and
// retention, the input stream, the dataset itself) is compared once, naming the option and each
// rank's value, before any rank touches the checkpoints. Every flag of train-sim is either
// compared or listed in RankLocalFlags with why it need not be.

#include <string>
#include <utility>
#include <vector>

#include "asyncckpt/coordinator.h"
#include "asyncckpt/status.h"
#include "src/cli/train_sim_flags.h"

namespace asyncckpt::cli {

/// The options every rank of a job must give alike, as (flag, value) with values normalised
/// (a size in bytes, a number), so that "1MiB" and "1048576" agree. --dataset is compared
/// apart, once resolved and opened (AgreeOnDataset).
std::vector<std::pair<std::string, std::string>> SharedOptions(const TrainSimConfig& config);

/// The flags of train-sim that ranks may give differently, each with why (flag without "--",
/// reason): they change how fast or where a rank works, or what rank 0 reports, never the bytes
/// of the state, the input stream or which steps save. Every other flag is compared.
const std::vector<std::pair<std::string, std::string>>& RankLocalFlags();

/// What differs between rank 0's options and `others` (rank r's at others[r]; empty entries are
/// skipped): one line per option, naming it and each differing rank's value. Empty when all
/// agree.
std::string DescribeDisagreement(
    const std::vector<std::vector<std::pair<std::string, std::string>>>& ranks);

/// Collective: gathers every rank's outcome of checking its flags (`config`) and its shared
/// options. InvalidArgument, the same on every rank, listing each rank's usage error (ranks
/// with the same message together) or, when all are valid, the options that differ.
Status AgreeOnConfig(Coordinator& coordinator, const Result<TrainSimConfig>& config);

/// What ranks compare of a dataset file: its path, size and the XXH3 of its first 4 KiB (the
/// header and the first records); the I/O error when it cannot be read.
Result<std::string> DescribeDataset(const std::string& path);

/// Collective, after AgreeOnConfig: rank 0 writes the synthetic dataset when config.dataset
/// (default <checkpoint_dir>/train-sim-dataset.bin, set here) is missing; then every rank
/// describes its own (DescribeDataset). InvalidArgument, the same on every rank, naming each
/// rank's dataset when they differ or one cannot be read; Unavailable when rank 0 could not
/// write it or a collective failed.
Status AgreeOnDataset(Coordinator& coordinator, TrainSimConfig& config);

}  // namespace asyncckpt::cli
