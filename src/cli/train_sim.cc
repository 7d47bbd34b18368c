// `asyncckpt train-sim`: a synthetic training job that checkpoints as it goes, resumes from its
// checkpoint directory, and reports what checkpointing cost the training loop.

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/session.h"
#include "asyncckpt/session_creator.h"
#include "asyncckpt/state.h"
#include "src/cli/commands.h"
#include "src/cli/flags.h"
#include "src/cli/json.h"
#include "src/cli/memcpy_yardstick.h"
#include "src/cli/memory_budget.h"
#include "src/cli/naive_saver.h"
#include "src/cli/shard_job.h"
#include "src/cli/sim_model.h"
#include "src/util/status_macros.h"

namespace asyncckpt::cli {

namespace {

using SteadyClock = std::chrono::steady_clock;

const std::vector<FlagSpec>& TrainSimFlags() {
  static const std::vector<FlagSpec> specs = {
      {"steps", "200", "total global steps (a resumed run stops at the same step)"},
      {"model_bytes", "256MiB", "bytes of training state (parameters + optimizer moments)"},
      {"tensors", "8", "number of parameter tensors"},
      {"dtype", "f32", "element type: f32, f64 or bf16"},
      {"optimizer", "adam", "sgd (parameters only) or adam (parameters + two moments)"},
      {"step_ms", "0",
       "extra simulated accelerator time per step, in milliseconds (at most 3600000, one hour)"},
      {"save_steps", "", "save every N steps (default 50 when --save_secs is not given)"},
      {"save_secs", "", "save every N seconds"},
      {"checkpoint_dir", "", "where checkpoints go (default: a new directory under $TMPDIR)"},
      {"max_to_keep", "5", "newest checkpoints kept; 0 keeps all"},
      {"keep_checkpoint_every_n_hours", "0", "also keep one checkpoint every N hours"},
      {"compression", "shuffle+zstd", "none, zstd or shuffle+zstd"},
      {"compression_level", "1", "zstd level"},
      {"chunk_bytes", "4MiB", "chunk size, 4KiB to 1GiB"},
      {"num_data_files", "2", "data files per checkpoint"},
      {"saver", "async",
       "async (background flow graph), sync (saves on the training thread), naive (write + "
       "fsync of one file per tensor on the training thread: the numpy.save baseline) or none "
       "(no checkpointing: the step-time reference)"},
      {"staging_bytes", "0", "async: pinned staging budget (0 = one full snapshot)"},
      {"on_busy", "wait", "async: wait or skip when a save is due and staging is busy"},
      {"on_error", "stop", "async: stop or continue when a background save (model or input) fails"},
      {"background_threads", "0", "async: threads of the background arena (0 = all cores)"},
      {"io", "auto", "I/O backend: auto (io_uring when available), uring or posix"},
      {"queue_depth", "64", "most I/O requests in flight (SaverOptions::queue_depth)"},
      {"o_direct", "true",
       "true: write data files with O_DIRECT where the file system allows; false: buffered"},
      {"seed", "42", "seed of the initial state and the synthetic gradients"},
      {"dataset", "",
       "dataset file (default: <checkpoint_dir>/train-sim-dataset.bin, written if missing)"},
      {"dataset_records", "4096", "records in a generated dataset"},
      {"record_bytes", "64", "bytes per record in a generated dataset"},
      {"batch_size", "32", "records consumed per step"},
      {"shuffle_buffer", "1024", "records in the input's shuffle buffer"},
      {"prefetch", "64", "records read ahead by the input's prefetch thread"},
      {"epochs", "-1", "passes over the dataset (-1 repeats forever); the job ends with the data"},
      {"allow_fresh_start", "",
       "start from step 0 when checkpoint_dir holds checkpoints but no model and input "
       "checkpoint of one step to resume from",
       true},
      {"preempt_at_steps", "",
       "testing: fail the step function with Unavailable once at each of these steps "
       "(comma-separated), as a pre-empted accelerator would; the session recovers from the "
       "newest checkpoint"},
      {"metrics_json", "", "write the summary as one JSON object to this file"},
      {"step_series", "",
       "add every step's time (the first 1000000 steps) to --metrics_json, for timelines", true},
      {"verify", "", "after training, verify every checkpoint the state file lists", true},
      {"quiet", "", "no progress line", true},
      {"shard", "",
       "run as one rank of a job under mpirun (`mpirun -np N asyncckpt train-sim --shard ...`): "
       "each rank holds a slice along dimension 0 of every tensor (uneven when N does not "
       "divide it) and its own input pipeline state (input_worker_<rank>.ckpt), the ranks save "
       "one sharded checkpoint per step, and the final digest is of the global state; needs "
       "--checkpoint_dir (shared by every rank) and a build with ASYNCCKPT_MPI",
       true},
      {"coordination_timeout_secs", "300",
       "with --shard: longest wait for the other ranks, in a collective or a commit"},
      {"memcpy_yardstick", "true",
       "time a plain parallel memcpy of the state just before each save (needs a second copy "
       "of the state in memory)"},
      {"max_memory", "",
       "memory train-sim may plan for (default: what the machine has available, MemAvailable "
       "or the cgroup's limit)"},
  };
  return specs;
}

constexpr char kUsage[] = "asyncckpt train-sim [flags]";

// Everything the flags say, checked.
struct TrainSimConfig {
  SimConfig model;
  int64_t steps = 0;
  double step_ms = 0;
  SaverOptions saver;
  std::string saver_kind;
  std::string metrics_json;
  bool verify = false;
  bool step_series = false;
  bool quiet = false;
  bool memcpy_yardstick = true;
  bool dir_was_given = false;
  std::optional<uint64_t> max_memory;  // --max_memory; unset: what the machine has
  std::string dataset;
  uint64_t dataset_records = 0;
  uint32_t record_bytes = 0;
  size_t batch_size = 0;
  RecordDatasetOptions input;
  bool allow_fresh_start = false;
  std::set<int64_t> preempt_at_steps;
  double coordination_timeout_secs = 300;  // --shard
};

// Longest simulated accelerator time per step: one hour. A step of 1e15 ms would sleep for 30
// million years, and no test or benchmark needs more than seconds.
constexpr double kMaxStepMs = 3600.0 * 1000;
// Smallest chunk: every chunk takes at least one 4 KiB page of pinned staging and, under
// O_DIRECT, starts on a 4 KiB boundary of its data file, so smaller chunks pad each one to 4 KiB
// (--chunk_bytes 1 turned a 64 KiB state into a 66 MB checkpoint).
constexpr uint64_t kMinChunkBytes = 4096;
constexpr uint64_t kMaxChunkBytes = 1ull << 30;
constexpr uint64_t kPageBytes = 4096;

// "--name must be <rule>, got 'text'": the value exactly as the user gave it, never a clamped
// or re-printed one.
Status BadValue(const ParsedFlags& flags, const std::string& name, const std::string& rule,
                const std::string& why = "") {
  return Status::InvalidArgument("--" + name + " must be " + rule + ", got '" + flags.get(name) +
                                 "'" + (why.empty() ? "" : ": " + why));
}

// "37,81" -> {37, 81}; InvalidArgument quoting the flag's value for anything but steps >= 1.
Result<std::set<int64_t>> ParseSteps(const char* flag, const std::string& text) {
  std::set<int64_t> steps;
  if (text.empty()) return steps;
  for (size_t begin = 0;;) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string_view item(text.data() + begin, end - begin);
    int64_t step = 0;
    auto [last, error] = std::from_chars(item.data(), item.data() + item.size(), step);
    if (item.empty() || error != std::errc() || last != item.data() + item.size() || step < 1) {
      const std::string why = " takes steps >= 1 separated by commas; '" + std::string(item) +
                              "' in '" + text + "' is not one";
      return Status::InvalidArgument("--" + std::string(flag) + why);
    }
    steps.insert(step);
    if (end == text.size()) return steps;
    begin = end + 1;
  }
}

std::string RangeRule(int64_t low, int64_t high) {
  if (high == INT64_MAX) return ">= " + std::to_string(low);
  return "in [" + std::to_string(low) + ", " + std::to_string(high) + "]";
}

// An integer flag within [low, high].
Result<int64_t> IntFlag(const ParsedFlags& flags, const std::string& name, int64_t low,
                        int64_t high) {
  ASSIGN_OR_RETURN(int64_t value, flags.get_int(name));
  if (value < low || value > high) return BadValue(flags, name, RangeRule(low, high));
  return value;
}

// A number flag within [low, high] (`rule` says so in words).
Result<double> DoubleFlag(const ParsedFlags& flags, const std::string& name, double low,
                          double high, const std::string& rule) {
  ASSIGN_OR_RETURN(double value, flags.get_double(name));
  if (!(value >= low && value <= high)) return BadValue(flags, name, rule);
  return value;
}

// "--name text", as the user gave it (or the default), for messages.
std::string Given(const ParsedFlags& flags, const std::string& name) {
  return "--" + name + " " + flags.get(name);
}

uint64_t RoundUpToPage(uint64_t bytes) {
  return bytes > UINT64_MAX - kPageBytes ? UINT64_MAX
                                         : (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}

// a * b + c, saturating at UINT64_MAX: --model_bytes may be as large as 16 EB.
uint64_t SaturatingMulAdd(uint64_t a, uint64_t b, uint64_t c) {
  if (b != 0 && a > UINT64_MAX / b) return UINT64_MAX;
  return a * b > UINT64_MAX - c ? UINT64_MAX : a * b + c;
}

// How the model's state splits into tensors and chunks (SimModel's and the writer's rules).
struct StateLayout {
  uint64_t tensors = 0;       // arrays: parameter tensors times slots (3 for Adam)
  uint64_t tensor_bytes = 0;  // bytes of each
  uint64_t chunk_bytes = 0;   // bytes of each full chunk: whole elements, at least one
  uint64_t state() const { return tensors * tensor_bytes; }
  // One snapshot in staging: each chunk on its own 4 KiB pages (the engine's staging rule).
  uint64_t snapshot() const {
    if (tensor_bytes == 0) return 0;
    const uint64_t per_tensor =
        SaturatingMulAdd(tensor_bytes / chunk_bytes, RoundUpToPage(chunk_bytes),
                         RoundUpToPage(tensor_bytes % chunk_bytes));
    return SaturatingMulAdd(tensors, per_tensor, 0);
  }
  uint64_t largest_chunk() const { return RoundUpToPage(std::min(chunk_bytes, tensor_bytes)); }
};

StateLayout LayoutOf(const SimConfig& model, uint64_t chunk_bytes) {
  const uint64_t slots = model.optimizer == Optimizer::kAdam ? 3 : 1;
  const uint64_t elem = DTypeSize(model.dtype);
  StateLayout layout;
  layout.tensors = slots * static_cast<uint64_t>(model.num_tensors);
  layout.tensor_bytes = model.state_bytes / layout.tensors / elem * elem;
  if (model.shard && model.world_size > 1) {
    // This rank's slice: the largest one (rank 0's) when the split is uneven.
    layout.tensor_bytes = SplitDim0(layout.tensor_bytes / elem, 0, model.world_size).size() * elem;
  }
  layout.chunk_bytes = std::max(elem, chunk_bytes / elem * elem);
  return layout;
}

Status CheckModelFlags(const ParsedFlags& flags, TrainSimConfig& config) {
  ASSIGN_OR_RETURN(config.model.state_bytes, flags.get_bytes("model_bytes"));
  ASSIGN_OR_RETURN(int64_t tensors, IntFlag(flags, "tensors", 1, 100000));
  config.model.num_tensors = static_cast<int>(tensors);
  auto dtype = ParseDType(flags.get("dtype"));
  if (!dtype) return Status::InvalidArgument("unknown --dtype '" + flags.get("dtype") + "'");
  config.model.dtype = *dtype;
  const std::string optimizer = flags.get("optimizer");
  if (optimizer == "sgd")
    config.model.optimizer = Optimizer::kSgd;
  else if (optimizer == "adam")
    config.model.optimizer = Optimizer::kAdam;
  else
    return Status::InvalidArgument("--optimizer must be sgd or adam, not '" + optimizer + "'");
  ASSIGN_OR_RETURN(int64_t seed, flags.get_int("seed"));
  config.model.seed = static_cast<uint64_t>(seed);
  const StateLayout layout = LayoutOf(config.model, 1);
  if (layout.tensor_bytes == 0) {
    return Status::InvalidArgument(
        "--model_bytes '" + flags.get("model_bytes") + "' is too small for " +
        std::to_string(layout.tensors) + " tensors (" + Given(flags, "tensors") + ", " +
        Given(flags, "optimizer") + ") of " + flags.get("dtype") + ": at least " +
        std::to_string(layout.tensors * DTypeSize(config.model.dtype)) + " bytes");
  }
  return ValidateSimConfig(config.model);
}

Status CheckSaverFlags(const ParsedFlags& flags, TrainSimConfig& config) {
  SaverOptions& saver = config.saver;
  if (flags.has("save_steps")) {
    ASSIGN_OR_RETURN(saver.save_steps, IntFlag(flags, "save_steps", 1, INT64_MAX));
  }
  if (flags.has("save_secs")) {
    ASSIGN_OR_RETURN(saver.save_secs,
                     DoubleFlag(flags, "save_secs", 1e-9, 1e15, "a positive number of seconds"));
  }
  if (!flags.has("save_steps") && !flags.has("save_secs")) saver.save_steps = 50;
  ASSIGN_OR_RETURN(int64_t max_to_keep, IntFlag(flags, "max_to_keep", 0, INT32_MAX));
  saver.max_to_keep = static_cast<int>(max_to_keep);
  // Model and input checkpoints are one state: retention keeps the pairs together.
  saver.paired_input_basename = InputCheckpointBasename(InputPipelineOptions{});
  ASSIGN_OR_RETURN(saver.keep_checkpoint_every_n_hours,
                   DoubleFlag(flags, "keep_checkpoint_every_n_hours", 0, 1e12, ">= 0"));
  auto compression = ParseCompressionKind(flags.get("compression"));
  if (!compression) {
    return Status::InvalidArgument("--compression must be none, zstd or shuffle+zstd, not '" +
                                   flags.get("compression") + "'");
  }
  saver.compression.kind = *compression;
  ASSIGN_OR_RETURN(int64_t level, IntFlag(flags, "compression_level", -7, 19));
  saver.compression.level = static_cast<int>(level);
  ASSIGN_OR_RETURN(saver.chunk_bytes, flags.get_bytes("chunk_bytes"));
  if (saver.chunk_bytes < kMinChunkBytes) {
    return BadValue(flags, "chunk_bytes", "at least 4KiB",
                    "every chunk takes at least one 4 KiB page of pinned staging and, under "
                    "O_DIRECT, of its data file, so smaller chunks are each padded to 4 KiB and "
                    "multiply the checkpoint's size");
  }
  if (saver.chunk_bytes > kMaxChunkBytes) {
    return BadValue(flags, "chunk_bytes", "at most 1GiB (the format's largest chunk)");
  }
  ASSIGN_OR_RETURN(int64_t files, IntFlag(flags, "num_data_files", 1, 4096));
  saver.num_data_files = static_cast<uint32_t>(files);
  config.saver_kind = flags.get("saver");
  if (config.saver_kind != "sync" && config.saver_kind != "async" && config.saver_kind != "naive" &&
      config.saver_kind != "none") {
    return Status::InvalidArgument("--saver must be async, sync, naive or none, not '" +
                                   config.saver_kind + "'");
  }
  ASSIGN_OR_RETURN(saver.staging_bytes, flags.get_bytes("staging_bytes"));
  const uint64_t largest_chunk = LayoutOf(config.model, saver.chunk_bytes).largest_chunk();
  if (saver.staging_bytes != 0 && saver.staging_bytes < largest_chunk) {
    return BadValue(flags, "staging_bytes",
                    "0 (one snapshot) or at least one chunk in 4 KiB pages, here " +
                        std::to_string(largest_chunk) + " bytes (" + Given(flags, "chunk_bytes") +
                        ")");
  }
  const std::string on_busy = flags.get("on_busy");
  if (on_busy != "wait" && on_busy != "skip") {
    return Status::InvalidArgument("--on_busy must be wait or skip, not '" + on_busy + "'");
  }
  saver.on_busy = on_busy == "skip" ? OnBusy::kSkip : OnBusy::kWait;
  const std::string on_error = flags.get("on_error");
  if (on_error != "stop" && on_error != "continue") {
    return Status::InvalidArgument("--on_error must be stop or continue, not '" + on_error + "'");
  }
  saver.on_error = on_error == "continue" ? OnError::kContinue : OnError::kStop;
  ASSIGN_OR_RETURN(int64_t threads, IntFlag(flags, "background_threads", 0, 1024));
  saver.background_threads = static_cast<unsigned>(threads);
  const std::string io = flags.get("io");
  if (io != "auto" && io != "uring" && io != "posix") {
    return Status::InvalidArgument("--io must be auto, uring or posix, not '" + io + "'");
  }
  saver.force_posix_io = io == "posix";
  ASSIGN_OR_RETURN(int64_t queue_depth, IntFlag(flags, "queue_depth", 1, 4096));
  saver.queue_depth = static_cast<unsigned>(queue_depth);
  ASSIGN_OR_RETURN(saver.use_o_direct, flags.get_bool("o_direct"));
  saver.user_metadata["job"] = "train-sim";
  saver.user_metadata["seed"] = std::to_string(config.model.seed);
  saver.user_metadata["optimizer"] = flags.get("optimizer");
  config.dir_was_given = flags.has("checkpoint_dir");
  saver.checkpoint_dir = flags.get("checkpoint_dir");
  return Status::OK();
}

Status CheckInputFlags(const ParsedFlags& flags, TrainSimConfig& config) {
  config.dataset = flags.get("dataset");
  ASSIGN_OR_RETURN(int64_t records, IntFlag(flags, "dataset_records", 1, int64_t{1} << 40));
  ASSIGN_OR_RETURN(int64_t record_bytes, IntFlag(flags, "record_bytes", 1, 1 << 20));
  ASSIGN_OR_RETURN(int64_t batch, IntFlag(flags, "batch_size", 1, 1 << 20));
  ASSIGN_OR_RETURN(int64_t shuffle, IntFlag(flags, "shuffle_buffer", 1, 1 << 24));
  ASSIGN_OR_RETURN(int64_t prefetch, IntFlag(flags, "prefetch", 1, 1 << 20));
  ASSIGN_OR_RETURN(config.input.epochs, IntFlag(flags, "epochs", -1, int64_t{1} << 40));
  config.dataset_records = static_cast<uint64_t>(records);
  config.record_bytes = static_cast<uint32_t>(record_bytes);
  config.batch_size = static_cast<size_t>(batch);
  config.input.shuffle_buffer = static_cast<size_t>(shuffle);
  config.input.prefetch = static_cast<size_t>(prefetch);
  config.input.seed = config.model.seed;
  config.allow_fresh_start = flags.get_switch("allow_fresh_start");
  ASSIGN_OR_RETURN(config.preempt_at_steps,
                   ParseSteps("preempt_at_steps", flags.get("preempt_at_steps")));
  return Status::OK();
}

// --shard: this process's place in the job.
struct ShardContext {
  int rank = 0;
  int world_size = 1;
};

// Every flag checked, each message quoting the value as given: InvalidArgument (exit 2).
Result<TrainSimConfig> ConfigFromFlags(const ParsedFlags& flags,
                                       const ShardContext* shard = nullptr) {
  TrainSimConfig config;
  if (shard != nullptr) {
    config.model.shard = true;
    config.model.rank = shard->rank;
    config.model.world_size = shard->world_size;
  }
  ASSIGN_OR_RETURN(config.steps, IntFlag(flags, "steps", 0, INT64_MAX));
  RETURN_IF_ERROR(CheckModelFlags(flags, config));
  ASSIGN_OR_RETURN(config.step_ms, DoubleFlag(flags, "step_ms", 0, kMaxStepMs,
                                              "in [0, 3600000] (at most one hour per step)"));
  RETURN_IF_ERROR(CheckSaverFlags(flags, config));
  RETURN_IF_ERROR(CheckInputFlags(flags, config));
  config.metrics_json = flags.get("metrics_json");
  if (config.model.shard) {
    // Rank 0 applies the model's retention: it pairs with rank 0's own input checkpoints.
    InputPipelineOptions input;
    input.num_workers = config.model.world_size;
    input.task_id = config.model.rank;
    config.saver.paired_input_basename = InputCheckpointBasename(input);
    if (!config.dir_was_given) {
      return Status::InvalidArgument(
          "--shard needs --checkpoint_dir: every rank writes into the same directory");
    }
    if (config.saver_kind == "naive") {
      return Status::InvalidArgument(
          "--saver naive has no multi-process form (every rank would write the same files); "
          "--shard takes async, sync or none");
    }
    ASSIGN_OR_RETURN(
        config.coordination_timeout_secs,
        DoubleFlag(flags, "coordination_timeout_secs", 1e-3, 1e9, "a positive number of seconds"));
  }
  config.verify = flags.get_switch("verify");
  config.step_series = flags.get_switch("step_series");
  config.quiet = flags.get_switch("quiet");
  ASSIGN_OR_RETURN(config.memcpy_yardstick, flags.get_bool("memcpy_yardstick"));
  // Without saves there is nothing to hold a memcpy against.
  if (config.saver_kind == "none") config.memcpy_yardstick = false;
  if (flags.has("max_memory")) {
    ASSIGN_OR_RETURN(config.max_memory, flags.get_bytes("max_memory"));
  }
  // The saver's own checks, as a backstop for anything the flags above let through.
  SaverOptions probe = config.saver;
  if (probe.checkpoint_dir.empty()) probe.checkpoint_dir = "/tmp";
  RETURN_IF_ERROR(ValidateSaverOptions(probe));
  return config;
}

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
  return {config.record_bytes, Given(flags, "record_bytes")};
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

// Checks the memory the run will hold against what the machine has (or --max_memory), before
// anything is allocated: InvalidArgument naming the flags as given (exit 2).
Status CheckMemory(const ParsedFlags& flags, const TrainSimConfig& config) {
  const StateLayout layout = LayoutOf(config.model, config.saver.chunk_bytes);
  const uint64_t staging = config.saver_kind != "async"      ? 0
                           : config.saver.staging_bytes != 0 ? config.saver.staging_bytes
                                                             : layout.snapshot();
  const auto [record_bytes, records_from] = DatasetRecordBytes(flags, config);
  // The shuffle buffer and prefetch queue held live, again in the input checkpoint's saved state
  // and again in its staging; and one batch.
  const uint64_t held = config.input.shuffle_buffer + config.input.prefetch + 1;
  const uint64_t input = record_bytes * (3 * held + config.batch_size);
  // Each part names the flags that size it: the state, one snapshot of staging and the
  // yardstick's copy all grow with --model_bytes.
  const std::string model_bytes = Given(flags, "model_bytes");
  const bool explicit_staging = config.saver.staging_bytes != 0;
  const std::vector<MemoryPart> parts = {
      {"state", model_bytes, layout.state()},
      {explicit_staging ? "pinned staging" : "pinned staging of one snapshot",
       explicit_staging ? Given(flags, "staging_bytes") : model_bytes, staging},
      {"memcpy yardstick copy", model_bytes, config.memcpy_yardstick ? layout.state() : 0},
      {"input buffers",
       Given(flags, "shuffle_buffer") + " and " + Given(flags, "prefetch") + " with " +
           records_from,
       input},
  };
  AvailableMemory available = MachineAvailableMemory();
  if (config.max_memory) available = {*config.max_memory, Given(flags, "max_memory")};
  return CheckMemoryFits(
      parts, available,
      MemoryHint(config, layout, TotalBytes({parts[0], parts[3]}), staging, available.bytes));
}

Result<std::string> MakeTempCheckpointDir() {
  std::error_code ec;
  std::string base = std::filesystem::temp_directory_path(ec).string();
  if (ec) base = "/tmp";
  std::string pattern = base + "/asyncckpt-train-sim-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    return Status::IOError("cannot create a checkpoint directory under " + base + ": " +
                           std::strerror(errno));
  }
  return pattern;
}

