// The report of an `asyncckpt train-sim` run: the summary on stdout, block by block, and the
// --metrics_json object, field by field in a fixed order.

#include "src/cli/train_sim_report.h"

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "src/cli/flags.h"
#include "src/cli/json.h"
#include "src/cli/train_sim_gpu.h"

namespace asyncckpt::cli {

namespace {

std::string Hex(uint64_t value) {
  char buffer[20];
  std::snprintf(buffer, sizeof(buffer), "%016" PRIx64, value);
  return buffer;
}

// Steps, state, checkpoints, and the step times with and without a save.
void PrintSteps(const TrainSimConfig& config, const RunSummary& s, uint64_t state_bytes) {
  const SaverTotals& t = s.totals;
  const int64_t saves = t.saves_committed;
  std::printf("steps              %" PRId64 " (from step %" PRId64 " to %" PRId64 ") in %.2f s\n",
              s.final_step - s.start_step, s.start_step, s.final_step, s.wall_seconds);
  std::printf("state              %s", FormatBytes(double(state_bytes)).c_str());
  for (size_t r = 0; r < s.ranks.size(); ++r) {  // --shard: the global state, each rank's share
    std::printf("%s%s", r == 0 ? " in all; per rank " : ", ",
                FormatBytes(double(s.ranks[r].shard_bytes)).c_str());
  }
  std::printf("\n");
  std::printf("checkpoints        %" PRId64 " committed, %" PRId64 " failed, %" PRId64
              " skipped, in %s\n",
              saves, t.saves_failed, t.saves_skipped, config.saver.checkpoint_dir.c_str());
  std::printf(
      "step time          without save p50 %.1f ms p99 %.1f ms | with save p50 %.1f ms "
      "p99 %.1f ms\n",
      Percentile(s.step_ms_no_save, 50), Percentile(s.step_ms_no_save, 99),
      Percentile(s.step_ms_save, 50), Percentile(s.step_ms_save, 99));
  std::printf("step time, all     p50 %.1f ms p99 %.1f ms\n", Percentile(AllStepsMs(s), 50),
              Percentile(AllStepsMs(s), 99));
  std::printf("loop time lost     %.3f s beyond the steps at their median time; %.3f s per save\n",
              LoopSecondsLost(s), LoopSecondsLostPerSave(s));
}

// What the saves cost the training thread, beside the memcpy yardstick, and what they wrote.
void PrintSaveCosts(const RunSummary& s) {
  const SaverTotals& t = s.totals;
  const double save_seconds = t.seconds_to_durable_total;
  const double blocked_median = Percentile(BlockedPerSave(t), 50);
  std::printf("blocked by saves   %.3f s total; per save median %.3f s, max %.3f s\n",
              t.blocked_seconds_total, blocked_median, t.blocked_seconds_max);
  if (t.saves.size() >= 2) {
    std::printf("first save         blocked %.3f s, %.2fx the later saves' median %.3f s\n",
                t.saves.front().blocked_seconds, FirstOverSteadyBlocked(t), SteadyBlockedMedian(t));
  }
  std::printf("saver start-up     %.3f s (engines and staging, outside the saves)\n",
              t.startup_seconds);
  PrintGpuFigures(s);
  const std::vector<double> runs = MemcpyRuns(s);
  const std::vector<double> ratios = BlockedOverMemcpyPerSave(s);
  if (runs.empty()) {
    std::printf("state memcpy       not measured (--memcpy_yardstick=false)\n");
  } else {
    std::printf("state memcpy       %zu runs, each just before a save: median %.3f s, max %.3f s\n",
                runs.size(), Percentile(runs, 50), Percentile(runs, 100));
    std::printf(
        "blocked/memcpy     each save against the memcpy just before it: median %.2f, "
        "max %.2f\n",
        Percentile(ratios, 50), Percentile(ratios, 100));
  }
  std::printf("bytes              %s raw, %s stored, compression ratio %.2f\n",
              FormatBytes(double(t.bytes_raw)).c_str(), FormatBytes(double(t.bytes_stored)).c_str(),
              t.bytes_stored ? double(t.bytes_raw) / double(t.bytes_stored) : 1.0);
  std::printf("save throughput    %.1f MiB/s (raw bytes over time to durable)\n",
              save_seconds > 0 ? double(t.bytes_raw) / save_seconds / (1 << 20) : 0.0);
  if (!t.stale_temporaries_removed.empty()) {
    std::printf("stale temporaries  %zu removed\n", t.stale_temporaries_removed.size());
  }
}

// Memory, recoveries, verification and the input's figures.
void PrintRunFacts(const RunSummary& s) {
  std::printf("peak RSS           %s (VmHWM)\n", FormatBytes(double(s.peak_rss_bytes)).c_str());
  std::printf("recoveries         %" PRId64 " (sessions re-created after a pre-emption)\n",
              s.recoveries);
  if (s.verified >= 0) std::printf("verified           %d listed checkpoints OK\n", s.verified);
  std::printf("input              %" PRId64 " records consumed, %" PRId64
              " input checkpoints, input_state_digest %s\n",
              s.records_consumed, s.input_checkpoints, Hex(s.input_digest).c_str());
}

// --shard: one line per rank.
void PrintRanks(const RunSummary& s) {
  if (!s.ranks.empty()) {
    std::printf(
        "ranks              %d, each holding a dimension-0 slice of every tensor; the "
        "digest below is of the global state\n",
        s.world_size);
    for (size_t r = 0; r < s.ranks.size(); ++r) {
      const RankFigures& f = s.ranks[r];
      std::printf(
          "rank %-3zu           shard %s | blocked per save median %.4f s, max %.4f s | "
          "memcpy of shard median %.4f s | durable median %.3f s | restore read %" PRIu64
          " bytes in %.3f s\n",
          r, FormatBytes(double(f.shard_bytes)).c_str(), f.blocked_median, f.blocked_max,
          f.memcpy_median, f.durable_median, f.restore_bytes_read, f.restore_seconds);
    }
  }
}

// The run: its saver, steps, step times, loop time lost, memory and setup.
void WriteRunFields(JsonWriter& json, const TrainSimConfig& config, const RunSummary& s,
                    uint64_t state_bytes) {
  const SaverTotals& t = s.totals;
  json.field("saver", config.saver_kind);
  json.field("checkpoint_dir", config.saver.checkpoint_dir);
  json.field("start_step", s.start_step);
  json.field("final_step", s.final_step);
  json.field("steps_run", s.final_step - s.start_step);
  json.field("recoveries", s.recoveries);
  json.field("wall_seconds", s.wall_seconds);
  json.field("state_bytes", state_bytes);
  json.field("checkpoints_committed", t.saves_committed);
  json.field("saves_failed", t.saves_failed);
  json.field("saves_skipped", t.saves_skipped);
  json.field("step_ms_p50_without_save", Percentile(s.step_ms_no_save, 50));
  json.field("step_ms_p99_without_save", Percentile(s.step_ms_no_save, 99));
  json.field("step_ms_p50_with_save", Percentile(s.step_ms_save, 50));
  json.field("step_ms_p99_with_save", Percentile(s.step_ms_save, 99));
  json.field("step_ms_p50", Percentile(AllStepsMs(s), 50));
  json.field("step_ms_p99", Percentile(AllStepsMs(s), 99));
  json.field("loop_seconds", s.loop_seconds);
  json.field("saves_in_loop", static_cast<int64_t>(s.step_ms_save.size()));
  json.field("loop_seconds_lost", LoopSecondsLost(s));
  json.field("loop_seconds_lost_per_save", LoopSecondsLostPerSave(s));
  json.field("peak_rss_bytes", s.peak_rss_bytes);
  json.field("memcpy_yardstick_bytes", config.memcpy_yardstick ? s.state_bytes : uint64_t{0});
  json.field("io", config.saver.force_posix_io ? "posix" : "auto");
  json.field("queue_depth", static_cast<int64_t>(config.saver.queue_depth));
  json.field("compression", std::string(CompressionKindName(config.saver.compression.kind)));
  json.field("tensors", static_cast<int64_t>(s.tensors));
}

// What the saves cost and wrote, over every save.
void WriteSaveTotals(JsonWriter& json, const RunSummary& s) {
  const SaverTotals& t = s.totals;
  json.field("blocked_seconds_total", t.blocked_seconds_total);
  json.field("blocked_seconds_per_save_max", t.blocked_seconds_max);
  json.field("blocked_seconds_per_save_median", Percentile(BlockedPerSave(t), 50));
  json.field("first_save_blocked_seconds", t.saves.empty() ? 0.0 : t.saves.front().blocked_seconds);
  json.field("steady_save_blocked_median", SteadyBlockedMedian(t));
  json.field("first_over_steady_blocked", FirstOverSteadyBlocked(t));
  json.field("startup_seconds", t.startup_seconds);
  if (s.d2h_seconds > 0) {
    json.field("d2h_seconds", s.d2h_seconds);
    json.field("loop_lost_per_save_over_d2h", LoopSecondsLostPerSave(s) / s.d2h_seconds);
    json.field("gpu_restore_seconds", s.gpu_restore_seconds);
    json.field("gpu_restore_bit_exact", static_cast<int64_t>(s.gpu_restore_exact));
  }
  json.field("state_memcpy_seconds", Percentile(MemcpyRuns(s), 50));
  json.field("state_memcpy_seconds_max", Percentile(MemcpyRuns(s), 100));
  json.key("state_memcpy_runs").begin_array();
  for (double run : MemcpyRuns(s)) json.value(run);
  json.end_array();
  json.field("blocked_over_memcpy_median", Percentile(BlockedOverMemcpyPerSave(s), 50));
  json.field("blocked_over_memcpy_max", Percentile(BlockedOverMemcpyPerSave(s), 100));
  json.field("bytes_raw", t.bytes_raw);
  json.field("bytes_stored", t.bytes_stored);
  json.field("compression_ratio",
             t.bytes_stored ? double(t.bytes_raw) / double(t.bytes_stored) : 1.0);
  json.field("staging_high_water_bytes", t.staging_high_water_bytes);
  json.field("seconds_to_durable_total", t.seconds_to_durable_total);
  json.field("seconds_to_durable_max", t.seconds_to_durable_max);
  json.field("seconds_to_durable_median", Percentile(DurablePerSave(t), 50));
  json.key("chunks_by_codec").begin_object();
  for (const auto& [k, v] : t.chunks_by_codec) json.field(k, v);
  json.end_object();
}

// One save of the saver's window, with the memcpy timed just before it where there is one.
void WriteSave(JsonWriter& json, const RunSummary& s, const SaveStats& save) {
  json.begin_object();
  json.field("step", save.step);
  json.field("path", save.path);
  json.field("ok", save.status.ok());
  json.field("blocked_seconds", save.blocked_seconds);
  if (auto it = s.memcpy_seconds_by_step.find(save.step); it != s.memcpy_seconds_by_step.end()) {
    json.field("state_memcpy_seconds", it->second);
    json.field("blocked_over_memcpy", it->second > 0 ? save.blocked_seconds / it->second : 0.0);
  }
  json.field("seconds_to_durable", save.seconds_to_durable);
  json.field("bytes_raw", save.bytes_raw);
  json.field("bytes_stored", save.bytes_stored);
  json.field("final_level", static_cast<int64_t>(save.final_level));
  json.field("switched_to_raw", save.switched_to_raw);
  json.key("chunks_by_codec").begin_object();
  for (const auto& [k, v] : save.chunks_by_codec) json.field(k, v);
  json.end_object();
  json.end_object();
}

// The save throughput, verification, and the final state of model and input.
void WriteOutcomeFields(JsonWriter& json, const RunSummary& s) {
  const SaverTotals& t = s.totals;
  const double save_seconds = t.seconds_to_durable_total;
  json.field("save_throughput_bytes_per_second",
             save_seconds > 0 ? double(t.bytes_raw) / save_seconds : 0.0);
  json.field("verified_checkpoints", static_cast<int64_t>(s.verified));
  json.field("final_state_digest", Hex(s.digest));
  json.field("input_state_digest", Hex(s.input_digest));
  json.field("records_consumed", s.records_consumed);
  json.field("input_checkpoints_committed", s.input_checkpoints);
}

// --shard: every rank's figures.
void WriteRanks(JsonWriter& json, const RunSummary& s) {
  if (!s.ranks.empty()) {
    // --shard: the digest and state_bytes above are of the global state; the per-save
    // figures are rank 0's, and every rank's are here.
    json.field("world_size", static_cast<int64_t>(s.world_size));
    json.key("state_bytes_per_rank").begin_array();
    for (const RankFigures& f : s.ranks) json.value(f.shard_bytes);
    json.end_array();
    json.key("ranks").begin_array();
    for (size_t r = 0; r < s.ranks.size(); ++r) {
      const RankFigures& f = s.ranks[r];
      json.begin_object();
      json.field("rank", static_cast<int64_t>(r));
      json.field("shard_bytes", f.shard_bytes);
      json.field("blocked_seconds_per_save_median", f.blocked_median);
      json.field("blocked_seconds_per_save_max", f.blocked_max);
      json.field("shard_memcpy_seconds_median", f.memcpy_median);
      json.field("seconds_to_durable_median", f.durable_median);
      json.field("restore_bytes_read", f.restore_bytes_read);
      json.field("restore_seconds", f.restore_seconds);
      json.end_object();
    }
    json.end_array();
  }
}

// --step_series: the timeline as three parallel arrays.
void WriteStepSeries(JsonWriter& json, const RunSummary& s) {
  json.key("step_series").begin_object();
  json.key("step").begin_array();
  for (const StepPoint& point : s.step_series) json.value(point.step);
  json.end_array();
  json.key("ms").begin_array();
  for (const StepPoint& point : s.step_series) json.value(point.ms);
  json.end_array();
  json.key("saved").begin_array();
  for (const StepPoint& point : s.step_series) json.value(point.saved);
  json.end_array();
  json.end_object();
}

}  // namespace

void PrintSummary(const TrainSimConfig& config, const RunSummary& s, uint64_t state_bytes) {
  std::printf("\n== train-sim summary ==\n");
  PrintSteps(config, s, state_bytes);
  PrintSaveCosts(s);
  PrintRunFacts(s);
  PrintRanks(s);
  std::printf("final_state_digest %s\n", Hex(s.digest).c_str());
}

Status WriteMetricsJson(const TrainSimConfig& config, const RunSummary& s, uint64_t state_bytes) {
  JsonWriter json;
  json.begin_object();
  WriteRunFields(json, config, s, state_bytes);
  WriteSaveTotals(json, s);
  json.key("saves").begin_array();
  for (const auto& save : s.totals.saves) WriteSave(json, s, save);
  json.end_array();
  WriteOutcomeFields(json, s);
  WriteRanks(json, s);
  if (config.step_series) WriteStepSeries(json, s);
  json.end_object();
  std::ofstream out(config.metrics_json, std::ios::trunc);
  out << json.str() << '\n';
  out.close();
  if (!out) return Status::IOError("cannot write --metrics_json " + config.metrics_json);
  return Status::OK();
}

}  // namespace asyncckpt::cli
