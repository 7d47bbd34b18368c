// libFuzzer target: ParseSafetensorsHeader, the parser of a safetensors file's JSON header, which
// `asyncckpt import` reads from files anyone may have written. An input is what a file holds:
// the data part's length as a little-endian u64, then the header. Besides "no crash, no hang,
// no allocation beyond the bounds", it checks that a header that parses tiles its data and
// survives EncodeSafetensorsHeader and a second parse unchanged.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_support.h"
#include "src/interop/safetensors_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace asyncckpt;
  using namespace asyncckpt::fuzz;
  using namespace asyncckpt::interop;
  if (size < 8) return 0;
  uint64_t data_bytes = 0;
  for (int i = 0; i < 8; ++i) data_bytes |= uint64_t(data[i]) << (8 * i);
  const std::string_view json(reinterpret_cast<const char*>(data) + 8, size - 8);
  Result<SafetensorsHeader> header = ParseSafetensorsHeader(json, data_bytes, "fuzz");
  if (!header.ok()) {
    Require(header.status().code() == StatusCode::kInvalidArgument,
            "ParseSafetensorsHeader failed with something other than InvalidArgument");
    return 0;
  }
  uint64_t covered = 0;
  for (const SafetensorsTensor& t : header->tensors) {
    Require(t.begin <= covered && t.end <= data_bytes, "a parsed header does not tile");
    covered = std::max(covered, t.end);
  }
  Require(covered == data_bytes, "a parsed header leaves data uncovered");
  const std::string again = EncodeSafetensorsHeader(header->tensors, header->metadata);
  Result<SafetensorsHeader> reparsed = ParseSafetensorsHeader(again, data_bytes, "fuzz");
  Require(reparsed.ok(), "an encoded header does not parse");
  Require(
      reparsed->tensors.size() == header->tensors.size() && reparsed->metadata == header->metadata,
      "an encoded header parses to another one");
  for (size_t i = 0; i < header->tensors.size(); ++i) {
    const SafetensorsTensor& a = header->tensors[i];
    const SafetensorsTensor& b = reparsed->tensors[i];
    Require(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.begin == b.begin &&
                a.end == b.end,
            "a tensor changed through encode and parse");
  }
  return 0;
}