// Records which steps saved and what each save cost, for the summary.
class SaveRecorder final : public CheckpointSaverListener {
 public:
  void before_save(int64_t step) override {
    std::lock_guard lock(mutex_);
    save_steps_.insert(step);
  }
  bool after_save(int64_t step, const SaveStats& stats) override {
    std::lock_guard lock(mutex_);
    if (!stats.status.ok()) {
      std::fprintf(stderr, "\nasyncckpt: save of step %" PRId64 " failed: %s\n", step,
                   stats.status.ToString().c_str());
    }
    return false;
  }
  bool saved_at(int64_t step) const {
    std::lock_guard lock(mutex_);
    return save_steps_.count(step) != 0;
  }

 private:
  mutable std::mutex mutex_;
  std::set<int64_t> save_steps_;
};

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * values.size()));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// Most steps --step_series keeps: 24 bytes each, so at most 24 MB.
constexpr size_t kMaxSeriesSteps = 1000000;

// One step of the --step_series timeline.
struct StepPoint {
  int64_t step = 0;
  double ms = 0;
  bool saved = false;
};

// One rank's figures of a --shard job.
struct RankFigures {
  uint64_t shard_bytes = 0;
  double blocked_median = 0;
  double blocked_max = 0;
  double memcpy_median = 0;
  double durable_median = 0;
  uint64_t restore_bytes_read = 0;
  double restore_seconds = 0;
};

