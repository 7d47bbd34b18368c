#include "src/engine/save_job.h"

#include <algorithm>

namespace asyncckpt {

void SaveJob::Fail(const Status& why) {
  std::lock_guard lock(mu_);
  if (status_.ok()) status_ = why;
  failed = true;
}

Status SaveJob::FirstFailure() const {
  std::lock_guard lock(mu_);
  return status_;
}

CompressionOptions SaveJob::Compression(CompressionOptions options) const {
  std::lock_guard lock(mu_);
  options.level = level_;
  if (store_raw_) options.kind = CompressionKind::kNone;
  return options;
}

void SaveJob::SetLevel(int level) {
  std::lock_guard lock(mu_);
  level_ = level;
}

void SaveJob::MaybeLowerLevel(uint64_t every, bool encoders_bottleneck) {
  std::lock_guard lock(mu_);
  if (store_raw_ || ++encoded_since_change_ < every || !encoders_bottleneck) return;
  encoded_since_change_ = 0;
  if (level_ > 1) {
    level_ = 1;
  } else if (level_ > -5) {
    level_ = -5;
  } else {
    store_raw_ = true;
  }
}

uint64_t SaveJob::FileBytes(uint32_t file) const {
  const uint64_t written = placer ? placer->written_end(file) : 0;
  return std::max(written, file < allocated.size() ? allocated[file] : 0);
}

SaveStats SaveJob::Stats() const {
  SaveStats stats;
  stats.step = metadata.step;
  stats.status = FirstFailure();
  for (const auto& job : jobs) stats.bytes_raw += job.length;
  stats.bytes_stored = bytes_stored;
  for (int c = 0; c < codec::kNumCodecs; ++c) {
    const uint64_t count = codec_counts[c];
    if (count > 0) stats.chunks_by_codec[std::string(codec::CodecName(codec::Codec(c)))] = count;
  }
  {
    std::lock_guard lock(mu_);
    stats.final_level = level_;
    stats.switched_to_raw = store_raw_;
  }
  stats.blocked_seconds = blocked_seconds;
  stats.seconds_to_durable = SecondsSince(start);
  stats.failed_rank = failed_rank;
  return stats;
}

std::string ChunkContext(const SaveJob& save, uint32_t position) {
  const auto& job = save.jobs[position];
  return save.final_name + ": tensor '" + save.tensors[job.tensor].name + "' chunk " +
         std::to_string(job.chunk);
}

}  // namespace asyncckpt
