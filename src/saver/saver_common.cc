#include "src/saver/saver_common.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <new>

#include "asyncckpt/state.h"
#include "src/codec/codec.h"
#include "src/format/format.h"
#include "src/saver/coordination.h"
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

void SaverStorage::OpenFileSystem(const SaverOptions& options) {
  if (fs != nullptr) return;
  fs = options.file_system;
  if (fs == nullptr) {
    std::string fallback;
    owned_fs =
        io::NewDefaultFileSystem(io::IoOptions{.force_posix = options.force_posix_io}, &fallback);
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
  if (lock == nullptr) RETURN_IF_ERROR(LockDirectory(*fs, options, &lock));
  // A start that fails below leaves the directory to whoever comes next.
  bool started = false;
  const ScopeExit unlock_unless_started([&] {
    if (!started) lock.reset();
  });
  MakeManager(options, state_file_name, partner);
  ASSIGN_OR_RETURN(StartupReport report, manager->Start());
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

namespace {

uint64_t LoadU64(const uint8_t* p) {
  uint64_t value = 0;
  std::memcpy(&value, p, sizeof(value));  // the format is little-endian, as is every target
  return value;
}

// True for an intact index (magic, end magic, checksum) of a format version this build does
// not read: a newer library's checkpoint, which must never be taken for debris.
bool IsIntactIndexOfAnotherVersion(std::span<const uint8_t> bytes) {
  if (bytes.size() < format::kIndexHeaderBytes + format::kIndexFooterBytes) return false;
  if (LoadU64(bytes.data()) != format::kIndexMagic ||
      LoadU64(bytes.data() + bytes.size() - 8) != format::kIndexEndMagic) {
    return false;
  }
  const size_t checksum_at = bytes.size() - 16;
  if (codec::Checksum(bytes.first(checksum_at)) != LoadU64(bytes.data() + checksum_at)) {
    return false;
  }
  uint32_t version = 0;
  std::memcpy(&version, bytes.data() + 8, sizeof(version));
  return version != format::kFormatVersion;
}

Result<ValidCheckpoint> ValidateIndexAndSizes(io::FileSystem& fs,
                                              const std::string& checkpoint_path) {
  const std::string index_path = checkpoint_path + "/" + format::kIndexFileName;
  ASSIGN_OR_RETURN(ValidCheckpoint exists, IndexFileExists(fs, checkpoint_path));
  (void)exists;
  uint64_t size = 0;
  RETURN_IF_ERROR(ToStatus(fs.file_size(index_path, &size)));
  if (size > format::kMaxIndexBytes) {
    return Status::Corruption("index " + index_path + " is " + std::to_string(size) +
                              " bytes; at most " + std::to_string(format::kMaxIndexBytes) +
                              " accepted");
  }
  std::vector<uint8_t> bytes(size);
  std::unique_ptr<io::File> file;
  RETURN_IF_ERROR(ToStatus(fs.open(index_path, io::OpenOptions{}, &file)));
  RETURN_IF_ERROR(ToStatus(file->read_at(0, bytes.data(), bytes.size())));
  if (IsIntactIndexOfAnotherVersion(bytes)) {
    return Status::FailedPrecondition("index " + index_path +
                                      " was written in another format version");
  }
  ASSIGN_OR_RETURN(const format::Index index, format::ParseIndex(bytes, index_path));
  std::vector<uint64_t> sizes;
  for (uint32_t i = 0; i < index.num_data_files; ++i) {
    const std::string data_path =
        checkpoint_path + "/" + format::DataFileName(i, index.num_data_files);
    // Sized, never opened: a FIFO named like a data file has size 0 and would block a read.
    io::EntryType type = io::EntryType::kNone;
    RETURN_IF_ERROR(ToStatus(fs.entry_type(data_path, &type)));
    if (type != io::EntryType::kFile && type != io::EntryType::kNone) {
      return Status::Corruption("checkpoint " + checkpoint_path + ": data file " + data_path +
                                " is " + DescribeEntryType(type) + ", not a regular file");
    }
    uint64_t data_size = 0;
    const io::IoStatus sized = fs.file_size(data_path, &data_size);
    if (sized.error_number() == ENOENT) {
      return Status::Corruption("checkpoint " + checkpoint_path + ": data file " + data_path +
                                " is missing");
    }
    RETURN_IF_ERROR(ToStatus(sized));
    sizes.push_back(data_size);
  }
  RETURN_IF_ERROR(format::CheckChunkLocations(index, index_path, sizes));
  return ValidCheckpoint{index.metadata.wall_time};
}

}  // namespace

Result<ValidCheckpoint> ValidateCheckpointDirectory(io::FileSystem& fs,
                                                    const std::string& checkpoint_path) {
  try {
    return ValidateIndexAndSizes(fs, checkpoint_path);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("out of memory validating checkpoint " + checkpoint_path);
  } catch (const std::exception& e) {
    return Status::Internal("validating checkpoint " + checkpoint_path + ": " + e.what());
  }
}

std::string InputStateFileForBasename(const std::string& basename) {
  constexpr std::string_view kSuffix = ".ckpt";
  std::string stem = basename;
  if (stem.size() > kSuffix.size() && stem.ends_with(kSuffix)) {
    stem.resize(stem.size() - kSuffix.size());
  }
  return "checkpoint_" + stem;
}

// Declared in asyncckpt/state.h; defined here because deciding what is complete needs the
// format, which src/state must not depend on.
Result<std::vector<int64_t>> CommittedCheckpointSteps(const std::string& dir,
                                                      const std::string& basename,
                                                      const std::string& state_file_name,
                                                      io::FileSystem* fs) {
  std::unique_ptr<io::FileSystem> posix;
  if (fs == nullptr) fs = (posix = io::NewPosixFileSystem()).get();
  return ListCommittedSteps(*fs, dir, basename, state_file_name, [fs](const std::string& path) {
    return ValidateCheckpointDirectory(*fs, path);
  });
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
  return options;
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
    totals->seconds_to_durable_total += stats.seconds_to_durable;
    totals->seconds_to_durable_max =
        std::max(totals->seconds_to_durable_max, stats.seconds_to_durable);
    for (const auto& [codec, chunks] : stats.chunks_by_codec) {
      totals->chunks_by_codec[codec] += chunks;
    }
  } else {
    ++totals->saves_failed;
  }
  totals->blocked_seconds_total += stats.blocked_seconds;
  totals->blocked_seconds_max = std::max(totals->blocked_seconds_max, stats.blocked_seconds);
  totals->saves.push_back(stats);
  while (totals->saves.size() > kSaverTotalsWindow) totals->saves.pop_front();
}

}  // namespace asyncckpt
