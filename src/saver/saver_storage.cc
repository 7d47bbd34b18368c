// SaverStorage: a saver's file system, directory lock and retention manager (see
// saver_storage.h).

#include "src/saver/saver_storage.h"

#include <string_view>
#include <utility>

#include "src/state/checkpoint_validator.h"
#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

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
    LogWarning("starting from step 0 as allowed (allow_fresh_start): " + what);
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
    if (!fallback.empty()) LogWarning(fallback);
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

}  // namespace asyncckpt