struct RunSummary {
  int64_t start_step = 0;
  int64_t final_step = 0;
  std::vector<double> step_ms_save;
  std::vector<double> step_ms_no_save;
  std::vector<StepPoint> step_series;  // with --step_series: the first kMaxSeriesSteps steps
  double wall_seconds = 0;
  // The training loop's own wall time, less the yardstick memcpys taken inside it: its steps
  // at the median step time plus what checkpointing cost beyond them.
  double loop_seconds = 0;
  uint64_t peak_rss_bytes = 0;                       // VmHWM at the end
  uint64_t tensors = 0;                              // arrays in the registry
  std::map<int64_t, double> memcpy_seconds_by_step;  // the yardstick taken before each save
  uint64_t digest = 0;
  SaverTotals totals;
  int verified = -1;  // -1: not asked; else the number verified
  uint64_t state_bytes = 0;
  uint64_t input_digest = 0;
  int64_t records_consumed = 0;
  int64_t input_checkpoints = 0;
  int64_t recoveries = 0;
  // --shard: this rank and the job's figures, each rank's in rank order (gathered to every rank).
  int rank = 0;
  int world_size = 1;
  uint64_t restore_bytes_read = 0;
  double restore_seconds = 0;
  std::vector<RankFigures> ranks;
};

// The hook of --saver; null for --saver none.
Result<std::unique_ptr<SessionRunHook>> MakeSaverHook(const TrainSimConfig& config,
                                                      const TensorRegistry* registry,
                                                      SaveRecorder* recorder,
                                                      std::function<SaverTotals()>* totals) {
  if (config.saver_kind == "none") {
    *totals = [] { return SaverTotals{}; };
    return std::unique_ptr<SessionRunHook>();
  }
  if (config.saver_kind == "naive") {
    auto hook = NaiveSaverHook::Create(config.saver, registry, {recorder});
    if (!hook.ok()) return hook.status();
    NaiveSaverHook* raw = hook->get();
    *totals = [raw] { return raw->totals(); };
    return std::unique_ptr<SessionRunHook>(std::move(hook).value());
  }
  if (config.saver_kind == "sync") {
    auto hook = CheckpointSaverHook::Create(config.saver, registry, {recorder});
    if (!hook.ok()) return hook.status();
    CheckpointSaverHook* raw = hook->get();
    *totals = [raw] { return raw->totals(); };
    return std::unique_ptr<SessionRunHook>(std::move(hook).value());
  }
  auto hook = AsyncCheckpointSaverHook::Create(config.saver, registry, {recorder});
  if (!hook.ok()) return hook.status();
  AsyncCheckpointSaverHook* raw = hook->get();
  *totals = [raw] { return raw->totals(); };
  return std::unique_ptr<SessionRunHook>(std::move(hook).value());
}

