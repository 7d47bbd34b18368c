#pragma once

// The report of an `asyncckpt train-sim` run: the summary printed on stdout and the one JSON
// object of --metrics_json. Their lines and field names are an interface (scripts/bench and the
// e2e tests read them): add to them, never rename.

#include <cstdint>

#include "asyncckpt/status.h"
#include "src/cli/train_sim_flags.h"
#include "src/cli/train_sim_summary.h"

namespace asyncckpt::cli {

/// Prints the "== train-sim summary ==" block on stdout. `state_bytes`: the job's whole state
/// (with --shard every rank's slices together; s.ranks has each rank's share).
void PrintSummary(const TrainSimConfig& config, const RunSummary& s, uint64_t state_bytes);

/// Writes the summary as one JSON object to config.metrics_json; IOError naming the flag when
/// the file cannot be written.
Status WriteMetricsJson(const TrainSimConfig& config, const RunSummary& s, uint64_t state_bytes);

}  // namespace asyncckpt::cli
