// CheckpointSaverHook: the synchronous saver. Every save runs on the training thread, start to
// commit; it is the baseline the asynchronous hook is measured against.

#include "asyncckpt/saver_hook.h"

#include <chrono>
#include <vector>

#include "src/format/format.h"
#include "src/format/writer.h"
#include "src/saver/saver_common.h"
#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

class CheckpointSaverHook::Impl {
 public:
  Impl(SaverOptions options, const TensorRegistry* registry,
       std::vector<CheckpointSaverListener*> listeners, SaveSchedule schedule)
      : options_(std::move(options)),
        registry_(registry),
        listeners_(std::move(listeners)),
        schedule_(std::move(schedule)) {}

  Status Begin() {
    ASSIGN_OR_RETURN(totals_.stale_temporaries_removed, storage_.Start(options_));
    for (auto* listener : listeners_) listener->begin();
    return Status::OK();
  }

  // Saves `step`; *stop is set when a listener asks the loop to stop.
  Status Save(int64_t step, bool* stop) {
    schedule_.mark(step);
    schedule_.mark_saved(step);
    for (auto* listener : listeners_) listener->before_save(step);
    const auto start = std::chrono::steady_clock::now();
    SaveStats stats;
    stats.step = step;
    stats.final_level = options_.compression.level;
    stats.status = WriteAndCommit(step, &stats);
    stats.seconds_to_durable = SecondsSince(start);
    stats.blocked_seconds = stats.seconds_to_durable;
    AddToTotals(stats, &totals_);
    *stop = NotifyAfterSave(listeners_, step, stats) || *stop;
    return stats.status;
  }

  Status End(int64_t step) {
    Status status;
    if (schedule_.final_save_needed(step)) {
      bool stop = false;
      status = Save(step, &stop);
    }
    for (auto* listener : listeners_) listener->end(step);
    storage_.ReleaseLock();  // every save of this hook is durable or failed by now
    return status;
  }

  const SaveSchedule& schedule() const { return schedule_; }
  const SaverTotals& totals() const { return totals_; }

 private:
  // Gathers host pointers; device tensors are copied into host buffers first.
  Status Gather(std::vector<format::HostTensor>* tensors, std::vector<PinnedBuffer>* copies) {
    for (const TensorRef& ref : registry_->tensors()) {
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

  Status WriteAndCommit(int64_t step, SaveStats* stats) {
    const std::string final_name = format::CheckpointDirName(options_.basename, step);
    const std::string tmp_name = TempDirName(final_name);
    const std::string tmp_path = options_.checkpoint_dir + "/" + tmp_name;
    io::FileSystem& fs = *storage_.fs;
    Status status = [&]() -> Status {
      std::vector<format::HostTensor> tensors;
      std::vector<PinnedBuffer> copies;
      RETURN_IF_ERROR(Gather(&tensors, &copies));
      CheckpointMetadata metadata{step, options_.clock(), options_.user_metadata};
      RETURN_IF_ERROR(ToStatus(fs.create_dir(tmp_path)));
      format::WriterOptions writer_options;
      writer_options.chunk_bytes = options_.chunk_bytes;
      writer_options.num_data_files = options_.num_data_files;
      writer_options.compression = options_.compression;
      writer_options.use_o_direct = options_.use_o_direct;
      ASSIGN_OR_RETURN(
          format::WriteStats written,
          format::WriteCheckpointFiles(fs, tmp_path, tensors, metadata, writer_options));
      stats->bytes_raw = written.bytes_raw;
      stats->bytes_stored = written.bytes_stored;
      stats->chunks_by_codec = written.chunks_by_codec;
      RETURN_IF_ERROR(CommitDirectory(fs, options_.checkpoint_dir, tmp_name, final_name));
      stats->path = options_.checkpoint_dir + "/" + final_name;
      return storage_.manager->RecordCommitted(final_name, metadata.wall_time);
    }();
    if (!status.ok() && stats->path.empty()) {
      bool exists = false, is_dir = false;
      if (fs.stat(tmp_path, &exists, &is_dir).ok() && exists) (void)fs.remove_tree(tmp_path);
    }
    return status.WithContext("saving " + final_name);
  }

  SaverOptions options_;
  const TensorRegistry* registry_;
  std::vector<CheckpointSaverListener*> listeners_;
  SaveSchedule schedule_;
  SaverStorage storage_;
  SaverTotals totals_;
};

Result<std::unique_ptr<CheckpointSaverHook>> CheckpointSaverHook::Create(
    SaverOptions options, const TensorRegistry* registry,
    std::vector<CheckpointSaverListener*> listeners) {
  if (registry == nullptr) return Status::InvalidArgument("the tensor registry must not be null");
  RETURN_IF_ERROR(ValidateSaverOptions(options));
  ASSIGN_OR_RETURN(SaveSchedule schedule, SaveSchedule::Create(options));
  return std::unique_ptr<CheckpointSaverHook>(new CheckpointSaverHook(std::make_unique<Impl>(
      std::move(options), registry, std::move(listeners), std::move(schedule))));
}

CheckpointSaverHook::CheckpointSaverHook(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointSaverHook::~CheckpointSaverHook() = default;

Status CheckpointSaverHook::begin() { return impl_->Begin(); }

Status CheckpointSaverHook::after_create_session(int64_t global_step) {
  bool stop = false;  // nothing to stop yet: TensorFlow ignores the listeners' answer here too
  return impl_->Save(global_step, &stop);
}

Status CheckpointSaverHook::after_run(RunContext& context, const RunValues& values) {
  (void)values;
  if (!impl_->schedule().due(context.step())) return Status::OK();
  bool stop = false;
  Status status = impl_->Save(context.step(), &stop);
  if (stop) context.request_stop();
  return status;
}

Status CheckpointSaverHook::end(int64_t global_step) { return impl_->End(global_step); }

SaverTotals CheckpointSaverHook::totals() const { return impl_->totals(); }

}  // namespace asyncckpt