// The input hook's options: its schedule, retention and codec follow the model saver's.
InputPipelineOptions InputOptions(const TrainSimConfig& config) {
  InputPipelineOptions options;
  options.saver.checkpoint_dir = config.saver.checkpoint_dir;
  options.saver.save_steps = config.saver.save_steps;
  options.saver.save_secs = config.saver.save_secs;
  options.saver.max_to_keep = config.saver.max_to_keep;
  options.saver.compression = config.saver.compression;
  options.saver.chunk_bytes = config.saver.chunk_bytes;
  options.saver.force_posix_io = config.saver.force_posix_io;
  options.saver.on_error = config.saver.on_error;
  options.saver.clock = config.saver.clock;
  options.model_basename = config.saver.basename;
  if (config.model.shard) {
    // TensorFlow's per-worker suffix: each rank saves and restores its own input position.
    options.num_workers = config.model.world_size;
    options.task_type = "worker";
    options.task_id = config.model.rank;
  }
  return options;
}

// Restores the model at the newest step that has both a model and an input checkpoint, at the
// start and after every pre-emption, so that the input hook resumes the input at exactly that
// step. Model checkpoints newer than that (their input checkpoint was still being written when
// the job died) are not used: resuming from one would replay the input from another position.
// Checkpoints without any such pair are an error unless --allow_fresh_start; with no
// checkpoint at all the job starts afresh from step 0 (a re-created session resets the model).
Result<std::unique_ptr<CheckpointSessionCreator>> MakeCreator(const TrainSimConfig& config,
                                                              SimModel* model) {
  CheckpointSessionCreatorOptions options;
  options.checkpoint_dir = config.saver.checkpoint_dir;
  options.model_basename = config.saver.basename;
  options.input_basename = InputCheckpointBasename(InputOptions(config));
  options.allow_fresh_start = config.allow_fresh_start;
  options.init_fn = [model] {
    model->Reset();
    return Status::OK();
  };
  return CheckpointSessionCreator::Create(std::move(options), &model->registry());
}

