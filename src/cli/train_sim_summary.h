#pragma once

// The figures of one `asyncckpt train-sim` run (RunSummary), which the run fills in and the
// report prints, and the statistics drawn from them: percentiles, per-save blocked and
// durable times, the loop time the saves cost, and the figures the ranks of a --shard job
// gather.

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "asyncckpt/coordinator.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/status.h"

namespace asyncckpt::cli {

/// Most steps --step_series keeps: 24 bytes each, so at most 24 MB.
inline constexpr size_t kMaxSeriesSteps = 1000000;

/// One step of the --step_series timeline.
struct StepPoint {
  /// The global step.
  int64_t step = 0;
  /// Its time in the loop, less the yardstick's memcpy.
  double ms = 0;
  /// True when a save began at this step.
  bool saved = false;
};

/// One rank's figures of a --shard job.
struct RankFigures {
  /// Bytes of the rank's slice of the state.
  uint64_t shard_bytes = 0;
  /// Median training-thread time blocked per save.
  double blocked_median = 0;
  /// Longest training-thread time blocked by one save.
  double blocked_max = 0;
  /// Median time of the yardstick memcpy of the rank's slice.
  double memcpy_median = 0;
  /// Median time from a save's start to its being durable.
  double durable_median = 0;
  /// Bytes the rank read restoring at start.
  uint64_t restore_bytes_read = 0;
  /// Time the rank took restoring at start.
  double restore_seconds = 0;
};

/// What one run measured, for the summary and --metrics_json.
struct RunSummary {
  /// The step the run started (resumed) at.
  int64_t start_step = 0;
  /// The step it ended at.
  int64_t final_step = 0;
  /// Times of steps at which a save began, in ms.
  std::vector<double> step_ms_save;
  /// Times of the other steps, in ms.
  std::vector<double> step_ms_no_save;
  /// With --step_series: the first kMaxSeriesSteps steps.
  std::vector<StepPoint> step_series;
  /// Wall time of the loop and the session's close.
  double wall_seconds = 0;
  /// The training loop's own wall time, less the yardstick memcpys taken inside it: its steps
  /// at the median step time plus what checkpointing cost beyond them.
  double loop_seconds = 0;
  /// VmHWM at the end.
  uint64_t peak_rss_bytes = 0;
  /// Arrays in the registry.
  uint64_t tensors = 0;
  /// The yardstick taken before each save, by step.
  std::map<int64_t, double> memcpy_seconds_by_step;
  /// Digest of the final state (with --shard, of the global state).
  uint64_t digest = 0;
  /// The model saver's totals.
  SaverTotals totals;
  /// -1: not asked; else the number of checkpoints verified.
  int verified = -1;
  /// Bytes of this process's state.
  uint64_t state_bytes = 0;
  /// Digest of the input iterator's final state.
  uint64_t input_digest = 0;
  /// Records the input emitted.
  int64_t records_consumed = 0;
  /// Input checkpoints committed.
  int64_t input_checkpoints = 0;
  /// Sessions re-created after a pre-emption.
  int64_t recoveries = 0;
  /// --shard: this rank.
  int rank = 0;
  /// --shard: processes in the job.
  int world_size = 1;
  /// --shard: bytes this rank read restoring.
  uint64_t restore_bytes_read = 0;
  /// --shard: time this rank took restoring.
  double restore_seconds = 0;
  /// --shard: every rank's figures in rank order (gathered to every rank).
  std::vector<RankFigures> ranks;
  /// --device cuda: one device-to-host copy of the state into pinned memory (0: host state).
  double d2h_seconds = 0;
  /// --device cuda: the restore of the newest checkpoint into GPU memory after the run.
  double gpu_restore_seconds = 0;
  /// --device cuda: whether that restore gave back the final state bit for bit (-1: none).
  int gpu_restore_exact = -1;
};

/// The p-th percentile (nearest rank) of `values`; 0 when empty.
double Percentile(std::vector<double> values, double p);

// Per-save figures (medians, ratios) come from the saver's window of recent saves
// (kSaverTotalsWindow); totals and maxima from its running totals, exact over every save.

/// Each save's training-thread blocked time.
std::vector<double> BlockedPerSave(const SaverTotals& totals);
/// The first save's blocked time over the median of the later ones' (0 with fewer than two).
double FirstOverSteadyBlocked(const SaverTotals& totals);
/// The median blocked time of every save after the first.
double SteadyBlockedMedian(const SaverTotals& totals);
/// Each successful save's time to durable.
std::vector<double> DurablePerSave(const SaverTotals& totals);
/// The yardstick memcpy times, in step order.
std::vector<double> MemcpyRuns(const RunSummary& s);
/// Each save's blocked time over the memcpy timed just before it (same step); saves without
/// one (yardstick off) are left out.
std::vector<double> BlockedOverMemcpyPerSave(const RunSummary& s);
/// Every step's time, in ms.
std::vector<double> AllStepsMs(const RunSummary& s);
/// The loop's wall time beyond its steps at their median time: what the saves cost the loop,
/// blocked time and slowed steps alike (yardstick memcpys excluded).
double LoopSecondsLost(const RunSummary& s);
/// LoopSecondsLost over the saves begun in the loop; 0 without one.
double LoopSecondsLostPerSave(const RunSummary& s);

/// --shard: every rank's figures, in rank order, gathered to every rank. Collective.
Result<std::vector<RankFigures>> GatherFigures(Coordinator& coordinator, const RunSummary& s);

}  // namespace asyncckpt::cli
