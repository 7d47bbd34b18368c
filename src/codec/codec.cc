#include "src/codec/codec.h"

#include <xxhash.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "src/util/byte_buffer.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace asyncckpt::codec {

// The build's default -O2 keeps GCC's "very cheap" vectoriser model, which refuses the
// interleaved loads these loops need; at O3 they run at memory speed (tens of GB/s instead of
// 2-7). Clang vectorises them at -O2 and has no such attribute.
#if defined(__GNUC__) && !defined(__clang__)
#define ASYNCCKPT_VECTORIZE __attribute__((optimize("O3")))
#else
#define ASYNCCKPT_VECTORIZE
#endif

namespace {

template <size_t E>
ASYNCCKPT_VECTORIZE void ShuffleFixed(const uint8_t* __restrict src, size_t count,
                                      uint8_t* __restrict dst) {
  for (size_t i = 0; i < count; ++i) {
    for (size_t k = 0; k < E; ++k) dst[k * count + i] = src[i * E + k];
  }
}

// Eight streams of stride-8 loads defeat the element-major loop above; one output stream at a
// time over a block that stays in L1 vectorises well instead.
ASYNCCKPT_VECTORIZE void Shuffle8(const uint8_t* __restrict src, size_t count,
                                  uint8_t* __restrict dst) {
  constexpr size_t kBlock = 256;
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t n = std::min(kBlock, count - start);
    const uint8_t* block = src + start * 8;
    for (size_t k = 0; k < 8; ++k) {
      uint8_t* __restrict out = dst + k * count + start;
      for (size_t i = 0; i < n; ++i) out[i] = block[i * 8 + k];
    }
  }
}

template <size_t E>
ASYNCCKPT_VECTORIZE void UnshuffleFixed(const uint8_t* __restrict src, size_t count,
                                        uint8_t* __restrict dst) {
  for (size_t i = 0; i < count; ++i) {
    for (size_t k = 0; k < E; ++k) dst[i * E + k] = src[k * count + i];
  }
}

// ---- AVX2 kernels for 8-byte elements ----------------------------------------------------------
// 32 elements (256 bytes, eight registers) per step: within each 128-bit lane (two elements)
// pair up byte k of both elements (a 16-bit word per k); an 8x8 transpose of those words, lane
// by lane, gathers word k of every pair in register k: 32 bytes of stream k. Built with a target
// attribute and chosen at run time, so the build needs no -mavx2. Only the shuffle has one: the
// same steps backwards ran at 11 GiB/s where GCC's vectorised scalar unshuffle runs at 28
// (codec_bench, 4 MiB chunks), so Unshuffle keeps the scalar kernel.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ASYNCCKPT_HAVE_AVX2_KERNELS 1
#define ASYNCCKPT_AVX2 __attribute__((target("avx2")))

ASYNCCKPT_AVX2 inline void TransposeWords8x8(__m256i r[8]) {
  __m256i a[8], b[8];
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm256_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm256_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3, then rows 4-7
    const int o = 4 * h;
    b[o + 0] = _mm256_unpacklo_epi32(a[o + 0], a[o + 2]);
    b[o + 1] = _mm256_unpackhi_epi32(a[o + 0], a[o + 2]);
    b[o + 2] = _mm256_unpacklo_epi32(a[o + 1], a[o + 3]);
    b[o + 3] = _mm256_unpackhi_epi32(a[o + 1], a[o + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    r[2 * i] = _mm256_unpacklo_epi64(b[i], b[i + 4]);
    r[2 * i + 1] = _mm256_unpackhi_epi64(b[i], b[i + 4]);
  }
}

// Elements per block: the eight streams are written 256 bytes at a time from a block buffer in
// L1, rather than 32 bytes at a time at eight addresses 4 KiB-aliased to each other.
constexpr size_t kAvx2Block = 256;

// Register k takes elements 2k, 2k+1 in its low lane and 16+2k, 17+2k in its high lane, so
// that after the transpose register k holds byte k of elements 0-15 (low) and 16-31 (high), in
// order: 32 port-5 shuffles per 256 bytes, no cross-lane fix-up.
ASYNCCKPT_AVX2 inline void ShuffleStep(const uint8_t* src, uint8_t* out, size_t out_stride) {
  const __m256i pair_bytes = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15,
                                              0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  __m256i r[8];
  for (int k = 0; k < 8; ++k) {
    const auto* low = reinterpret_cast<const __m128i*>(src + static_cast<size_t>(k) * 16);
    const auto* high = reinterpret_cast<const __m128i*>(src + 128 + static_cast<size_t>(k) * 16);
    r[k] = _mm256_shuffle_epi8(_mm256_loadu2_m128i(high, low), pair_bytes);
  }
  TransposeWords8x8(r);
  for (int k = 0; k < 8; ++k) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + static_cast<size_t>(k) * out_stride),
                        r[k]);
  }
}

