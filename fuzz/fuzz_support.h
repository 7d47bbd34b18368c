#pragma once

// Shared by the fuzz targets and the seed generator (fuzz/make_fuzz_seeds.cc).
//
// reader_fuzz takes a whole checkpoint directory in one input: the files one after another, each
// as a 4-byte little-endian length and then its bytes, the index first and then the data files in
// order. A length past the end of the input takes what is left, so that no mutation is wasted on
// an input that frames nothing.
//
// The index checksums itself, so a random change to its body nearly always stops at the
// checksum. The targets therefore also parse a copy whose envelope (magic numbers, version,
// flags, body length, checksum) is rewritten to be right, which lets the fuzzer reach the body.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/codec/codec.h"
#include "src/format/format.h"

namespace asyncckpt::fuzz {

/// Most data files reader_fuzz writes for one input; more files find nothing new.
inline constexpr size_t kMaxDataFiles = 8;

/// Stops the fuzzer with `what` when `holds` is false: a broken property is a finding.
inline void Require(bool holds, const char* what) {
  if (holds) return;
  std::fprintf(stderr, "fuzz property broken: %s\n", what);
  std::abort();
}

/// The files framed in `input` (see the comment at the top), at most 1 + kMaxDataFiles.
inline std::vector<std::string_view> SplitFiles(std::span<const uint8_t> input) {
  std::vector<std::string_view> files;
  size_t at = 0;
  while (at + 4 <= input.size() && files.size() < 1 + kMaxDataFiles) {
    const uint32_t length =
        static_cast<uint32_t>(input[at]) | static_cast<uint32_t>(input[at + 1]) << 8 |
        static_cast<uint32_t>(input[at + 2]) << 16 | static_cast<uint32_t>(input[at + 3]) << 24;
    at += 4;
    const size_t taken = std::min<size_t>(length, input.size() - at);
    files.emplace_back(reinterpret_cast<const char*>(input.data() + at), taken);
    at += taken;
  }
  return files;
}

/// The framed form of `files`, which SplitFiles turns back into them.
inline std::vector<uint8_t> JoinFiles(const std::vector<std::vector<uint8_t>>& files) {
  std::vector<uint8_t> out;
  for (const std::vector<uint8_t>& file : files) {
    const uint32_t length = static_cast<uint32_t>(file.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(length >> (8 * i)));
    out.insert(out.end(), file.begin(), file.end());
  }
  return out;
}

inline void StoreU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

/// Rewrites the header and footer of an index around its body so that they are right; false
/// when `index` is too short to hold both.
inline bool RepairIndexEnvelope(std::vector<uint8_t>& index) {
  if (index.size() < format::kIndexHeaderBytes + format::kIndexFooterBytes) return false;
  uint8_t* bytes = index.data();
  StoreU64(bytes, format::kIndexMagic);
  StoreU64(bytes + 8, format::kFormatVersion);  // version u32, then flags u32 = 0
  const size_t footer = index.size() - format::kIndexFooterBytes;
  StoreU64(bytes + footer, footer - format::kIndexHeaderBytes);
  StoreU64(bytes + footer + 16, format::kIndexEndMagic);
  StoreU64(bytes + footer + 8, codec::Checksum(std::span<const uint8_t>(bytes, footer + 8)));
  return true;
}

}  // namespace asyncckpt::fuzz
