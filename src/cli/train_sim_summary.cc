// The statistics `asyncckpt train-sim` draws from a run's figures for its summary, its JSON
// report and the figures its ranks gather.

#include "src/cli/train_sim_summary.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "src/cli/shard_job.h"
#include "src/util/status_macros.h"

namespace asyncckpt::cli {

namespace {

uint64_t DoubleBits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

double BitsDouble(uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * values.size()));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}

std::vector<double> BlockedPerSave(const SaverTotals& totals) {
  std::vector<double> blocked;
  for (const auto& save : totals.saves) blocked.push_back(save.blocked_seconds);
  return blocked;
}

double SteadyBlockedMedian(const SaverTotals& totals) {
  std::vector<double> blocked = BlockedPerSave(totals);
  if (blocked.size() < 2) return 0;
  blocked.erase(blocked.begin());
  return Percentile(blocked, 50);
}

double FirstOverSteadyBlocked(const SaverTotals& totals) {
  const double steady = SteadyBlockedMedian(totals);
  return steady > 0 ? totals.saves.front().blocked_seconds / steady : 0;
}

std::vector<double> MemcpyRuns(const RunSummary& s) {
  std::vector<double> runs;
  for (const auto& [step, seconds] : s.memcpy_seconds_by_step) runs.push_back(seconds);
  return runs;
}

std::vector<double> BlockedOverMemcpyPerSave(const RunSummary& s) {
  std::vector<double> ratios;
  for (const auto& save : s.totals.saves) {
    auto it = s.memcpy_seconds_by_step.find(save.step);
    if (it != s.memcpy_seconds_by_step.end() && it->second > 0) {
      ratios.push_back(save.blocked_seconds / it->second);
    }
  }
  return ratios;
}

std::vector<double> AllStepsMs(const RunSummary& s) {
  std::vector<double> all = s.step_ms_no_save;
  all.insert(all.end(), s.step_ms_save.begin(), s.step_ms_save.end());
  return all;
}

double LoopSecondsLost(const RunSummary& s) {
  const std::vector<double> all = AllStepsMs(s);
  return s.loop_seconds - static_cast<double>(all.size()) * Percentile(all, 50) / 1000;
}

double LoopSecondsLostPerSave(const RunSummary& s) {
  return s.step_ms_save.empty() ? 0
                                : LoopSecondsLost(s) / static_cast<double>(s.step_ms_save.size());
}

std::vector<double> DurablePerSave(const SaverTotals& totals) {
  std::vector<double> durable;
  for (const auto& save : totals.saves) {
    if (save.status.ok()) durable.push_back(save.seconds_to_durable);
  }
  return durable;
}

Result<std::vector<RankFigures>> GatherFigures(Coordinator& coordinator, const RunSummary& s) {
  const std::vector<uint64_t> mine = {s.state_bytes,
                                      DoubleBits(Percentile(BlockedPerSave(s.totals), 50)),
                                      DoubleBits(s.totals.blocked_seconds_max),
                                      DoubleBits(Percentile(MemcpyRuns(s), 50)),
                                      DoubleBits(Percentile(DurablePerSave(s.totals), 50)),
                                      s.restore_bytes_read,
                                      DoubleBits(s.restore_seconds)};
  std::vector<std::vector<uint64_t>> columns;
  for (uint64_t value : mine) {
    ASSIGN_OR_RETURN(auto column, GatherValues(coordinator, value));
    columns.push_back(std::move(column));
  }
  std::vector<RankFigures> figures(columns[0].size());
  for (size_t r = 0; r < figures.size(); ++r) {
    figures[r] = {columns[0][r],
                  BitsDouble(columns[1][r]),
                  BitsDouble(columns[2][r]),
                  BitsDouble(columns[3][r]),
                  BitsDouble(columns[4][r]),
                  columns[5][r],
                  BitsDouble(columns[6][r])};
  }
  return figures;
}

}  // namespace asyncckpt::cli