// --shard: every rank agrees on the step to resume (ShardedSessionCreator). The input pairs
// with the model unless the saver writes no input checkpoints (none, naive: a restore of the
// model alone, on any number of ranks).
Result<std::unique_ptr<ShardedSessionCreator>> MakeShardedCreator(const TrainSimConfig& config,
                                                                  SimModel* model,
                                                                  Coordinator* coordinator) {
  ShardedSessionCreatorOptions options;
  options.checkpoint_dir = config.saver.checkpoint_dir;
  options.model_basename = config.saver.basename;
  if (config.saver_kind == "sync" || config.saver_kind == "async") {
    options.input_basename = InputCheckpointBasename(InputOptions(config));
    options.input_state_file = InputStateFileName(InputOptions(config));
  }
  options.allow_fresh_start = config.allow_fresh_start;
  options.init_fn = [model] {
    model->Reset();
    return Status::OK();
  };
  return ShardedSessionCreator::Create(std::move(options), coordinator, &model->registry());
}

// With a coordinator, rank 0 alone writes a missing dataset, and the others open it after.
Result<std::unique_ptr<RecordDatasetIterator>> OpenInput(TrainSimConfig& config,
                                                         Coordinator* coordinator) {
  if (config.dataset.empty())
    config.dataset = config.saver.checkpoint_dir + "/train-sim-dataset.bin";
  std::error_code ec;
  std::filesystem::create_directories(config.saver.checkpoint_dir, ec);
  Status written;
  if ((coordinator == nullptr || coordinator->rank() == 0) &&
      !std::filesystem::exists(config.dataset, ec)) {
    written = WriteRecordDataset(config.dataset, config.dataset_records, config.record_bytes,
                                 config.model.seed)
                  .WithContext("writing the synthetic dataset");
  }
  if (coordinator != nullptr) {
    ASSIGN_OR_RETURN(auto outcomes, GatherValues(*coordinator, written.ok() ? 0 : 1));
    if (outcomes[0] != 0 && written.ok()) {
      return Status::Unavailable("rank 0 could not write the dataset " + config.dataset);
    }
  }
  RETURN_IF_ERROR(written);
  config.input.path = config.dataset;
  return RecordDatasetIterator::Open(config.input);
}

