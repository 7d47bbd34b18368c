// `asyncckpt train-sim`'s flag table and the checks that turn parsed flags into a TrainSimConfig.
// Every message quotes the value exactly as the user gave it.

#include "src/cli/train_sim_flags.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "src/engine/engine.h"
#include "src/util/status_macros.h"

namespace asyncckpt::cli {

// Defaults that the library has are read from it (SaverOptions, CompressionOptions,
// RecordDatasetOptions, kDefaultQueueDepth), so that each is written once.
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
      {"max_to_keep", std::to_string(SaverOptions{}.max_to_keep),
       "newest checkpoints kept; 0 keeps all"},
      {"keep_checkpoint_every_n_hours", "0", "also keep one checkpoint every N hours"},
      {"keep_period", "0", "also keep every checkpoint whose step is a multiple of N (Orbax's)"},
      {"compression", std::string(CompressionKindName(CompressionOptions{}.kind)),
       "none, zstd or shuffle+zstd"},
      {"compression_level", std::to_string(CompressionOptions{}.level), "zstd level"},
      {"chunk_bytes", "4MiB", "chunk size, 4KiB to 1GiB"},
      {"num_data_files", std::to_string(SaverOptions{}.num_data_files),
       "data files per checkpoint"},
      {"saver", "async",
       "async (background flow graph), sync (saves on the training thread), naive (write + "
       "fsync of one file per tensor on the training thread: the numpy.save baseline) or none "
       "(no checkpointing: the step-time reference)"},
      {"staging_bytes", "0",
       "pinned staging budget (0 = one full snapshot for async, a " +
           std::to_string(kSynchronousStagingBytes >> 20) + " MiB window for sync)"},
      {"on_busy", "wait", "async: wait or skip when a save is due and staging is busy"},
      {"on_error", "stop", "async: stop or continue when a background save (model or input) fails"},
      {"background_threads", "0", "async: threads of the background arena (0 = all cores)"},
      {"io", "auto", "I/O backend: auto (io_uring when available), uring or posix"},
      {"queue_depth", std::to_string(kDefaultQueueDepth),
       "most I/O requests in flight (SaverOptions::queue_depth)"},
      {"o_direct", "true",
       "true: write data files with O_DIRECT where the file system allows; false: buffered"},
      {"seed", "42", "seed of the initial state and the synthetic gradients"},
      {"dataset", "",
       "dataset file (default: <checkpoint_dir>/train-sim-dataset.bin, written if missing)"},
      {"dataset_records", "4096", "records in a generated dataset"},
      {"record_bytes", "64", "bytes per record in a generated dataset"},
      {"batch_size", "32", "records consumed per step"},
      {"shuffle_buffer", std::to_string(RecordDatasetOptions{}.shuffle_buffer),
       "records in the input's shuffle buffer"},
      {"prefetch", std::to_string(RecordDatasetOptions{}.prefetch),
       "records read ahead by the input's prefetch thread"},
      {"epochs", "-1", "passes over the dataset (-1 repeats forever); the job ends with the data"},
      {"allow_fresh_start", "",
       "start from step 0 when checkpoint_dir holds checkpoints but no model and input "
       "checkpoint of one step to resume from",
       true},
      {"preempt_at_steps", "",
       "testing: fail the step function with Unavailable once at each of these steps "
       "(comma-separated), as a pre-empted accelerator would; the session recovers from the "
       "newest checkpoint"},
      {"kill_at", "",
       "testing: <rank>:<rename|remove|create>:<name prefix> SIGKILLs that rank just before the "
       "first such operation of its savers on a file or directory whose name starts with the "
       "prefix (e.g. 0:rename:model.ckpt-20 kills rank 0 as it commits model.ckpt-20), as a "
       "crash there would"},
      {"end_rank_early", "",
       "testing: <rank>:<step> makes that rank end its training after that step while the others "
       "go on, as a rank whose loop stopped on its own would; the others' next save fails at "
       "once naming it"},
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
      {"device", "host",
       "where the state lives: host, or cuda (GPU memory of cuda:0; f32, no --shard; the "
       "memcpy yardstick becomes one device-to-host copy of the state)"},
      {"stream_ordered", "",
       "with --device cuda and --saver async: stream-ordered saves, each step's update waiting "
       "on the GPU for the snapshot's copies",
       true},
      {"memcpy_yardstick", "true",
       "time a plain parallel memcpy of the state just before each save (needs a second copy "
       "of the state in memory)"},
      {"max_memory", "",
       "memory train-sim may plan for (default: what the machine has available, MemAvailable "
       "or the cgroup's limit)"},
  };
  return specs;
}