ASYNCCKPT_AVX2 void Shuffle8Avx2(const uint8_t* src, size_t count, uint8_t* dst) {
  alignas(32) uint8_t block[8 * kAvx2Block];
  const size_t blocked = count / kAvx2Block * kAvx2Block;
  for (size_t start = 0; start < blocked; start += kAvx2Block) {
    for (size_t j = 0; j < kAvx2Block; j += 32) {
      ShuffleStep(src + (start + j) * 8, block + j, kAvx2Block);
    }
    for (size_t k = 0; k < 8; ++k) {
      std::memcpy(dst + k * count + start, block + k * kAvx2Block, kAvx2Block);
    }
  }
  const size_t vectorised = count / 32 * 32;
  for (size_t j = blocked; j < vectorised; j += 32) ShuffleStep(src + j * 8, dst + j, count);
  for (size_t i = vectorised; i < count; ++i) {
    for (size_t k = 0; k < 8; ++k) dst[k * count + i] = src[i * 8 + k];
  }
}

bool CpuHasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#else
bool CpuHasAvx2() { return false; }
#endif

void ShuffleGeneric(const uint8_t* src, size_t count, size_t elem, uint8_t* dst) {
  for (size_t k = 0; k < elem; ++k) {
    for (size_t i = 0; i < count; ++i) dst[k * count + i] = src[i * elem + k];
  }
}

void UnshuffleGeneric(const uint8_t* src, size_t count, size_t elem, uint8_t* dst) {
  for (size_t i = 0; i < count; ++i) {
    for (size_t k = 0; k < elem; ++k) dst[i * elem + k] = src[k * count + i];
  }
}

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* ctx) const { ZSTD_freeCCtx(ctx); }
};
struct DCtxDeleter {
  void operator()(ZSTD_DCtx* ctx) const { ZSTD_freeDCtx(ctx); }
};

}  // namespace

struct ScratchState {
  std::unique_ptr<ZSTD_CCtx, CCtxDeleter> cctx;
  std::unique_ptr<ZSTD_DCtx, DCtxDeleter> dctx;
  ByteBuffer shuffled;  // shuffled raw bytes before compression, or decompressed before unshuffle
  ByteBuffer output;    // compressed bytes when the caller gives no output buffer
};

struct ScratchAccess {
  static ScratchState& Get(Scratch& scratch) { return *scratch.state_; }
};

Scratch::Scratch() : state_(std::make_unique<ScratchState>()) {}
Scratch::~Scratch() = default;
Scratch::Scratch(Scratch&&) noexcept = default;
Scratch& Scratch::operator=(Scratch&&) noexcept = default;

std::string_view CodecName(Codec codec) {
  switch (codec) {
    case Codec::kRaw:
      return "raw";
    case Codec::kZstd:
      return "zstd";
    case Codec::kShuffleZstd:
      return "shuffle+zstd";
  }
  return "invalid";
}

std::optional<Codec> CodecFromByte(uint8_t byte) {
  if (byte >= kNumCodecs) return std::nullopt;
  return static_cast<Codec>(byte);
}

