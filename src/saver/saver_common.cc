#include "src/saver/saver_common.h"

#include <chrono>

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
  if (options.save_secs && !(*options.save_secs > 0)) {
    return Status::InvalidArgument("save_secs must be positive, got " +
                                   std::to_string(*options.save_secs));
  }
  RETURN_IF_ERROR(ValidateCheckpointName(options.basename + "-0")
                      .WithContext("basename '" + options.basename + "' is not a plain file name"));
  if (options.max_to_keep < 0) {
    return Status::InvalidArgument("max_to_keep must be >= 0 (0 keeps all), got " +
                                   std::to_string(options.max_to_keep));
  }
  if (!(options.keep_checkpoint_every_n_hours >= 0)) {
    return Status::InvalidArgument("keep_checkpoint_every_n_hours must be >= 0");
  }
  if (options.chunk_bytes == 0 || options.chunk_bytes > (1ull << 30)) {
    return Status::InvalidArgument("chunk_bytes must be in [1, 1 GiB], got " +
                                   std::to_string(options.chunk_bytes));
  }
  if (options.num_data_files == 0 || options.num_data_files > 4096) {
    return Status::InvalidArgument("num_data_files must be in [1, 4096], got " +
                                   std::to_string(options.num_data_files));
  }
  if (options.queue_depth == 0 || options.queue_depth > 4096) {
    return Status::InvalidArgument("queue_depth must be in [1, 4096], got " +
                                   std::to_string(options.queue_depth));
  }
  if (options.background_threads > 1024) {
    return Status::InvalidArgument("background_threads must be <= 1024");
  }
  if (!options.clock) return Status::InvalidArgument("clock must be set");
  return ValidateCompressionOptions(options.compression);
}

Result<SaveSchedule> SaveSchedule::Create(const SaverOptions& options) {
  ASSIGN_OR_RETURN(SecondOrStepTimer timer,
                   SecondOrStepTimer::Create(options.save_steps, options.save_secs, options.clock));
  return SaveSchedule(std::move(timer));
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
                     std::unique_ptr<io::FileLock>* lock) {
  const std::string path =
      JoinCheckpointPath(options.checkpoint_dir, DirectoryLockFileName(options.basename));
  const Status locked = ToStatus(fs.lock_file(path, lock));
  if (locked.code() == StatusCode::kFailedPrecondition) {
    return Status::FailedPrecondition("checkpoint_dir " + options.checkpoint_dir +
                                      " is in use by another job: " + locked.message() +
                                      " (one writer per checkpoint_dir and basename '" +
                                      options.basename + "')");
  }
  return locked.WithContext("locking checkpoint_dir " + options.checkpoint_dir);
}

}  // namespace

std::string DirectoryLockFileName(const std::string& basename) { return basename + ".lock"; }

Result<std::vector<std::string>> SaverStorage::Start(const SaverOptions& options,
                                                     const std::string& state_file_name) {
  fs = options.file_system;
  if (fs == nullptr) {
    std::string fallback;
    owned_fs = io::NewDefaultFileSystem(
        io::IoOptions{.queue_depth = options.queue_depth, .force_posix = options.force_posix_io},
        &fallback);
    if (!fallback.empty()) LogLine(fallback);
    fs = owned_fs.get();
  }
  RETURN_IF_ERROR(
      ToStatus(fs->create_dirs(options.checkpoint_dir)).WithContext("creating checkpoint_dir"));
  // Locked before anything in the directory is looked at or removed: another job's temporaries
  // are its saves in progress, not debris.
  if (lock == nullptr) RETURN_IF_ERROR(LockDirectory(*fs, options, &lock));
  // A start that fails below leaves the directory to whoever comes next.
  bool started = false;
  const ScopeExit unlock_unless_started([&] {
    if (!started) lock.reset();
  });
  manager = std::make_unique<CheckpointManager>(
      fs, options.checkpoint_dir, options.basename, options.max_to_keep,
      options.keep_checkpoint_every_n_hours, options.clock, state_file_name);
  ASSIGN_OR_RETURN(std::vector<std::string> removed, manager->RemoveStaleTemporaries());
  for (const auto& name : removed) {
    LogLine("removed " + options.checkpoint_dir + "/" + name + " left by an interrupted save");
  }
  RETURN_IF_ERROR(manager->Recover());
  started = true;
  return removed;
}

bool NotifyAfterSave(const std::vector<CheckpointSaverListener*>& listeners, int64_t step,
                     const SaveStats& stats) {
  bool stop = false;
  for (auto* listener : listeners) stop = listener->after_save(step, stats) || stop;
  return stop;
}

void AddToTotals(const SaveStats& stats, SaverTotals* totals) {
  if (stats.status.ok()) {
    ++totals->saves_committed;
    totals->bytes_raw += stats.bytes_raw;
    totals->bytes_stored += stats.bytes_stored;
  } else {
    ++totals->saves_failed;
  }
  totals->blocked_seconds_total += stats.blocked_seconds;
  totals->blocked_seconds_max = std::max(totals->blocked_seconds_max, stats.blocked_seconds);
  totals->saves.push_back(stats);
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace asyncckpt