namespace {

// Longest simulated accelerator time per step: one hour. A step of 1e15 ms would sleep for 30
// million years, and no test or benchmark needs more than seconds.
constexpr double kMaxStepMs = 3600.0 * 1000;
// The page every chunk's staging and, under O_DIRECT, its place in a data file is rounded to (the
// reason for kMinChunkBytes: --chunk_bytes 1 turned a 64 KiB state into a 66 MB checkpoint).
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

uint64_t RoundUpToPage(uint64_t bytes) {
  return bytes > UINT64_MAX - kPageBytes ? UINT64_MAX
                                         : (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}

// a * b + c, saturating at UINT64_MAX: --model_bytes may be as large as 16 EB.
uint64_t SaturatingMulAdd(uint64_t a, uint64_t b, uint64_t c) {
  if (b != 0 && a > UINT64_MAX / b) return UINT64_MAX;
  return a * b > UINT64_MAX - c ? UINT64_MAX : a * b + c;
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
        std::to_string(layout.tensors) + " tensors (" + GivenFlag(flags, "tensors") + ", " +
        GivenFlag(flags, "optimizer") + ") of " + flags.get("dtype") + ": at least " +
        std::to_string(layout.tensors * DTypeSize(config.model.dtype)) + " bytes");
  }
  return ValidateSimConfig(config.model);
}

// When to save and what to keep.
Status CheckScheduleFlags(const ParsedFlags& flags, SaverOptions& saver) {
  if (flags.has("save_steps")) {
    ASSIGN_OR_RETURN(saver.save_steps, IntFlag(flags, "save_steps", 1, INT64_MAX));
  }
  if (flags.has("save_secs")) {
    ASSIGN_OR_RETURN(saver.save_secs, DoubleFlag(flags, "save_secs", std::nextafter(0.0, 1.0), 1e15,
                                                 "a positive number of seconds, at most 1e15"));
  }
  if (!flags.has("save_steps") && !flags.has("save_secs")) saver.save_steps = 50;
  ASSIGN_OR_RETURN(int64_t max_to_keep, IntFlag(flags, "max_to_keep", 0, INT32_MAX));
  saver.max_to_keep = static_cast<int>(max_to_keep);
  // Model and input checkpoints are one state: retention keeps the pairs together.
  saver.paired_input_basename = InputCheckpointBasename(InputPipelineOptions{});
  ASSIGN_OR_RETURN(saver.keep_checkpoint_every_n_hours,
                   DoubleFlag(flags, "keep_checkpoint_every_n_hours", 0, 1e12, ">= 0"));
  ASSIGN_OR_RETURN(int64_t keep_period, IntFlag(flags, "keep_period", 0, INT32_MAX));
  saver.keep_period = static_cast<int>(keep_period);
  return Status::OK();
}

// How a checkpoint is encoded and laid out in files.
Status CheckFormatFlags(const ParsedFlags& flags, SaverOptions& saver) {
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
  ASSIGN_OR_RETURN(int64_t files, IntFlag(flags, "num_data_files", 1, kMaxNumDataFiles));
  saver.num_data_files = static_cast<uint32_t>(files);
  return Status::OK();
}

