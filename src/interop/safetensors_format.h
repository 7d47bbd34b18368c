#pragma once

// The safetensors file format, as Hugging Face's `safetensors` package writes and reads it:
//
//   8 bytes   little-endian u64 N, the header's length
//   N bytes   a JSON object: for every tensor, name -> {"dtype", "shape", "data_offsets":
//             [begin, end]} (offsets into the data that follows the header), and optionally
//             "__metadata__" -> {string: string}; padded with spaces to a multiple of 8
//   the data  every tensor's bytes, row-major, little-endian, back to back
//
// and the index of a model split into several files, model.safetensors.index.json:
// {"metadata": {"total_size": <bytes>}, "weight_map": {tensor name: file name}}.
//
// The parsers trust nothing: every length, offset and shape is bounded and checked before use,
// and the tensors must tile the data exactly (no overlap, no gap), as the package demands.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "asyncckpt/dtype.h"
#include "asyncckpt/status.h"

namespace asyncckpt::interop {

/// The largest header a file may declare (the `safetensors` package's own limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

/// One tensor of a safetensors file.
struct SafetensorsTensor {
  /// Its name as the file spells it.
  std::string name;
  /// Its element type.
  DType dtype = DType::kF32;
  /// Its shape (empty for a scalar).
  std::vector<int64_t> shape;
  /// Where its bytes lie in the data part: [begin, end).
  uint64_t begin = 0;
  /// End of its bytes (exclusive).
  uint64_t end = 0;
};

/// A safetensors header: the tensors in data order, and the free-form metadata.
struct SafetensorsHeader {
  /// The tensors, ordered by where their bytes start.
  std::vector<SafetensorsTensor> tensors;
  /// "__metadata__".
  std::map<std::string, std::string> metadata;
};

/// The safetensors name of a dtype ("F32", "BF16", "F8_E4M3", "BOOL", ...).
std::string_view SafetensorsDTypeName(DType dtype);
/// The dtype a safetensors name stands for; nullopt for one this library cannot hold (e.g.
/// "C64").
std::optional<DType> SafetensorsDType(std::string_view name);

/// Parses `json`, the header of `file` whose data part is `data_bytes` long. InvalidArgument
/// naming the file, the tensor and what is wrong: bad JSON, an unknown dtype, a shape whose
/// size disagrees with its offsets, tensors that overlap, leave a gap or run past the data.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view json, uint64_t data_bytes,
                                                 std::string_view file);

/// The header of a file holding `tensors` (their begin/end already laid out back to back)
/// with `metadata`, padded with spaces to a multiple of 8 bytes: the file starts with its
/// length as a little-endian u64, then these bytes, then the data.
std::string EncodeSafetensorsHeader(const std::vector<SafetensorsTensor>& tensors,
                                    const std::map<std::string, std::string>& metadata);

/// Parses model.safetensors.index.json: tensor name -> file name. InvalidArgument naming the
/// file when it is not such an index, or names a file with '/' in it.
Result<std::map<std::string, std::string>> ParseSafetensorsIndex(std::string_view json,
                                                                 std::string_view file);

/// model.safetensors.index.json for `weight_map` (tensor name -> file) and `total_size` bytes.
std::string EncodeSafetensorsIndex(const std::map<std::string, std::string>& weight_map,
                                   uint64_t total_size);

}  // namespace asyncckpt::interop
