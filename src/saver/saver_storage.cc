// SaverStorage: a saver's file system, directory lock and retention manager (see
// saver_storage.h).

#include "src/saver/saver_storage.h"

#include <map>
#include <mutex>
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

// The state-file locks this process holds through its savers: the managers of the started
// ones, and the partners' locks taken ahead of start-up for savers not started yet.
struct HeldLocks {
  std::mutex mu;
  std::map<std::string, CheckpointManager*> managers;           // by lock path
  std::map<std::string, std::unique_ptr<io::FileLock>> parked;  // by lock path
};

HeldLocks& Held() {
  static HeldLocks* held = new HeldLocks;  // never destroyed: savers may outlive static ones
  return *held;
}

std::string LockPath(const std::string& dir, const std::string& state_file_name) {
  return JoinCheckpointPath(dir, DirectoryLockFileName(state_file_name));
}

Status LockDirectory(io::FileSystem& fs, const SaverOptions& options,
                     const std::string& state_file_name, std::unique_ptr<io::FileLock>* lock) {
  const std::string path = LockPath(options.checkpoint_dir, state_file_name);
  {
    // Taken ahead by the saver this one pairs with: take it over.
    std::lock_guard held_lock(Held().mu);
    const auto parked = Held().parked.find(path);
    if (parked != Held().parked.end()) {
      *lock = std::move(parked->second);
      Held().parked.erase(parked);
      return Status::OK();
    }
  }
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

SaverStorage::~SaverStorage() { ReleaseLock(); }

void SaverStorage::ReleaseLock() {
  {
    std::lock_guard held_lock(Held().mu);
    if (!lock_path_.empty()) Held().managers.erase(lock_path_);
    if (!partner_path_.empty()) Held().parked.erase(partner_path_);  // never taken over
  }
  lock_path_.clear();
  partner_path_.clear();
  lock.reset();
}

Status SaverStorage::LockPartnerAhead(const SaverOptions& options) {
  const std::string state_file = InputStateFileForBasename(options.paired_input_basename);
  const std::string path = LockPath(options.checkpoint_dir, state_file);
  {
    std::lock_guard held_lock(Held().mu);
    if (Held().managers.contains(path) || Held().parked.contains(path)) return Status::OK();
  }
  std::unique_ptr<io::FileLock> partner_lock;
  const Status locked = ToStatus(fs->lock_file(path, &partner_lock));
  if (locked.code() == StatusCode::kFailedPrecondition) {
    return Status::FailedPrecondition(
        "checkpoint_dir " + options.checkpoint_dir + " is in use by another job: " +
        locked.message() + " (the state file '" + state_file + "' of the input pipeline paired " +
        "with this saver's '" + options.basename + "'); nothing in the directory was changed");
  }
  RETURN_IF_ERROR(locked.WithContext("locking checkpoint_dir " + options.checkpoint_dir));
  std::lock_guard held_lock(Held().mu);
  Held().parked[path] = std::move(partner_lock);
  partner_path_ = path;
  return Status::OK();
}

Result<std::string> QuarantineFoundDamage(io::FileSystem& fs, const std::string& dir,
                                          const std::string& state_file_name,
                                          const std::string& name, const std::string& why) {
  const std::string path = LockPath(dir, state_file_name);
  {
    std::lock_guard held_lock(Held().mu);
    const auto holder = Held().managers.find(path);
    if (holder != Held().managers.end()) return holder->second->Quarantine(name, why);
  }
  std::unique_ptr<io::FileLock> lock;
  const Status locked = ToStatus(fs.lock_file(path, &lock));
  if (!locked.ok()) {
    LogError("checkpoint " + JoinCheckpointPath(dir, name) + " is damaged (" + why +
             "); it was not quarantined, as its directory is not this process's to change: " +
             locked.ToString());
    return locked.WithContext("quarantining " + JoinCheckpointPath(dir, name));
  }
  return QuarantineListedCheckpoint(fs, dir, state_file_name, name, why);
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
      .keep_period = options.keep_period,
      .best_mode = options.best_mode,
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
    if (!started) ReleaseLock();
  });
  if (partner.basename.empty() && !options.paired_input_basename.empty() && partner_path_.empty()) {
    RETURN_IF_ERROR(LockPartnerAhead(options));
  }
  MakeManager(options, state_file_name, partner);
  ASSIGN_OR_RETURN(StartupReport report, manager->Start());
  RETURN_IF_ERROR(RefuseSilentFreshStart(options, report, *manager));
  started = true;
  lock_path_ = LockPath(options.checkpoint_dir, state_file_name);
  std::lock_guard held_lock(Held().mu);
  Held().managers[lock_path_] = manager.get();
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