uint64_t Checksum(std::span<const uint8_t> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

bool KernelSupported(ShuffleKernel kernel) {
  return kernel == ShuffleKernel::kScalar || CpuHasAvx2();
}

void Shuffle8With(ShuffleKernel kernel, const uint8_t* src, size_t count, uint8_t* dst) {
#ifdef ASYNCCKPT_HAVE_AVX2_KERNELS
  if (kernel == ShuffleKernel::kAvx2 && CpuHasAvx2()) return Shuffle8Avx2(src, count, dst);
#endif
  (void)kernel;
  Shuffle8(src, count, dst);
}

void Shuffle(const uint8_t* src, size_t n, size_t elem_size, uint8_t* dst) {
  if (elem_size <= 1 || n < elem_size) {
    if (n > 0) std::memcpy(dst, src, n);
    return;
  }
  const size_t count = n / elem_size;
  switch (elem_size) {
    case 2:
      ShuffleFixed<2>(src, count, dst);
      break;
    case 4:
      ShuffleFixed<4>(src, count, dst);
      break;
    case 8:
      Shuffle8With(CpuHasAvx2() ? ShuffleKernel::kAvx2 : ShuffleKernel::kScalar, src, count, dst);
      break;
    default:
      ShuffleGeneric(src, count, elem_size, dst);
      break;
  }
  const size_t body = count * elem_size;
  if (body < n) std::memcpy(dst + body, src + body, n - body);
}

void Unshuffle(const uint8_t* src, size_t n, size_t elem_size, uint8_t* dst) {
  if (elem_size <= 1 || n < elem_size) {
    if (n > 0) std::memcpy(dst, src, n);
    return;
  }
  const size_t count = n / elem_size;
  switch (elem_size) {
    case 2:
      UnshuffleFixed<2>(src, count, dst);
      break;
    case 4:
      UnshuffleFixed<4>(src, count, dst);
      break;
    case 8:
      UnshuffleFixed<8>(src, count, dst);
      break;
    default:
      UnshuffleGeneric(src, count, elem_size, dst);
      break;
  }
  const size_t body = count * elem_size;
  if (body < n) std::memcpy(dst + body, src + body, n - body);
}

namespace {

EncodedChunk Raw(std::span<const uint8_t> raw, uint64_t xxh3) {
  return EncodedChunk{Codec::kRaw, raw, xxh3};
}

// The most compressed bytes worth keeping: anything longer saves less than min_saving.
size_t CompressedLimit(size_t raw_size, double min_saving) {
  const double limit = std::floor(static_cast<double>(raw_size) * (1.0 - min_saving));
  return limit <= 0 ? 0 : static_cast<size_t>(limit);
}

Result<size_t> Compress(ZSTD_CCtx* cctx, int level, const uint8_t* src, size_t n, uint8_t* dst,
                        size_t capacity, bool* too_big) {
  *too_big = false;
  size_t rc = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  if (ZSTD_isError(rc)) {
    return Status::InvalidArgument("zstd level " + std::to_string(level) + ": " +
                                   ZSTD_getErrorName(rc));
  }
  rc = ZSTD_compress2(cctx, dst, capacity, src, n);
  if (ZSTD_isError(rc)) {
    // The output is capped at the largest size worth keeping, so "too small" just means
    // "does not pay off": the chunk is stored raw.
    if (ZSTD_getErrorCode(rc) == ZSTD_error_dstSize_tooSmall) {
      *too_big = true;
      return size_t{0};
    }
    return Status::Internal(std::string("zstd compression failed: ") + ZSTD_getErrorName(rc));
  }
  return rc;
}

}  // namespace

Result<EncodedChunk> Encode(std::span<const uint8_t> raw, size_t elem_size,
                            const CompressionOptions& options, Scratch& scratch,
                            std::span<uint8_t> out) {
  Status valid = ValidateCompressionOptions(options);
  if (!valid.ok()) return valid;
  if (out.size() < raw.size()) {
    return Status::InvalidArgument("codec output buffer holds " + std::to_string(out.size()) +
                                   " bytes, the chunk needs " + std::to_string(raw.size()));
  }
  const uint64_t xxh3 = Checksum(raw);
  const size_t limit = CompressedLimit(raw.size(), options.min_saving);
  if (options.kind == CompressionKind::kNone || raw.empty() || limit == 0) return Raw(raw, xxh3);

  ScratchState& s = ScratchAccess::Get(scratch);
  if (!s.cctx) {
    s.cctx.reset(ZSTD_createCCtx());
    if (!s.cctx) return Status::Internal("cannot create a zstd compression context");
  }
  const bool shuffle = options.kind == CompressionKind::kShuffleZstd && elem_size > 1;
  const uint8_t* src = raw.data();
  if (shuffle) {
    uint8_t* shuffled = s.shuffled.reserve(raw.size());
    Shuffle(raw.data(), raw.size(), elem_size, shuffled);
    src = shuffled;
  }
  bool too_big = false;
  Result<size_t> size =
      Compress(s.cctx.get(), options.level, src, raw.size(), out.data(), limit, &too_big);
  if (!size.ok()) return size.status();
  if (too_big) return Raw(raw, xxh3);
  return EncodedChunk{shuffle ? Codec::kShuffleZstd : Codec::kZstd, out.first(*size), xxh3};
}

Result<EncodedChunk> Encode(std::span<const uint8_t> raw, size_t elem_size,
                            const CompressionOptions& options, Scratch& scratch) {
  uint8_t* out = ScratchAccess::Get(scratch).output.reserve(raw.size());
  return Encode(raw, elem_size, options, scratch, std::span<uint8_t>(out, raw.size()));
}

namespace {

Status Decompress(ScratchState& s, std::span<const uint8_t> stored, uint8_t* dst, size_t n) {
  if (!s.dctx) {
    s.dctx.reset(ZSTD_createDCtx());
    if (!s.dctx) return Status::Internal("cannot create a zstd decompression context");
  }
  // The stored bytes must be exactly one frame whose header, when it declares a content size,
  // declares n: a mismatch is named here, before any decoding.
  const size_t frame_bytes = ZSTD_findFrameCompressedSize(stored.data(), stored.size());
  if (ZSTD_isError(frame_bytes)) {
    return Status::Corruption(std::string("the stored bytes are not a zstd frame: ") +
                              ZSTD_getErrorName(frame_bytes));
  }
  if (frame_bytes != stored.size()) {
    return Status::Corruption("the zstd frame ends after " + std::to_string(frame_bytes) + " of " +
                              std::to_string(stored.size()) + " stored bytes");
  }
  const unsigned long long declared = ZSTD_getFrameContentSize(stored.data(), stored.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR) {
    return Status::Corruption("the zstd frame header is damaged");
  }
  if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != n) {
    return Status::Corruption("the zstd frame declares " + std::to_string(declared) +
                              " decoded bytes, the index says " + std::to_string(n));
  }
  // A frame without a declared size that decodes to more than n bytes fails here with
  // "destination too small" instead of writing past dst.
  const size_t rc = ZSTD_decompressDCtx(s.dctx.get(), dst, n, stored.data(), stored.size());
  if (ZSTD_isError(rc)) {
    return Status::Corruption(std::string("zstd cannot decode the stored bytes: ") +
                              ZSTD_getErrorName(rc));
  }
  if (rc != n) {
    return Status::Corruption("stored bytes decode to " + std::to_string(rc) + " bytes, expected " +
                              std::to_string(n));
  }
  return Status::OK();
}

char HexDigit(unsigned v) { return static_cast<char>(v < 10 ? '0' + v : 'a' + (v - 10)); }

std::string Hex(uint64_t value) {
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) out[static_cast<size_t>(i)] = HexDigit(value & 0xf);
  return out;
}

}  // namespace

