#pragma once

// Checking a large compressed chunk's checksum without holding its decoded bytes, so that a
// "decompression bomb" (a chunk of a few KiB that claims 1 GiB, within kMaxZstdRatio) costs a
// verify bounded memory, however many such chunks a checkpoint holds.

#include <cstddef>
#include <cstdint>
#include <span>

#include "asyncckpt/status.h"
#include "src/codec/codec.h"

namespace asyncckpt::codec {

/// Chunks whose raw size is above this are verified by VerifyStreaming rather than decoded
/// whole (CheckpointReader::verify). Every chunk the writer makes by default (4 MiB) is below.
inline constexpr uint64_t kStreamingVerifyBytes = 16ull << 20;

/// Largest zstd window (log2) a streamed frame may ask for: levels up to 19, the most
/// CompressionOptions allows, use at most 2^23. A frame that needs more was not written by this
/// library and is Corruption.
inline constexpr int kStreamingVerifyMaxWindowLog = 23;

/// The checks of Decode (one zstd frame filling `stored`, decoding to exactly `raw_bytes`, whose
/// XXH3-64 in raw order is `expected_xxh3`) for kZstd and kShuffleZstd, in bounded memory: at
/// most one zstd window per byte plane (elem_size of them for kShuffleZstd, one for kZstd, each
/// at most 2^kStreamingVerifyMaxWindowLog bytes) plus a few 64 KiB buffers. A shuffled chunk
/// is decoded once per byte plane, each pass reading its plane alongside the others, so it
/// costs up to (elem_size + 1) / 2 times the decoding work of Decode. InvalidArgument for
/// kRaw; Corruption saying what is wrong; ResourceExhausted when zstd cannot get its memory.
Status VerifyStreaming(Codec codec, std::span<const uint8_t> stored, size_t elem_size,
                       uint64_t raw_bytes, uint64_t expected_xxh3);

}  // namespace asyncckpt::codec
