#pragma once

// `asyncckpt train-sim`'s flags: the flag table, and their check into one TrainSimConfig, every
// message quoting the value as the user gave it. Also the layout of tensors and chunks that the
// flags imply, which the checks here and the memory plan (train_sim_memory.h) both size from.

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/status.h"
#include "src/cli/flags.h"
#include "src/cli/kill_point.h"
#include "src/cli/sim_model.h"

namespace asyncckpt::cli {

/// The flags `train-sim` accepts, in --help order, with their defaults.
const std::vector<FlagSpec>& TrainSimFlags();

/// The usage line of `train-sim --help`.
inline constexpr char kTrainSimUsage[] = "asyncckpt train-sim [flags]";

/// Everything the flags say, checked.
struct TrainSimConfig {
  /// The model: size, tensors, dtype, optimizer, seed, and with --shard this rank's place.
  SimConfig model;
  /// --steps: the global step the job stops at.
  int64_t steps = 0;
  /// --step_ms: simulated accelerator time per step.
  double step_ms = 0;
  /// The model saver's options; checkpoint_dir is empty until a run makes one (no flag given).
  SaverOptions saver;
  /// --saver: async, sync, naive or none.
  std::string saver_kind;
  /// --metrics_json: where the JSON summary goes ("" for none).
  std::string metrics_json;
  /// --verify.
  bool verify = false;
  /// --step_series.
  bool step_series = false;
  /// --quiet.
  bool quiet = false;
  /// --memcpy_yardstick (false under --saver none).
  bool memcpy_yardstick = true;
  /// --device cuda: the state in GPU memory (GpuModel); false: host memory (SimModel).
  bool cuda = false;
  /// --stream_ordered (with --device cuda): saves return once their copies are enqueued, and
  /// each step's update waits for them on the GPU.
  bool stream_ordered = false;
  /// True when --checkpoint_dir was given.
  bool dir_was_given = false;
  /// --max_memory; unset: what the machine has.
  std::optional<uint64_t> max_memory;
  /// --dataset ("" until a run picks the default path).
  std::string dataset;
  /// --dataset_records of a generated dataset.
  uint64_t dataset_records = 0;
  /// --record_bytes of a generated dataset.
  uint32_t record_bytes = 0;
  /// --batch_size: records consumed per step.
  size_t batch_size = 0;
  /// The input's shuffle, prefetch, epochs and seed (its path is set when the run opens it).
  RecordDatasetOptions input;
  /// --allow_fresh_start.
  bool allow_fresh_start = false;
  /// --preempt_at_steps.
  std::set<int64_t> preempt_at_steps;
  /// --coordination_timeout_secs, with --shard.
  double coordination_timeout_secs = 300;
  /// --kill_at (testing): where one rank's savers kill it.
  std::optional<KillPoint> kill_at;
  /// --end_rank_early (testing): the rank that ends its training early, and the step it ends at.
  std::optional<std::pair<int, int64_t>> end_rank_early;
};

/// --shard: this process's place in the job.
struct ShardContext {
  /// This process's rank.
  int rank = 0;
  /// Processes in the job.
  int world_size = 1;
};

/// Every flag checked, each message quoting the value as given: InvalidArgument (exit 2).
/// `shard` is this rank's place with --shard, null otherwise.
Result<TrainSimConfig> ConfigFromFlags(const ParsedFlags& flags,
                                       const ShardContext* shard = nullptr);

/// "--name text", as the user gave it (or the default), for messages.
std::string GivenFlag(const ParsedFlags& flags, const std::string& name);

/// How the model's state splits into tensors and chunks (SimModel's and the writer's rules).
struct StateLayout {
  /// Arrays: parameter tensors times slots (3 for Adam).
  uint64_t tensors = 0;
  /// Bytes of each.
  uint64_t tensor_bytes = 0;
  /// Bytes of each full chunk: whole elements, at least one.
  uint64_t chunk_bytes = 0;
  /// Bytes of the whole state.
  uint64_t state() const { return tensors * tensor_bytes; }
  /// One snapshot in staging: each chunk on its own 4 KiB pages (the engine's staging rule).
  uint64_t snapshot() const;
  /// The staging the largest chunk takes, in whole 4 KiB pages.
  uint64_t largest_chunk() const;
};

/// The layout of `model`'s state (with --shard, this rank's slice, the largest when the split
/// is uneven) in chunks of at most `chunk_bytes`.
StateLayout LayoutOf(const SimConfig& model, uint64_t chunk_bytes);

}  // namespace asyncckpt::cli
