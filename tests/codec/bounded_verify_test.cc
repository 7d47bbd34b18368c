// Tests of src/codec/bounded_verify.cc: VerifyStreaming agrees with Decode on good and damaged
// chunks, and checks a 1 GiB "decompression bomb" in a few MiB of memory.

#include "src/codec/bounded_verify.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "src/codec/codec.h"

namespace asyncckpt::codec {
namespace {

// Varied bytes that still compress: a tail that is not a whole element on purpose.
std::vector<uint8_t> Sample(size_t n) {
  std::vector<uint8_t> raw(n);
  uint32_t x = 12345;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    raw[i] = static_cast<uint8_t>((i % 64 < 48) ? (i / 64) : (x >> 24));
  }
  return raw;
}

std::vector<uint8_t> Encoded(const std::vector<uint8_t>& raw, size_t elem, Codec* codec) {
  Scratch scratch;
  std::vector<uint8_t> out(raw.size());
  Result<EncodedChunk> encoded = Encode(
      raw, elem,
      CompressionOptions{.kind = CompressionKind::kShuffleZstd, .level = 3, .min_saving = 0.05},
      scratch, out);
  EXPECT_TRUE(encoded.ok()) << encoded.status().ToString();
  *codec = encoded->codec;
  out.resize(encoded->stored.size());
  return out;
}

TEST(VerifyStreamingTest, AgreesWithDecodeOnGoodAndDamagedChunks) {
  for (size_t elem : {1u, 2u, 4u, 8u, 16u}) {
    SCOPED_TRACE("element size " + std::to_string(elem));
    const std::vector<uint8_t> raw = Sample((1 << 20) + 3);
    Codec codec = Codec::kRaw;
    std::vector<uint8_t> stored = Encoded(raw, elem, &codec);
    ASSERT_NE(codec, Codec::kRaw);
    const uint64_t xxh3 = Checksum(raw);
    EXPECT_TRUE(VerifyStreaming(codec, stored, elem, raw.size(), xxh3).ok());
    EXPECT_TRUE(VerifyStreaming(Codec::kZstd, stored, elem, raw.size(), xxh3).ok() ==
                (codec == Codec::kZstd || elem == 1));
    EXPECT_EQ(VerifyStreaming(codec, stored, elem, raw.size(), xxh3 ^ 1).code(),
              StatusCode::kCorruption);
    EXPECT_EQ(VerifyStreaming(codec, stored, elem, raw.size() + 1, xxh3).code(),
              StatusCode::kCorruption);
    std::vector<uint8_t> cut(stored.begin(), stored.end() - 9);
    EXPECT_EQ(VerifyStreaming(codec, cut, elem, raw.size(), xxh3).code(), StatusCode::kCorruption);
    std::vector<uint8_t> longer = stored;
    longer.push_back(0);
    EXPECT_EQ(VerifyStreaming(codec, longer, elem, raw.size(), xxh3).code(),
              StatusCode::kCorruption);
    std::vector<uint8_t> flipped = stored;
    flipped[flipped.size() / 2] ^= 0x40;
    EXPECT_EQ(VerifyStreaming(codec, flipped, elem, raw.size(), xxh3).code(),
              StatusCode::kCorruption);
  }
}

// A zstd frame of `bytes` zeros, built without holding them.
std::vector<uint8_t> ZeroFrame(uint64_t bytes) {
  ZSTD_CCtx* ctx = ZSTD_createCCtx();
  ZSTD_CCtx_setPledgedSrcSize(ctx, bytes);
  std::vector<uint8_t> zeros(1 << 20, 0), frame, out(ZSTD_CStreamOutSize());
  for (uint64_t left = bytes;;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, zeros.size()));
    left -= n;
    ZSTD_inBuffer in = {zeros.data(), n, 0};
    const ZSTD_EndDirective mode = left == 0 ? ZSTD_e_end : ZSTD_e_continue;
    size_t rc;
    do {
      ZSTD_outBuffer o = {out.data(), out.size(), 0};
      rc = ZSTD_compressStream2(ctx, &o, &in, mode);
      EXPECT_FALSE(ZSTD_isError(rc));
      frame.insert(frame.end(), out.data(), out.data() + o.pos);
    } while (mode == ZSTD_e_end ? rc != 0 : in.pos < in.size);
    if (left == 0) break;
  }
  ZSTD_freeCCtx(ctx);
  return frame;
}

uint64_t ZerosChecksum(uint64_t bytes) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<uint8_t> zeros(1 << 20, 0);
  for (uint64_t left = bytes; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, zeros.size()));
    XXH3_64bits_update(state, zeros.data(), n);
    left -= n;
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

long MaxRssKiB() {
  struct rusage usage;
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

TEST(VerifyStreamingTest, AOneGiBBombIsCheckedInBoundedMemory) {
  constexpr uint64_t kGiB = 1ull << 30;
  const std::vector<uint8_t> bomb = ZeroFrame(kGiB);
  ASSERT_LT(bomb.size(), kGiB / 16000) << "not much of a bomb";
  const uint64_t xxh3 = ZerosChecksum(kGiB);
  const long before = MaxRssKiB();
  EXPECT_TRUE(VerifyStreaming(Codec::kZstd, bomb, 4, kGiB, xxh3).ok());
  EXPECT_TRUE(VerifyStreaming(Codec::kShuffleZstd, bomb, 4, kGiB, xxh3).ok());
  EXPECT_EQ(VerifyStreaming(Codec::kZstd, bomb, 4, kGiB, xxh3 ^ 1).code(), StatusCode::kCorruption);
  // Decoding it whole would take 1 GiB (2 GiB shuffled); each plane's window is at most 8 MiB.
  EXPECT_LT(MaxRssKiB() - before, 64 * 1024) << "KiB of peak memory added";
}

}  // namespace
}  // namespace asyncckpt::codec
