// libFuzzer target: format::ParseIndex and CheckChunkLocations, the index parser every reader
// trusts with hostile bytes. Besides "no crash, no hang, no allocation beyond the bounds"
// (scripts/fuzz sets the limits), it checks two properties of an index that parses:
//  - the encoding is canonical: EncodeIndex gives back exactly the bytes that were parsed;
//  - CheckChunkLocations accepts data files just long enough for every chunk, unless two chunks
//    share stored bytes, and refuses data files one byte short of the longest chunk's end.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "src/format/format.h"
#include "src/format/index_file.h"

namespace asyncckpt::fuzz {
namespace {

constexpr char kPath[] = "fuzz/index";

void CheckParsedIndex(const format::Index& index, std::span<const uint8_t> bytes) {
  const std::vector<uint8_t> encoded = format::EncodeIndex(index);
  Require(std::equal(encoded.begin(), encoded.end(), bytes.begin(), bytes.end()),
          "EncodeIndex(ParseIndex(bytes)) != bytes");

  // Each data file exactly as long as the end of its last chunk.
  std::vector<uint64_t> sizes(index.num_data_files, 0);
  for (const format::TensorEntry& tensor : index.tensors) {
    for (const format::ChunkEntry& chunk : tensor.chunks) {
      uint64_t& size = sizes[chunk.file_index];
      size = std::max(size, chunk.file_offset + chunk.stored_bytes);
    }
  }
  const Status fits = format::CheckChunkLocations(index, kPath, sizes);
  Require(fits.ok() || fits.code() == StatusCode::kCorruption,
          "CheckChunkLocations failed with something other than Corruption");
  for (uint64_t& size : sizes) {
    if (size == 0) continue;
    --size;
    Require(!format::CheckChunkLocations(index, kPath, sizes).ok(),
            "CheckChunkLocations accepted a chunk past the end of its data file");
    ++size;
  }
  // One data file too few is refused before anything else is looked at.
  sizes.pop_back();
  Require(!format::CheckChunkLocations(index, kPath, sizes).ok(),
          "CheckChunkLocations accepted the wrong number of data files");
}

void ParseOne(std::span<const uint8_t> bytes) {
  Result<format::Index> index = format::ParseIndex(bytes, kPath);
  if (index.ok()) {
    CheckParsedIndex(*index, bytes);
  } else {
    Require(index.status().code() == StatusCode::kCorruption,
            "ParseIndex failed with something other than Corruption");
  }
}

}  // namespace
}  // namespace asyncckpt::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace asyncckpt::fuzz;
  const std::span<const uint8_t> input(data, size);
  ParseOne(input);
  std::vector<uint8_t> repaired(input.begin(), input.end());
  if (RepairIndexEnvelope(repaired)) ParseOne(repaired);
  return 0;
}
