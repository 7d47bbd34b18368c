#include "src/cli/naive_saver.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "src/util/status_macros.h"

namespace asyncckpt::cli {

namespace {

// write(2) moves at most about 2 GiB per call; larger tensors take several.
constexpr size_t kMaxWriteBytes = 1u << 30;

Status Errno(const std::string& what, const std::string& path) {
  return Status::IOError(what + " " + path + ": " + std::strerror(errno));
}

// The whole buffer into a new file, then fsync: what numpy.save + os.fsync do.
Status WriteFileDurably(const std::string& path, const uint8_t* data, size_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", path);
  Status status;
  for (size_t done = 0; done < bytes && status.ok();) {
    const ssize_t wrote = ::write(fd, data + done, std::min(bytes - done, kMaxWriteBytes));
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) status = Errno("cannot write", path);
    if (wrote > 0) done += static_cast<size_t>(wrote);
  }
  if (status.ok() && ::fsync(fd) != 0) status = Errno("cannot fsync", path);
  if (::close(fd) != 0 && status.ok()) status = Errno("cannot close", path);
  return status;
}

Status SyncDirectory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open directory", path);
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  return synced ? Status::OK() : Errno("cannot fsync directory", path);
}

}  // namespace

Result<std::unique_ptr<NaiveSaverHook>> NaiveSaverHook::Create(
    const SaverOptions& options, const TensorRegistry* registry,
    std::vector<CheckpointSaverListener*> listeners) {
  ASSIGN_OR_RETURN(SaveSchedule schedule, SaveSchedule::Create(options));
  return std::unique_ptr<NaiveSaverHook>(
      new NaiveSaverHook(options, registry, std::move(listeners), std::move(schedule)));
}

NaiveSaverHook::NaiveSaverHook(const SaverOptions& options, const TensorRegistry* registry,
                               std::vector<CheckpointSaverListener*> listeners,
                               SaveSchedule schedule)
    : options_(options),
      registry_(registry),
      listeners_(std::move(listeners)),
      schedule_(std::move(schedule)) {}

NaiveSaverHook::~NaiveSaverHook() = default;

std::string NaiveSaverHook::DirectoryOf(int64_t step) const {
  return options_.checkpoint_dir + "/naive-" + std::to_string(step);
}

Status NaiveSaverHook::WriteAll(const std::string& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create " + dir + ": " + ec.message());
  size_t index = 0;
  for (const TensorRef& tensor : registry_->tensors()) {
    char name[32];
    std::snprintf(name, sizeof(name), "/%08zu.bin", index++);
    RETURN_IF_ERROR(
        WriteFileDurably(dir + name, static_cast<const uint8_t*>(tensor.data), tensor.bytes));
  }
  RETURN_IF_ERROR(SyncDirectory(dir));
  return SyncDirectory(options_.checkpoint_dir);
}

Status NaiveSaverHook::Save(int64_t step) {
  schedule_.mark(step);
  for (CheckpointSaverListener* listener : listeners_) listener->before_save(step);
  const auto start = std::chrono::steady_clock::now();
  SaveStats stats;
  stats.step = step;
  stats.path = DirectoryOf(step);
  stats.status = WriteAll(stats.path);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.blocked_seconds = seconds;
  stats.seconds_to_durable = seconds;
  totals_.blocked_seconds_total += seconds;
  totals_.blocked_seconds_max = std::max(totals_.blocked_seconds_max, seconds);
  if (stats.status.ok()) {
    schedule_.mark_saved(step);
    stats.bytes_raw = stats.bytes_stored = registry_->total_bytes();
    ++totals_.saves_committed;
    totals_.bytes_raw += stats.bytes_raw;
    totals_.bytes_stored += stats.bytes_stored;
    totals_.seconds_to_durable_total += seconds;
    totals_.seconds_to_durable_max = std::max(totals_.seconds_to_durable_max, seconds);
  } else {
    ++totals_.saves_failed;
  }
  Status status = stats.status;
  for (CheckpointSaverListener* listener : listeners_) (void)listener->after_save(step, stats);
  totals_.saves.push_back(std::move(stats));
  if (totals_.saves.size() > kSaverTotalsWindow) totals_.saves.pop_front();
  if (status.ok()) DropOld();
  return status;
}

// Retention as the real savers keep it: the newest max_to_keep committed saves, and those of a
// step that is a multiple of keep_period.
void NaiveSaverHook::DropOld() {
  if (options_.max_to_keep <= 0) return;
  std::vector<int64_t> kept;
  for (const SaveStats& save : totals_.saves) {
    if (save.status.ok()) kept.push_back(save.step);
  }
  const size_t keep = static_cast<size_t>(options_.max_to_keep);
  if (kept.size() <= keep) return;
  std::error_code ec;
  for (size_t i = 0; i + keep < kept.size(); ++i) {
    if (options_.keep_period > 0 && kept[i] % options_.keep_period == 0) continue;
    std::filesystem::remove_all(DirectoryOf(kept[i]), ec);
  }
}

Status NaiveSaverHook::after_create_session(int64_t global_step) { return Save(global_step); }

Status NaiveSaverHook::after_run(RunContext& context, const RunValues& values) {
  (void)values;
  if (!schedule_.due(context.step())) return Status::OK();
  return Save(context.step());
}

Status NaiveSaverHook::end(int64_t global_step) {
  if (!schedule_.final_save_needed(global_step)) return Status::OK();
  return Save(global_step);
}

}  // namespace asyncckpt::cli