Status Decode(Codec codec, std::span<const uint8_t> stored, size_t elem_size,
              uint64_t expected_xxh3, std::span<uint8_t> dst, Scratch& scratch) {
  ScratchState& s = ScratchAccess::Get(scratch);
  switch (codec) {
    case Codec::kRaw:
      if (stored.size() != dst.size()) {
        return Status::Corruption("raw chunk holds " + std::to_string(stored.size()) +
                                  " bytes, expected " + std::to_string(dst.size()));
      }
      if (!dst.empty() && stored.data() != dst.data()) {
        std::memcpy(dst.data(), stored.data(), dst.size());
      }
      break;
    case Codec::kZstd: {
      Status status = Decompress(s, stored, dst.data(), dst.size());
      if (!status.ok()) return status;
      break;
    }
    case Codec::kShuffleZstd: {
      uint8_t* shuffled = s.shuffled.reserve(dst.size());
      Status status = Decompress(s, stored, shuffled, dst.size());
      if (!status.ok()) return status;
      Unshuffle(shuffled, dst.size(), elem_size, dst.data());
      break;
    }
    default:
      return Status::Corruption("unknown codec " + std::to_string(static_cast<int>(codec)));
  }
  const uint64_t actual = Checksum(dst);
  if (actual != expected_xxh3) {
    return Status::Corruption("checksum mismatch: XXH3 of the decoded bytes is " + Hex(actual) +
                              ", the index says " + Hex(expected_xxh3));
  }
  return Status::OK();
}

}  // namespace asyncckpt::codec
