#include "src/saver/saver_common.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "asyncckpt/state.h"
#include "src/saver/coordination.h"
#include "src/state/checkpoint_validator.h"
#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

Status ValidateSaverOptions(const SaverOptions& options) {
  if (options.checkpoint_dir.empty()) {
    return Status::InvalidArgument("checkpoint_dir must be set");
  }
  if (options.save_steps.has_value() == options.save_secs.has_value()) {
    return Status::InvalidArgument("Exactly one of save_steps or save_secs should be set.");
  }
  if (options.save_steps && *options.save_steps <= 0) {
    return Status::InvalidArgument("save_steps must be positive, got " +
                                   std::to_string(*options.save_steps));
  }
  if (options.save_secs && (!(*options.save_secs > 0) || std::isinf(*options.save_secs))) {
    return Status::InvalidArgument("save_secs must be positive and finite, got " +
                                   std::to_string(*options.save_secs));
  }
  RETURN_IF_ERROR(ValidateCheckpointName(options.basename + "-0")
                      .WithContext("basename '" + options.basename + "' is not a plain file name"));
  if (options.max_to_keep < 0) {
    return Status::InvalidArgument("max_to_keep must be >= 0 (0 keeps all), got " +
                                   std::to_string(options.max_to_keep));
  }
  if (!options.paired_input_basename.empty()) {
    RETURN_IF_ERROR(ValidateCheckpointName(options.paired_input_basename + "-0")
                        .WithContext("paired_input_basename '" + options.paired_input_basename +
                                     "' is not a plain file name"));
    if (options.paired_input_basename == options.basename) {
      return Status::InvalidArgument("paired_input_basename '" + options.paired_input_basename +
                                     "' must differ from basename");
    }
  }
  if (!(options.keep_checkpoint_every_n_hours >= 0)) {
    return Status::InvalidArgument("keep_checkpoint_every_n_hours must be >= 0");
  }
  if (options.chunk_bytes < kMinChunkBytes || options.chunk_bytes > kMaxChunkBytes) {
    return Status::InvalidArgument(
        "chunk_bytes must be in [" + std::to_string(kMinChunkBytes) + ", " +
        std::to_string(kMaxChunkBytes) + "] (4 KiB to 1 GiB), got " +
        std::to_string(options.chunk_bytes) +
        ": every chunk takes at least one 4 KiB page of pinned staging and, under O_DIRECT, of "
        "its data file, so smaller chunks would each be padded to 4 KiB");
  }
  if (options.num_data_files == 0 || options.num_data_files > kMaxNumDataFiles) {
    return Status::InvalidArgument("num_data_files must be in [1, " +
                                   std::to_string(kMaxNumDataFiles) + "], got " +
                                   std::to_string(options.num_data_files));
  }
  RETURN_IF_ERROR(ValidateQueueDepth(options.queue_depth));
  if (options.background_threads > kMaxBackgroundThreads) {
    return Status::InvalidArgument(
        "background_threads must be <= " + std::to_string(kMaxBackgroundThreads) + ", got " +
        std::to_string(options.background_threads));
  }
  if (!options.clock) return Status::InvalidArgument("clock must be set");
  if (!(options.coordination_timeout_secs > 0) ||
      !std::isfinite(options.coordination_timeout_secs)) {
    return Status::InvalidArgument(
        "coordination_timeout_secs must be a positive number of "
        "seconds, got " +
        std::to_string(options.coordination_timeout_secs));
  }
  if (options.coordinator != nullptr) {
    const int rank = options.coordinator->rank();
    const int size = options.coordinator->size();
    if (size < 1 || rank < 0 || rank >= size) {
      return Status::InvalidArgument("coordinator says rank " + std::to_string(rank) + " of " +
                                     std::to_string(size) + " processes");
    }
    if (size > 1 && options.on_busy == OnBusy::kSkip) {
      // A save skipped on one rank would leave the others' parts waiting for it: the save of
      // that step would fail on every rank.
      return Status::InvalidArgument(
          "on_busy kSkip is not supported in a multi-process job (" + std::to_string(size) +
          " processes): a save skipped by one rank fails on all; use OnBusy::kWait");
    }
  }
  return ValidateCompressionOptions(options.compression);
}

