// The memory plan of `asyncckpt train-sim`: what a run will hold (state, staging, the memcpy
// yardstick's copy, input buffers), sized from its checked flags and held against what the
// machine has, before anything is allocated.

#include "src/cli/train_sim_memory.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "asyncckpt/input_pipeline.h"
#include "src/cli/memory_budget.h"
#include "src/engine/engine.h"

namespace asyncckpt::cli {

namespace {

// The dataset train-sim will read: its record size and where that figure comes from. An
// existing regular file is opened to read its header; otherwise it will be generated from the
// flags.
std::pair<uint64_t, std::string> DatasetRecordBytes(const ParsedFlags& flags,
                                                    const TrainSimConfig& config) {
  std::string path = config.dataset;
  if (path.empty() && config.dir_was_given) {
    path = config.saver.checkpoint_dir + "/train-sim-dataset.bin";
  }
  std::error_code ec;
  if (!path.empty() && std::filesystem::is_regular_file(path, ec)) {
    RecordDatasetOptions probe;
    probe.path = path;
    probe.shuffle_buffer = 1;
    probe.prefetch = 1;
    if (auto dataset = RecordDatasetIterator::Open(probe); dataset.ok()) {
      return {(*dataset)->record_bytes(),
              "records of " + std::to_string((*dataset)->record_bytes()) + " bytes in " + path};
    }
  }
  return {config.record_bytes, GivenFlag(flags, "record_bytes")};
}

// A staging budget that would fit in `room`, as a flag value (whole MiB, at most the snapshot);
// empty when not even the largest chunk fits.
std::string StagingThatFits(uint64_t room, const StateLayout& layout) {
  const uint64_t budget = std::min(room, layout.snapshot()) / (1 << 20) * (1 << 20);
  if (budget == 0 || budget < layout.largest_chunk()) return "";
  return std::to_string(budget >> 20) + "MiB";
}

// How to make the plan fit, when dropping the yardstick or staging less would.
std::string MemoryHint(const TrainSimConfig& config, const StateLayout& layout, uint64_t fixed,
                       uint64_t staging, uint64_t available) {
  if (fixed > available) return "the state and the input buffers alone need more than that";
  const uint64_t room = available - fixed;
  const uint64_t yardstick = config.memcpy_yardstick ? layout.state() : 0;
  if (yardstick != 0 && staging <= room) return "--memcpy_yardstick false would make it fit";
  if (config.saver_kind != "async") return "";
  if (yardstick <= room) {
    const std::string fits = StagingThatFits(room - yardstick, layout);
    if (!fits.empty()) return "--staging_bytes " + fits + " would make it fit";
  }
  const std::string fits = StagingThatFits(room, layout);
  if (yardstick != 0 && !fits.empty()) {
    return "--memcpy_yardstick false and --staging_bytes " + fits + " would make it fit";
  }
  return "";
}

// The saver's pinned staging, by the savers' own rule (StagingBudget).
uint64_t PlannedStaging(const TrainSimConfig& config, const StateLayout& layout) {
  if (config.saver_kind != "async" && config.saver_kind != "sync") return 0;
  const SaveMode mode =
      config.saver_kind == "async" ? SaveMode::kAsynchronous : SaveMode::kSynchronous;
  const Result<uint64_t> budget =
      StagingBudget(StagingNeed{layout.snapshot(), layout.largest_chunk()}, config.saver, mode);
  // The flags held staging_bytes to one chunk already (ConfigFromFlags).
  return budget.ok() ? *budget : config.saver.staging_bytes;
}

// The parts of the plan, each naming the flags that size it: the state, one snapshot of staging
// and the yardstick's copy all grow with --model_bytes.
std::vector<MemoryPart> PlannedParts(const ParsedFlags& flags, const TrainSimConfig& config,
                                     const StateLayout& layout, uint64_t staging) {
  const auto [record_bytes, records_from] = DatasetRecordBytes(flags, config);
  // The shuffle buffer and prefetch queue held live, again in the input checkpoint's saved state
  // and again in its staging; and one batch.
  const uint64_t held = config.input.shuffle_buffer + config.input.prefetch + 1;
  const uint64_t input = record_bytes * (3 * held + config.batch_size);
  const std::string model_bytes = GivenFlag(flags, "model_bytes");
  const bool explicit_staging = config.saver.staging_bytes != 0;
  return {
      {"state", model_bytes, layout.state()},
      {explicit_staging || config.saver_kind == "sync" ? "pinned staging"
                                                       : "pinned staging of one snapshot",
       explicit_staging || config.saver_kind == "sync" ? GivenFlag(flags, "staging_bytes")
                                                       : model_bytes,
       staging},
      {"memcpy yardstick copy", model_bytes, config.memcpy_yardstick ? layout.state() : 0},
      {"input buffers",
       GivenFlag(flags, "shuffle_buffer") + " and " + GivenFlag(flags, "prefetch") + " with " +
           records_from,
       input},
  };
}

}  // namespace

Status CheckTrainSimMemory(const ParsedFlags& flags, const TrainSimConfig& config) {
  const StateLayout layout = LayoutOf(config.model, config.saver.chunk_bytes);
  const uint64_t staging = PlannedStaging(config, layout);
  const std::vector<MemoryPart> parts = PlannedParts(flags, config, layout, staging);
  AvailableMemory available = MachineAvailableMemory();
  if (config.max_memory) available = {*config.max_memory, GivenFlag(flags, "max_memory")};
  return CheckMemoryFits(
      parts, available,
      MemoryHint(config, layout, TotalBytes({parts[0], parts[3]}), staging, available.bytes));
}

}  // namespace asyncckpt::cli