// Which saver runs, and how the asynchronous one stages and reacts to being busy or failing.
Status CheckSaverKindFlags(const ParsedFlags& flags, TrainSimConfig& config) {
  SaverOptions& saver = config.saver;
  config.saver_kind = flags.get("saver");
  if (config.saver_kind != "sync" && config.saver_kind != "async" && config.saver_kind != "naive" &&
      config.saver_kind != "none") {
    return Status::InvalidArgument("--saver must be async, sync, naive or none, not '" +
                                   config.saver_kind + "'");
  }
  ASSIGN_OR_RETURN(saver.staging_bytes, flags.get_bytes("staging_bytes"));
  const StateLayout layout = LayoutOf(config.model, saver.chunk_bytes);
  const uint64_t largest_chunk = layout.largest_chunk();
  // The savers' own rule says whether the budget holds a chunk; the message names the flags.
  if (!StagingBudget({layout.snapshot(), largest_chunk}, saver, SaveMode::kAsynchronous).ok()) {
    return BadValue(flags, "staging_bytes",
                    "0 (one snapshot) or at least one chunk in 4 KiB pages, here " +
                        std::to_string(largest_chunk) + " bytes (" +
                        GivenFlag(flags, "chunk_bytes") + ")");
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
  ASSIGN_OR_RETURN(int64_t threads, IntFlag(flags, "background_threads", 0, kMaxBackgroundThreads));
  saver.background_threads = static_cast<unsigned>(threads);
  return Status::OK();
}

// The I/O backend, the checkpoint's metadata and its directory.
Status CheckIoFlags(const ParsedFlags& flags, TrainSimConfig& config) {
  SaverOptions& saver = config.saver;
  const std::string io = flags.get("io");
  if (io != "auto" && io != "uring" && io != "posix") {
    return Status::InvalidArgument("--io must be auto, uring or posix, not '" + io + "'");
  }
  saver.force_posix_io = io == "posix";
  ASSIGN_OR_RETURN(int64_t queue_depth, IntFlag(flags, "queue_depth", 1, kMaxQueueDepth));
  saver.queue_depth = static_cast<unsigned>(queue_depth);
  ASSIGN_OR_RETURN(saver.use_o_direct, flags.get_bool("o_direct"));
  saver.user_metadata["job"] = "train-sim";
  saver.user_metadata["seed"] = std::to_string(config.model.seed);
  saver.user_metadata["optimizer"] = flags.get("optimizer");
  config.dir_was_given = flags.has("checkpoint_dir");
  saver.checkpoint_dir = flags.get("checkpoint_dir");
  return Status::OK();
}

Status CheckSaverFlags(const ParsedFlags& flags, TrainSimConfig& config) {
  RETURN_IF_ERROR(CheckScheduleFlags(flags, config.saver));
  RETURN_IF_ERROR(CheckFormatFlags(flags, config.saver));
  RETURN_IF_ERROR(CheckSaverKindFlags(flags, config));
  return CheckIoFlags(flags, config);
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
  config.saver.allow_fresh_start = config.allow_fresh_start;
  if (flags.has("preempt_at_steps") && flags.get("preempt_at_steps").empty()) {
    return BadValue(flags, "preempt_at_steps", "steps >= 1 separated by commas",
                    "it is empty; leave the flag out for no pre-emption");
  }
  ASSIGN_OR_RETURN(config.preempt_at_steps,
                   ParseSteps("preempt_at_steps", flags.get("preempt_at_steps")));
  if (!config.preempt_at_steps.empty() && *config.preempt_at_steps.rbegin() > config.steps) {
    return BadValue(
        flags, "preempt_at_steps", "steps in [1, --steps " + std::to_string(config.steps) + "]",
        "step " + std::to_string(*config.preempt_at_steps.rbegin()) + " is never reached");
  }
  return Status::OK();
}

// --shard: the pairing of retention with this rank's input, and what a job of ranks needs.
Status CheckShardFlags(const ParsedFlags& flags, TrainSimConfig& config) {
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
  return Status::OK();
}

// --kill_at: a rank of this job (0 without --shard), or the flag would never fire.
Status CheckKillFlag(const ParsedFlags& flags, TrainSimConfig& config) {
  if (!flags.has("kill_at")) return Status::OK();
  ASSIGN_OR_RETURN(config.kill_at, ParseKillPoint(flags.get("kill_at")));
  const int ranks = config.model.shard ? config.model.world_size : 1;
  if (config.kill_at->rank >= ranks) {
    return BadValue(flags, "kill_at", "of a rank below " + std::to_string(ranks),
                    "this job has " + std::to_string(ranks) + " rank(s)");
  }
  return Status::OK();
}

// --end_rank_early <rank>:<step>: a rank of this job and a step it reaches.
Status CheckEndRankEarlyFlag(const ParsedFlags& flags, TrainSimConfig& config) {
  if (!flags.has("end_rank_early")) return Status::OK();
  const std::string text = flags.get("end_rank_early");
  const size_t colon = text.find(':');
  int rank = -1;
  int64_t step = 0;
  const char* end = text.data() + text.size();
  const bool parsed =
      colon != std::string::npos &&
      std::from_chars(text.data(), text.data() + colon, rank).ptr == text.data() + colon &&
      std::from_chars(text.data() + colon + 1, end, step).ptr == end;
  const int ranks = config.model.shard ? config.model.world_size : 1;
  if (!parsed || rank < 0 || rank >= ranks || step < 1 || step >= config.steps) {
    return BadValue(
        flags, "end_rank_early",
        "<rank>:<step> with a rank below " + std::to_string(ranks) + " and a step in [1, --steps)",
        "");
  }
  config.end_rank_early = std::make_pair(rank, step);
  return Status::OK();
}

// What the run measures and reports, and the memory it may plan for.
Status CheckReportFlags(const ParsedFlags& flags, TrainSimConfig& config) {
  config.verify = flags.get_switch("verify");
  config.step_series = flags.get_switch("step_series");
  config.quiet = flags.get_switch("quiet");
  ASSIGN_OR_RETURN(config.memcpy_yardstick, flags.get_bool("memcpy_yardstick"));
  // Without saves there is nothing to hold a memcpy against.
  if (config.saver_kind == "none") config.memcpy_yardstick = false;
  if (flags.has("max_memory")) {
    ASSIGN_OR_RETURN(config.max_memory, flags.get_bytes("max_memory"));
  }
  return Status::OK();
}

// Where the state lives, and stream-ordered saves of GPU state.
Status CheckDeviceFlags(const ParsedFlags& flags, TrainSimConfig& config) {
  const std::string device = flags.get("device");
  if (device != "host" && device != "cuda") {
    return BadValue(flags, "device", "host or cuda");
  }
  config.cuda = device == "cuda";
  config.stream_ordered = flags.get_switch("stream_ordered");
  if (config.stream_ordered && (!config.cuda || config.saver_kind != "async")) {
    return Status::InvalidArgument("--stream_ordered needs --device cuda and --saver async");
  }
  if (config.cuda) {
    if (config.model.shard) return Status::InvalidArgument("--device cuda has no --shard");
    if (config.saver_kind == "naive") {
      return Status::InvalidArgument("--saver naive reads host memory; not with --device cuda");
    }
    config.memcpy_yardstick = false;  // the state is not in host memory: GpuModel::d2h_seconds
    config.saver.cuda_stream_ordered = config.stream_ordered;
    config.saver.cuda_defer_compute_wait = config.stream_ordered;
  }
  return Status::OK();
}

}  // namespace