Result<SaveSchedule> SaveSchedule::Create(const SaverOptions& options) {
  ASSIGN_OR_RETURN(SecondOrStepTimer timer,
                   SecondOrStepTimer::Create(options.save_steps, options.save_secs, options.clock));
  Coordinator* agree_with = nullptr;
  if (options.save_secs && options.coordinator != nullptr && options.coordinator->size() > 1) {
    agree_with = options.coordinator;
  }
  return SaveSchedule(std::move(timer), agree_with);
}

Result<bool> SaveSchedule::due_everywhere(int64_t step) {
  if (agree_with_ == nullptr) return due(step);
  // Only rank 0 reads its clock; what the others' would say does not matter.
  return AgreeOnSaveDue(*agree_with_, agree_with_->rank() == 0 && due(step));
}

namespace {
bool MultiProcess(const SaverOptions& options) {
  return options.coordinator != nullptr && options.coordinator->size() > 1;
}
}  // namespace

Result<SaverStart> StartSaver(const SaverOptions& options, const TensorRegistry& registry,
                              SaverStorage* storage) {
  SaverStart start;
  if (!MultiProcess(options)) {
    ASSIGN_OR_RETURN(start.removed, storage->Start(options));
    return start;
  }
  Coordinator& coordinator = *options.coordinator;
  ASSIGN_OR_RETURN(start.job_token, AgreeOnJobToken(coordinator, [&]() -> Status {
                     ASSIGN_OR_RETURN(start.removed, storage->Start(options));
                     return Status::OK();
                   }));
  const Status attached = coordinator.rank() == 0 ? Status::OK() : storage->Attach(options);
  ASSIGN_OR_RETURN(TensorRegistry written, AgreeOnWriters(coordinator, registry, attached));
  start.written = std::make_unique<TensorRegistry>(std::move(written));
  return start;
}

Status AgreeStarted(const SaverOptions& options, const Status& local) {
  if (!MultiProcess(options)) return local;
  Coordinator& coordinator = *options.coordinator;
  return AgreeOnStatus(coordinator, local);
}

namespace {

// Runs a callable when the scope ends, however it ends.
template <typename F>
class ScopeExit {
 public:
  explicit ScopeExit(F f) : f_(std::move(f)) {}
  ~ScopeExit() { f_(); }
  ScopeExit(const ScopeExit&) = delete;
  ScopeExit& operator=(const ScopeExit&) = delete;

 private:
  F f_;
};

Status LockDirectory(io::FileSystem& fs, const SaverOptions& options,
                     const std::string& state_file_name, std::unique_ptr<io::FileLock>* lock) {
  const std::string path =
      JoinCheckpointPath(options.checkpoint_dir, DirectoryLockFileName(state_file_name));
  const Status locked = ToStatus(fs.lock_file(path, lock));
  if (locked.code() == StatusCode::kFailedPrecondition) {
    return Status::FailedPrecondition(
        "checkpoint_dir " + options.checkpoint_dir +
        " is in use by another job: " + locked.message() + " (one writer per state file '" +
        state_file_name + "', whatever its basename; this saver's is '" + options.basename + "')");
  }
  return locked.WithContext("locking checkpoint_dir " + options.checkpoint_dir);
}

// FailedPrecondition when start-up left quarantined checkpoints and nothing good to resume.
Status RefuseSilentFreshStart(const SaverOptions& options, const StartupReport& report,
                              const CheckpointManager& manager) {
  if (report.quarantined.empty() || !manager.retained().empty()) return Status::OK();
  std::string names;
  for (const std::string& name : report.quarantined) {
    names += (names.empty() ? "" : ", ") + JoinCheckpointPath(options.checkpoint_dir, name);
  }
  const std::string what = "checkpoint_dir " + options.checkpoint_dir + " holds no good " +
                           options.basename +
                           " checkpoint, only damaged ones, quarantined: " + names;
  if (options.allow_fresh_start) {
    LogLine("starting from step 0 as allowed (allow_fresh_start): " + what);
    return Status::OK();
  }
  return Status::FailedPrecondition(
      what +
      ". Inspect them (asyncckpt verify), restore a good copy, or delete them or allow a fresh "
      "start (allow_fresh_start) to train from step 0; see docs/durability.md");
}

}  // namespace

std::string DirectoryLockFileName(const std::string& state_file_name) {
  return state_file_name + ".lock";
}

void SaverStorage::OpenFileSystem(const SaverOptions& options) {
  if (fs != nullptr) return;
  fs = options.file_system;
  if (fs == nullptr) {
    std::string fallback;
    owned_fs = io::NewDefaultFileSystem(io::IoOptions{.force_posix_io = options.force_posix_io},
                                        &fallback);
    if (!fallback.empty()) LogLine(fallback);
    fs = owned_fs.get();
  }
}