Result<std::unique_ptr<CheckpointInputPipelineHook>> MakeInputHook(const TrainSimConfig& config,
                                                                   RecordDatasetIterator* input) {
  return CheckpointInputPipelineHook::Create(InputOptions(config), input);
}

uint64_t IteratorDigest(RecordDatasetIterator& input) {
  IteratorState state;
  if (!input.save(&state).ok()) return 0;
  XXH3_state_t* hash = XXH3_createState();
  XXH3_64bits_reset(hash);
  for (const auto& entry : state.entries()) {
    XXH3_64bits_update(hash, entry.bytes.data(), entry.bytes.size());
  }
  const uint64_t digest = XXH3_64bits_digest(hash);
  XXH3_freeState(hash);
  return digest;
}

Status VerifyListed(const std::string& dir, int* verified) {
  ASSIGN_OR_RETURN(CheckpointState state, GetCheckpointState(dir));
  *verified = 0;
  for (const auto& name : state.all_model_checkpoint_paths) {
    ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir + "/" + name));
    VerifyReport report = reader->verify();
    if (!report.problems.empty()) {
      return Status::Corruption(dir + "/" + name + " failed verification: " + report.problems[0]);
    }
    ++*verified;
  }
  return Status::OK();
}

// The process's peak resident set (VmHWM in /proc/self/status); 0 where it cannot be read.
uint64_t PeakRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) << 10;
  }
  return 0;
}

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