Result<TrainSimConfig> ConfigFromFlags(const ParsedFlags& flags, const ShardContext* shard) {
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
    RETURN_IF_ERROR(CheckShardFlags(flags, config));
  }
  RETURN_IF_ERROR(CheckKillFlag(flags, config));
  RETURN_IF_ERROR(CheckEndRankEarlyFlag(flags, config));
  RETURN_IF_ERROR(CheckReportFlags(flags, config));
  RETURN_IF_ERROR(CheckDeviceFlags(flags, config));
  // The saver's own checks, as a backstop for anything the flags above let through.
  SaverOptions probe = config.saver;
  if (probe.checkpoint_dir.empty()) probe.checkpoint_dir = "/tmp";
  RETURN_IF_ERROR(ValidateSaverOptions(probe));
  return config;
}

std::string GivenFlag(const ParsedFlags& flags, const std::string& name) {
  return "--" + name + " " + flags.get(name);
}

uint64_t StateLayout::snapshot() const {
  if (tensor_bytes == 0) return 0;
  const uint64_t per_tensor =
      SaturatingMulAdd(tensor_bytes / chunk_bytes, RoundUpToPage(chunk_bytes),
                       RoundUpToPage(tensor_bytes % chunk_bytes));
  return SaturatingMulAdd(tensors, per_tensor, 0);
}

uint64_t StateLayout::largest_chunk() const {
  return RoundUpToPage(std::min(chunk_bytes, tensor_bytes));
}

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

}  // namespace asyncckpt::cli
