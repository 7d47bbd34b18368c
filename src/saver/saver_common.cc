#include "src/saver/saver_common.h"

#include <chrono>

#include "src/format/format.h"
#include "src/format/writer.h"
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
  manager = std::make_unique<CheckpointManager>(
      fs, options.checkpoint_dir, options.basename, options.max_to_keep,
      options.keep_checkpoint_every_n_hours, options.clock, state_file_name);
  ASSIGN_OR_RETURN(std::vector<std::string> removed, manager->RemoveStaleTemporaries());
  for (const auto& name : removed) {
    LogLine("removed " + options.checkpoint_dir + "/" + name + " left by an interrupted save");
  }
  RETURN_IF_ERROR(manager->Recover());
  return removed;
}

namespace {

// Host pointers for every tensor; device tensors are copied into host buffers first.
Status GatherOnHost(const TensorRegistry& registry, std::vector<format::HostTensor>* tensors,
                    std::vector<PinnedBuffer>* copies) {
  for (const TensorRef& ref : registry.tensors()) {
    const void* data = ref.data;
    if (ref.device && ref.device->kind() != DeviceKind::kHost && ref.bytes > 0) {
      ASSIGN_OR_RETURN(PinnedBuffer copy, ref.device->allocate_pinned(ref.bytes));
      RETURN_IF_ERROR(ref.device->copy_to_host(ref.data, copy.data(), ref.bytes)
                          .WithContext("copying tensor '" + ref.name + "' to the host"));
      data = copy.data();
      copies->push_back(std::move(copy));
    }
    tensors->push_back(format::HostTensor{ref.name, ref.dtype, ref.shape, data, ref.bytes});
  }
  return Status::OK();
}

}  // namespace

Status WriteAndCommit(const SaverOptions& options, SaverStorage& storage,
                      const TensorRegistry& registry, const CheckpointMetadata& metadata,
                      SaveStats* stats) {
  const std::string final_name = format::CheckpointDirName(options.basename, metadata.step);
  const std::string tmp_name = TempDirName(final_name);
  const std::string tmp_path = options.checkpoint_dir + "/" + tmp_name;
  io::FileSystem& fs = *storage.fs;
  Status status = [&]() -> Status {
    std::vector<format::HostTensor> tensors;
    std::vector<PinnedBuffer> copies;
    RETURN_IF_ERROR(GatherOnHost(registry, &tensors, &copies));
    RETURN_IF_ERROR(ToStatus(fs.create_dir(tmp_path)));
    format::WriterOptions writer_options;
    writer_options.chunk_bytes = options.chunk_bytes;
    writer_options.num_data_files = options.num_data_files;
    writer_options.compression = options.compression;
    writer_options.use_o_direct = options.use_o_direct;
    ASSIGN_OR_RETURN(format::WriteStats written,
                     format::WriteCheckpointFiles(fs, tmp_path, tensors, metadata, writer_options));
    stats->bytes_raw = written.bytes_raw;
    stats->bytes_stored = written.bytes_stored;
    stats->chunks_by_codec = written.chunks_by_codec;
    RETURN_IF_ERROR(CommitDirectory(fs, options.checkpoint_dir, tmp_name, final_name));
    stats->path = options.checkpoint_dir + "/" + final_name;
    return storage.manager->RecordCommitted(final_name, metadata.wall_time);
  }();
  if (!status.ok() && stats->path.empty()) {
    bool exists = false, is_dir = false;
    if (fs.stat(tmp_path, &exists, &is_dir).ok() && exists) (void)fs.remove_tree(tmp_path);
  }
  return status.WithContext("saving " + final_name);
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