void SaverStorage::MakeManager(const SaverOptions& options, const std::string& state_file_name,
                               const CheckpointPartner& partner) {
  CheckpointManagerOptions manager_options{
      .checkpoint_dir = options.checkpoint_dir,
      .basename = options.basename,
      .state_file_name = state_file_name,
      .max_to_keep = options.max_to_keep,
      .keep_checkpoint_every_n_hours = options.keep_checkpoint_every_n_hours,
      .validator =
          [file_system = fs](const std::string& path) {
            return ValidateCheckpointDirectory(*file_system, path);
          },
      .partner = partner,
  };
  if (partner.basename.empty() && !options.paired_input_basename.empty()) {
    manager_options.partner = {options.paired_input_basename,
                               InputStateFileForBasename(options.paired_input_basename)};
  }
  manager = std::make_unique<CheckpointManager>(fs, std::move(manager_options), options.clock);
}

Result<std::vector<std::string>> SaverStorage::Start(const SaverOptions& options,
                                                     const std::string& state_file_name,
                                                     const CheckpointPartner& partner) {
  OpenFileSystem(options);
  RETURN_IF_ERROR(
      ToStatus(fs->create_dirs(options.checkpoint_dir)).WithContext("creating checkpoint_dir"));
  // Locked before anything in the directory is looked at or removed: another job's temporaries
  // are its saves in progress, not debris.
  if (lock == nullptr) RETURN_IF_ERROR(LockDirectory(*fs, options, state_file_name, &lock));
  // A start that fails below leaves the directory to whoever comes next.
  bool started = false;
  const ScopeExit unlock_unless_started([&] {
    if (!started) lock.reset();
  });
  MakeManager(options, state_file_name, partner);
  ASSIGN_OR_RETURN(StartupReport report, manager->Start());
  RETURN_IF_ERROR(RefuseSilentFreshStart(options, report, *manager));
  started = true;
  return std::move(report.removed);
}

Status SaverStorage::Attach(const SaverOptions& options, const std::string& state_file_name,
                            const CheckpointPartner& partner) {
  OpenFileSystem(options);
  // Rank 0 created checkpoint_dir before the ranks agreed on the job token; a missing one here
  // means the ranks do not share it.
  io::EntryType type = io::EntryType::kNone;
  RETURN_IF_ERROR(ToStatus(fs->entry_type(options.checkpoint_dir, &type))
                      .WithContext("looking for checkpoint_dir"));
  if (type != io::EntryType::kDirectory) {
    return Status::FailedPrecondition(
        "checkpoint_dir " + options.checkpoint_dir +
        " is not a directory on this rank although rank 0 created it: every rank of a "
        "multi-process job needs the same shared checkpoint_dir");
  }
  MakeManager(options, state_file_name, partner);
  return Status::OK();
}

std::string InputStateFileForBasename(const std::string& basename) {
  constexpr std::string_view kSuffix = ".ckpt";
  std::string stem = basename;
  if (stem.size() > kSuffix.size() && stem.ends_with(kSuffix)) {
    stem.resize(stem.size() - kSuffix.size());
  }
  return "checkpoint_" + stem;
}

EngineOptions EngineOptionsFor(const SaverOptions& saver, std::string job_token) {
  EngineOptions options;
  if (saver.coordinator != nullptr) {
    options.sharding.rank = static_cast<uint32_t>(saver.coordinator->rank());
    options.sharding.world_size = static_cast<uint32_t>(saver.coordinator->size());
  }
  options.sharding.job_token = std::move(job_token);
  options.sharding.timeout_seconds = saver.coordination_timeout_secs;
  options.checkpoint_dir = saver.checkpoint_dir;
  options.basename = saver.basename;
  options.chunk_bytes = saver.chunk_bytes;
  options.num_data_files = saver.num_data_files;
  options.queue_depth = saver.queue_depth;
  options.compression = saver.compression;
  options.staging_bytes = saver.staging_bytes;
  options.use_o_direct = saver.use_o_direct;
  options.background_threads = saver.background_threads;
  options.stream_ordered = saver.cuda_stream_ordered;
  options.defer_compute_wait = saver.cuda_defer_compute_wait;
  return options;
}

}  // namespace asyncckpt