// Every rank's figures, in rank order. Collective.
Result<std::vector<RankFigures>> GatherFigures(Coordinator& coordinator, const RunSummary& s) {
  std::vector<double> blocked;
  for (const auto& save : s.totals.saves) blocked.push_back(save.blocked_seconds);
  std::vector<double> memcpys;
  for (const auto& [step, seconds] : s.memcpy_seconds_by_step) memcpys.push_back(seconds);
  std::vector<double> durable;
  for (const auto& save : s.totals.saves) {
    if (save.status.ok()) durable.push_back(save.seconds_to_durable);
  }
  const std::vector<uint64_t> mine = {s.state_bytes,
                                      DoubleBits(Percentile(blocked, 50)),
                                      DoubleBits(s.totals.blocked_seconds_max),
                                      DoubleBits(Percentile(memcpys, 50)),
                                      DoubleBits(Percentile(durable, 50)),
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

// `coordinator`: the job's, with --shard; null for a job of one process.
Status RunTrainSim(TrainSimConfig& config, RunSummary* summary, Coordinator* coordinator) {
  const bool lead = coordinator == nullptr || coordinator->rank() == 0;
  if (coordinator != nullptr) {
    summary->rank = coordinator->rank();
    summary->world_size = coordinator->size();
  }
  if (!config.dir_was_given) {
    ASSIGN_OR_RETURN(config.saver.checkpoint_dir, MakeTempCheckpointDir());
  }
  if (lead) {
    std::fprintf(stderr, "train-sim: checkpoint_dir %s\n", config.saver.checkpoint_dir.c_str());
  }
  ASSIGN_OR_RETURN(auto model, SimModel::Create(config.model));
  const TensorRegistry& registry = model->registry();
  if (coordinator != nullptr) {
    std::fprintf(stderr, "train-sim: rank %d of %d (pid %d) holds %s of the state\n",
                 coordinator->rank(), coordinator->size(), static_cast<int>(getpid()),
                 FormatBytes(double(registry.total_bytes())).c_str());
  }
  if (lead)
    std::fprintf(
        stderr, "train-sim: %zu tensors, %s of state, %s saver, saving every %s\n", registry.size(),
        FormatBytes(double(registry.total_bytes())).c_str(), config.saver_kind.c_str(),
        config.saver.save_steps ? (std::to_string(*config.saver.save_steps) + " steps").c_str()
                                : (std::to_string(*config.saver.save_secs) + " s").c_str());
  summary->state_bytes = registry.total_bytes();
  summary->tensors = registry.size();

  ASSIGN_OR_RETURN(auto input, OpenInput(config, coordinator));
  if (coordinator != nullptr) {
    // The savers of the ranks save one checkpoint together (docs/distributed.md).
    config.saver.coordinator = coordinator;
    config.saver.coordination_timeout_secs = config.coordination_timeout_secs;
  }
  // Every hook's save_secs timer reads the time the step ended, not its own moment inside
  // after_run: otherwise the memcpy or the save before a hook can push it past a trigger the
  // others missed, and model, input and yardstick go on saving at different steps.
  auto step_end = std::make_shared<std::atomic<double>>(SystemClockSeconds());
  config.saver.clock = [step_end] { return step_end->load(); };
  SaveRecorder recorder;
  std::function<SaverTotals()> totals;
  ASSIGN_OR_RETURN(auto hook, MakeSaverHook(config, &registry, &recorder, &totals));
  // The input is checkpointed beside the library's savers only: none saves nothing, and naive
  // stands for a job that saves its tensors and nothing else.
  std::unique_ptr<CheckpointInputPipelineHook> input_hook;
  if (config.saver_kind == "sync" || config.saver_kind == "async") {
    ASSIGN_OR_RETURN(input_hook, MakeInputHook(config, input.get()));
  }
  std::vector<SessionRunHook*> hooks;
  if (hook) hooks.push_back(hook.get());
  if (input_hook) hooks.push_back(input_hook.get());
  std::unique_ptr<MemcpyYardstickHook> yardstick;
  if (config.memcpy_yardstick) {
    ASSIGN_OR_RETURN(yardstick, MemcpyYardstickHook::Create(&registry, config.saver));
    hooks.insert(hooks.begin(), yardstick.get());  // runs just before the saver
  }
  std::unique_ptr<CheckpointSessionCreator> single_creator;
  std::unique_ptr<ShardedSessionCreator> sharded_creator;
  SessionCreator* creator = nullptr;
  if (coordinator != nullptr) {
    ASSIGN_OR_RETURN(sharded_creator, MakeShardedCreator(config, model.get(), coordinator));
    creator = sharded_creator.get();
  } else {
    ASSIGN_OR_RETURN(single_creator, MakeCreator(config, model.get()));
    creator = single_creator.get();
  }
  ASSIGN_OR_RETURN(auto session, MonitoredSession::Create(hooks, creator));
  summary->start_step = session->global_step();
  const std::string restored_from =
      sharded_creator ? sharded_creator->restored_from() : single_creator->restored_from();
  if (sharded_creator) {
    summary->restore_bytes_read = sharded_creator->restore_bytes_read();
    summary->restore_seconds = sharded_creator->restore_seconds();
    if (!restored_from.empty()) {
      std::fprintf(stderr,
                   "train-sim: rank %d restored step %" PRId64 " from %s: read %" PRIu64
                   " bytes in %.3f s\n",
                   coordinator->rank(), summary->start_step, restored_from.c_str(),
                   summary->restore_bytes_read, summary->restore_seconds);
    }
  } else if (!restored_from.empty()) {
    std::fprintf(stderr,
                 "train-sim: resuming at step %" PRId64 " from %s and %s/%s-%" PRId64
                 " (the newest step with both a model and an input checkpoint)\n",
                 summary->start_step, restored_from.c_str(), config.saver.checkpoint_dir.c_str(),
                 InputCheckpointBasename(InputOptions(config)).c_str(), summary->start_step);
  }
  std::vector<uint8_t> batch;
  std::set<int64_t> preempted;  // the --preempt_at_steps already injected

  const auto wall_start = SteadyClock::now();
  auto last_progress = wall_start;
  double yardstick_ms_in_loop = 0;
  Status status;
  while (!session->should_stop() && session->global_step() < config.steps) {
    const auto step_start = SteadyClock::now();
    status = session->run([&](StepContext& ctx) {
      RETURN_IF_ERROR(input->next_batch(config.batch_size, &batch));
      model->Step(ctx.step(), XXH3_64bits(batch.data(), batch.size()));
      if (config.step_ms > 0) {
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(config.step_ms));
      }
      if (coordinator != nullptr && config.saver.save_secs) {
        // One clock for the job: every rank's input hook (and yardstick) then reaches each
        // save_secs trigger at the same step, as the model savers do.
        ASSIGN_OR_RETURN(double now, RankZeroValue(*coordinator, SystemClockSeconds()));
        step_end->store(now);
      } else {
        step_end->store(SystemClockSeconds());
      }
      // After the step's work, which the pre-emption loses: the session must restore it.
      if (config.preempt_at_steps.count(ctx.step()) && preempted.insert(ctx.step()).second) {
        return Status::Unavailable("simulated pre-emption at step " + std::to_string(ctx.step()) +
                                   " (--preempt_at_steps)");
      }
      return Status::OK();
    });
    if (!status.ok()) break;
    double ms = std::chrono::duration<double, std::milli>(SteadyClock::now() - step_start).count();
    // The yardstick is train-sim's own measurement, not a cost of checkpointing.
    if (yardstick) {
      auto it = yardstick->seconds_by_step().find(session->global_step());
      if (it != yardstick->seconds_by_step().end()) {
        ms -= it->second * 1000;
        yardstick_ms_in_loop += it->second * 1000;
      }
    }
    const bool saved = recorder.saved_at(session->global_step());
    (saved ? summary->step_ms_save : summary->step_ms_no_save).push_back(ms);
    if (config.step_series && summary->step_series.size() < kMaxSeriesSteps) {
      summary->step_series.push_back({session->global_step(), ms, saved});
    }
    if (!config.quiet && lead &&
        SteadyClock::now() - last_progress > std::chrono::milliseconds(500)) {
      last_progress = SteadyClock::now();
      const SaverTotals now = totals();
      std::fprintf(
          stderr,
          "\rtrain-sim: step %" PRId64 "/%" PRId64 "  checkpoints %" PRId64 "  blocked %.2fs   ",
          session->global_step(), config.steps, now.saves_committed, now.blocked_seconds_total);
    }
  }
  summary->loop_seconds = std::chrono::duration<double>(SteadyClock::now() - wall_start).count() -
                          yardstick_ms_in_loop / 1000;
  if (status.code() == StatusCode::kOutOfRange) {
    std::fprintf(stderr, "\ntrain-sim: the dataset ended at step %" PRId64 "\n",
                 session->global_step());
    status = Status::OK();
  }
  Status closed = session->close();
  if (!config.quiet && lead) std::fprintf(stderr, "\n");
  if (status.ok()) status = closed;
  RETURN_IF_ERROR(status);
  summary->wall_seconds = std::chrono::duration<double>(SteadyClock::now() - wall_start).count();
  summary->final_step = session->global_step();
  summary->recoveries = session->recoveries();
  summary->totals = totals();
  if (coordinator != nullptr) {
    ASSIGN_OR_RETURN(summary->digest, GlobalDigest(*coordinator, registry));
  } else {
    summary->digest = model->Digest();
  }
  summary->input_digest = IteratorDigest(*input);
  summary->records_consumed = input->records_emitted();
  summary->input_checkpoints = input_hook ? input_hook->saves_committed() : 0;
  if (yardstick) summary->memcpy_seconds_by_step = yardstick->seconds_by_step();
  summary->peak_rss_bytes = PeakRssBytes();
  // naive and none write no checkpoint the reader could verify.
  if (config.verify && input_hook && lead) {
    RETURN_IF_ERROR(VerifyListed(config.saver.checkpoint_dir, &summary->verified));
  }
  if (coordinator != nullptr) {
    ASSIGN_OR_RETURN(summary->ranks, GatherFigures(*coordinator, *summary));
  }
  return Status::OK();
}

// Per-save figures (medians, ratios) come from the saver's window of recent saves
// (kSaverTotalsWindow); totals and maxima from its running totals, exact over every save.
std::vector<double> BlockedPerSave(const SaverTotals& totals) {
  std::vector<double> blocked;
  for (const auto& save : totals.saves) blocked.push_back(save.blocked_seconds);
  return blocked;
}

std::vector<double> MemcpyRuns(const RunSummary& s) {
  std::vector<double> runs;
  for (const auto& [step, seconds] : s.memcpy_seconds_by_step) runs.push_back(seconds);
  return runs;
}

// Each save's blocked time over the memcpy timed just before it (same step); saves without
// one (yardstick off) are left out.
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

// The loop's wall time beyond its steps at their median time: what the saves cost the loop,
// blocked time and slowed steps alike (yardstick memcpys excluded).
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

std::string Hex(uint64_t value) {
  char buffer[20];
  std::snprintf(buffer, sizeof(buffer), "%016" PRIx64, value);
  return buffer;
}

void PrintSummary(const TrainSimConfig& config, const RunSummary& s, uint64_t state_bytes) {
  const SaverTotals& t = s.totals;
  const int64_t saves = t.saves_committed;
  const double save_seconds = t.seconds_to_durable_total;
  std::printf("\n== train-sim summary ==\n");
  std::printf("steps              %" PRId64 " (from step %" PRId64 " to %" PRId64 ") in %.2f s\n",
              s.final_step - s.start_step, s.start_step, s.final_step, s.wall_seconds);
  std::printf("state              %s\n", FormatBytes(double(state_bytes)).c_str());
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
  const double blocked_median = Percentile(BlockedPerSave(t), 50);
  std::printf("blocked by saves   %.3f s total; per save median %.3f s, max %.3f s\n",
              t.blocked_seconds_total, blocked_median, t.blocked_seconds_max);
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
  std::printf("peak RSS           %s (VmHWM)\n", FormatBytes(double(s.peak_rss_bytes)).c_str());
  std::printf("recoveries         %" PRId64 " (sessions re-created after a pre-emption)\n",
              s.recoveries);
  if (s.verified >= 0) std::printf("verified           %d listed checkpoints OK\n", s.verified);
  std::printf("input              %" PRId64 " records consumed, %" PRId64
              " input checkpoints, input_state_digest %s\n",
              s.records_consumed, s.input_checkpoints, Hex(s.input_digest).c_str());
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
  std::printf("final_state_digest %s\n", Hex(s.digest).c_str());
}

Status WriteMetricsJson(const TrainSimConfig& config, const RunSummary& s, uint64_t state_bytes) {
  const SaverTotals& t = s.totals;
  const double save_seconds = t.seconds_to_durable_total;
  JsonWriter json;
  json.begin_object();
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
  json.field("memcpy_yardstick_bytes", config.memcpy_yardstick ? state_bytes : uint64_t{0});
  json.field("io", config.saver.force_posix_io ? "posix" : "auto");
  json.field("queue_depth", static_cast<int64_t>(config.saver.queue_depth));
  json.field("compression", std::string(CompressionKindName(config.saver.compression.kind)));
  json.field("tensors", static_cast<int64_t>(s.tensors));
  json.field("blocked_seconds_total", t.blocked_seconds_total);
  json.field("blocked_seconds_per_save_max", t.blocked_seconds_max);
  json.field("blocked_seconds_per_save_median", Percentile(BlockedPerSave(t), 50));
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
  json.key("saves").begin_array();
  for (const auto& save : t.saves) {
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
  json.end_array();
  json.field("save_throughput_bytes_per_second",
             save_seconds > 0 ? double(t.bytes_raw) / save_seconds : 0.0);
  json.field("verified_checkpoints", static_cast<int64_t>(s.verified));
  json.field("final_state_digest", Hex(s.digest));
  json.field("input_state_digest", Hex(s.input_digest));
  json.field("records_consumed", s.records_consumed);
  json.field("input_checkpoints_committed", s.input_checkpoints);
  if (!s.ranks.empty()) {
    // --shard: the digest above is of the global state; state_bytes and the per-save figures
    // are rank 0's, and every rank's are here.
    json.field("world_size", static_cast<int64_t>(s.world_size));
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
  if (config.step_series) {
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
  json.end_object();
  std::ofstream out(config.metrics_json, std::ios::trunc);
  out << json.str() << '\n';
  out.close();
  if (!out) return Status::IOError("cannot write --metrics_json " + config.metrics_json);
  return Status::OK();
}

}  // namespace

int TrainSimCommand(int argc, char** argv) {
  auto flags = ParseFlags(TrainSimFlags(), argc, argv);
  if (!flags.ok()) {
    if (flags.status().code() == StatusCode::kCancelled) {
      std::fputs(FlagsHelp(kUsage, TrainSimFlags()).c_str(), stdout);
      return kExitOk;
    }
    std::fprintf(stderr, "asyncckpt train-sim: %s\n", flags.status().message().c_str());
    return kExitUsage;
  }
  if (!flags->positional().empty()) {
    std::fprintf(stderr, "asyncckpt train-sim: unexpected argument '%s'\n",
                 flags->positional()[0].c_str());
    return kExitUsage;
  }
  // --shard: MPI starts before the flags are checked, since the checks need the rank and the
  // number of ranks. Every rank checks the same flags, so a bad one fails every rank alike.
  std::unique_ptr<MpiSession> mpi;
  Coordinator* coordinator = nullptr;
  if (flags->get_switch("shard")) {
    auto timeout = flags->get_double("coordination_timeout_secs");
    auto started = MpiSession::Start(timeout.ok() && *timeout > 0 ? *timeout : 300);
    if (!started.ok()) {
      std::fprintf(stderr, "asyncckpt train-sim: %s\n", started.status().message().c_str());
      return started.status().code() == StatusCode::kFailedPrecondition ? kExitUsage : kExitFailed;
    }
    mpi = std::move(started).value();
    coordinator = &mpi->coordinator();
  }
  const bool lead = coordinator == nullptr || coordinator->rank() == 0;
  auto config = [&]() -> Result<TrainSimConfig> {
    if (coordinator == nullptr) return ConfigFromFlags(*flags);
    // The model's checks need the rank and the world size; ConfigFromFlags reads them here.
    ShardContext context{coordinator->rank(), coordinator->size()};
    return ConfigFromFlags(*flags, &context);
  }();
  Status usable = config.ok() ? CheckMemory(*flags, *config) : config.status();
  if (!usable.ok()) {
    if (lead) std::fprintf(stderr, "asyncckpt train-sim: %s\n", usable.message().c_str());
    return kExitUsage;
  }
  RunSummary summary;
  Status status = RunTrainSim(*config, &summary, coordinator);
  const uint64_t state_bytes = summary.state_bytes;
  if (!status.ok()) {
    std::fprintf(stderr, "asyncckpt train-sim: %s%s\n",
                 coordinator ? ("rank " + std::to_string(coordinator->rank()) + ": ").c_str() : "",
                 status.ToString().c_str());
    // The other ranks may be waiting for this one in a collective: end the job.
    if (mpi && coordinator->size() > 1) mpi->Abort(kExitFailed);
    return kExitFailed;
  }
  if (!lead) return kExitOk;
  PrintSummary(*config, summary, state_bytes);
  if (!config->metrics_json.empty()) {
    Status written = WriteMetricsJson(*config, summary, state_bytes);
    if (!written.ok()) {
      std::fprintf(stderr, "asyncckpt train-sim: %s\n", written.message().c_str());
      return kExitFailed;
    }
  }
  return kExitOk;
}

}  // namespace asyncckpt::cli
