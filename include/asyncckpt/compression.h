#pragma once

#include <optional>
#include <string_view>

#include "asyncckpt/status.h"

namespace asyncckpt {

/// How chunks are compressed before they are written.
enum class CompressionKind {
  /// Stored as is.
  kNone,
  /// zstd on the raw bytes.
  kZstd,
  /// Bytes regrouped by position within the element (byte k of every element together), then
  /// zstd: far better on floating-point state, where exponents repeat and mantissas do not.
  kShuffleZstd,
};

/// Compression settings shared by both saver hooks.
struct CompressionOptions {
  /// The codec to try on every chunk (default: byte-shuffle + zstd).
  CompressionKind kind = CompressionKind::kShuffleZstd;
  /// zstd level (1..19; negative levels are zstd's fast modes, down to -7).
  int level = 1;
  /// A chunk is stored raw unless compression saves at least this fraction of its bytes.
  double min_saving = 0.05;
};

/// "none", "zstd" or "shuffle+zstd".
std::string_view CompressionKindName(CompressionKind kind);
/// Parses "none", "zstd" or "shuffle+zstd" (also "shuffle_zstd").
std::optional<CompressionKind> ParseCompressionKind(std::string_view name);
/// InvalidArgument naming the bad field when the options are out of range.
Status ValidateCompressionOptions(const CompressionOptions& options);

}  // namespace asyncckpt
