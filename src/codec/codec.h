#pragma once

// The per-chunk codec: raw, zstd, or byte-shuffle + zstd, with an XXH3-64 of the raw bytes.
// It is on the hot path of every save and restore, so it never allocates per call once a
// Scratch has grown to the chunk size, and it reuses one zstd context per Scratch.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "asyncckpt/compression.h"
#include "asyncckpt/status.h"

namespace asyncckpt::codec {

/// How a chunk's bytes are stored. The numeric values are stored on disk: never renumber.
enum class Codec : uint8_t {
  /// The raw bytes, as they are.
  kRaw = 0,
  /// One zstd frame of the raw bytes.
  kZstd = 1,
  /// One zstd frame of the raw bytes byte-shuffled by the tensor's element size.
  kShuffleZstd = 2,
};

/// Number of codecs; every on-disk byte below it names one.
inline constexpr int kNumCodecs = 3;

/// "raw", "zstd" or "shuffle+zstd".
std::string_view CodecName(Codec codec);
/// Maps an on-disk byte to a codec; nullopt when the byte names none.
std::optional<Codec> CodecFromByte(uint8_t byte);

/// XXH3-64 (seed 0) of `bytes`: the checksum stored for every chunk.
uint64_t Checksum(std::span<const uint8_t> bytes);

/// Regroups `src` (n bytes) so that byte k of every element comes before byte k+1 of any
/// element (blosc's shuffle); the n % elem_size tail bytes are copied as they are, at the end.
/// `dst` holds n bytes and must not overlap `src`. elem_size 0 or 1 copies.
void Shuffle(const uint8_t* src, size_t n, size_t elem_size, uint8_t* dst);
/// The inverse of Shuffle with the same n and elem_size. `dst` must not overlap `src`.
void Unshuffle(const uint8_t* src, size_t n, size_t elem_size, uint8_t* dst);

/// The kernels Shuffle chooses between for 8-byte elements (tests and benchmarks compare them;
/// the library picks kAvx2 where the CPU has AVX2). Unshuffle's scalar kernel is already fast.
enum class ShuffleKernel {
  /// Portable C++, auto-vectorised by the compiler.
  kScalar,
  /// AVX2 byte shuffles and an 8x8 word transpose, 32 elements a step.
  kAvx2,
};
/// True when this CPU can run `kernel` (kScalar always).
bool KernelSupported(ShuffleKernel kernel);
/// Shuffle of `count` whole 8-byte elements with `kernel` (kScalar where the CPU lacks it).
void Shuffle8With(ShuffleKernel kernel, const uint8_t* src, size_t count, uint8_t* dst);

/// The state behind a Scratch (defined in codec.cc).
struct ScratchState;

/// Per-thread working memory and zstd contexts, reused across calls. Not thread-safe: one
/// Scratch per thread. Move-only (a moved-from Scratch must not be used again); frees everything
/// in its destructor.
class Scratch {
 public:
  Scratch();
  ~Scratch();
  Scratch(Scratch&&) noexcept;
  Scratch& operator=(Scratch&&) noexcept;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

 private:
  friend struct ScratchAccess;
  std::unique_ptr<ScratchState> state_;
};

/// The outcome of encoding one chunk.
struct EncodedChunk {
  /// The codec chosen (kRaw when compression did not pay off, or was not asked for).
  Codec codec = Codec::kRaw;
  /// The bytes to store. For kRaw they are the caller's raw input itself; otherwise they live
  /// in the output buffer given to Encode (or in the Scratch, valid until its next use).
  std::span<const uint8_t> stored;
  /// XXH3-64 of the raw bytes.
  uint64_t xxh3 = 0;
};

/// Encodes one chunk of `raw` bytes holding elements of `elem_size` bytes (1 for untyped).
/// `options` comes per call, so a caller under load can lower the level, or force raw with
/// kind = kNone, chunk by chunk. The chunk is stored raw unless compression saves at least
/// options.min_saving of its bytes; shuffle with elem_size <= 1 is plain zstd (shuffling would
/// change nothing). Compressed bytes are written to `out`, which must hold raw.size() bytes
/// (a result that would not fit could not be smaller than the raw chunk). InvalidArgument for
/// bad options or a short `out`; Internal when zstd fails.
Result<EncodedChunk> Encode(std::span<const uint8_t> raw, size_t elem_size,
                            const CompressionOptions& options, Scratch& scratch,
                            std::span<uint8_t> out);
/// As above, with the compressed bytes kept in `scratch` (valid until its next use).
Result<EncodedChunk> Encode(std::span<const uint8_t> raw, size_t elem_size,
                            const CompressionOptions& options, Scratch& scratch);

/// Decodes `stored` (encoded with `codec` from elements of `elem_size` bytes) into `dst`,
/// which must be exactly the raw size, and checks that the decoded bytes are exactly dst.size()
/// long and that their XXH3-64 equals `expected_xxh3`. For kRaw, `stored` may be `dst` itself
/// (read in place: only the checksum is checked). Corruption saying what is wrong (the caller
/// adds the file, tensor and chunk); dst's content is unspecified after a failure.
Status Decode(Codec codec, std::span<const uint8_t> stored, size_t elem_size,
              uint64_t expected_xxh3, std::span<uint8_t> dst, Scratch& scratch);

}  // namespace asyncckpt::codec
