#include "asyncckpt/compression.h"

#include <string>

namespace asyncckpt {

std::string_view CompressionKindName(CompressionKind kind) {
  switch (kind) {
    case CompressionKind::kNone:
      return "none";
    case CompressionKind::kZstd:
      return "zstd";
    case CompressionKind::kShuffleZstd:
      return "shuffle+zstd";
  }
  return "invalid";
}

std::optional<CompressionKind> ParseCompressionKind(std::string_view name) {
  if (name == "none") return CompressionKind::kNone;
  if (name == "zstd") return CompressionKind::kZstd;
  if (name == "shuffle+zstd" || name == "shuffle_zstd") return CompressionKind::kShuffleZstd;
  return std::nullopt;
}

Status ValidateCompressionOptions(const CompressionOptions& options) {
  if (options.level < -7 || options.level > 19) {
    return Status::InvalidArgument("compression level must be in [-7, 19], got " +
                                   std::to_string(options.level));
  }
  if (!(options.min_saving >= 0.0 && options.min_saving < 1.0)) {
    return Status::InvalidArgument("compression min_saving must be in [0, 1), got " +
                                   std::to_string(options.min_saving));
  }
  return Status::OK();
}

}  // namespace asyncckpt
