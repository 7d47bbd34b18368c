#include "src/codec/codec.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace asyncckpt::codec {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

// Smooth floats: the exponent and high mantissa bytes repeat, the low bytes are noise, which is
// what byte shuffling is for.
std::vector<uint8_t> SmoothFloats(size_t count) {
  std::vector<float> values(count);
  std::mt19937 rng(7);
  std::normal_distribution<float> noise(0.f, 1e-3f);
  for (size_t i = 0; i < count; ++i) values[i] = 1.0f + std::sin(i * 1e-3f) * 0.1f + noise(rng);
  std::vector<uint8_t> out(count * sizeof(float));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

CompressionOptions Options(CompressionKind kind, int level = 1, double min_saving = 0.05) {
  CompressionOptions options;
  options.kind = kind;
  options.level = level;
  options.min_saving = min_saving;
  return options;
}

class CodecTest : public ::testing::Test {
 protected:
  // Encodes and decodes `raw`, checking the bytes come back; returns the codec chosen.
  Codec RoundTrip(const std::vector<uint8_t>& raw, size_t elem_size,
                  const CompressionOptions& options) {
    Result<EncodedChunk> encoded = Encode(raw, elem_size, options, scratch_);
    EXPECT_TRUE(encoded.ok()) << encoded.status().ToString();
    if (!encoded.ok()) return Codec::kRaw;
    EXPECT_EQ(encoded->xxh3, Checksum(raw));
    EXPECT_LE(encoded->stored.size(), raw.size());
    const std::vector<uint8_t> stored(encoded->stored.begin(), encoded->stored.end());
    std::vector<uint8_t> back(raw.size(), 0xAB);
    Status status = Decode(encoded->codec, stored, elem_size, encoded->xxh3, back, decode_scratch_);
    EXPECT_TRUE(status.ok()) << status.ToString();
    EXPECT_EQ(back, raw);
    return encoded->codec;
  }

  Scratch scratch_;
  Scratch decode_scratch_;
};

TEST_F(CodecTest, ShuffleGroupsByteKOfEveryElement) {
  const std::vector<uint8_t> in = {0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23, 99, 98};
  std::vector<uint8_t> out(in.size());
  Shuffle(in.data(), in.size(), 4, out.data());
  const std::vector<uint8_t> expected = {0, 10, 20, 1, 11, 21, 2, 12, 22, 3, 13, 23, 99, 98};
  EXPECT_EQ(out, expected);
}

// The AVX2 kernel works 32 elements at a time and finishes the rest with a scalar loop: counts
// around and between multiples of 32 must agree with the scalar kernel byte for byte.
TEST_F(CodecTest, Avx2EightByteShuffleMatchesTheScalarKernel) {
  if (!KernelSupported(ShuffleKernel::kAvx2)) GTEST_SKIP() << "this CPU has no AVX2";
  for (size_t count : {0, 1, 31, 32, 33, 63, 64, 65, 100, 1000, 4099, 65537}) {
    const std::vector<uint8_t> in = RandomBytes(count * 8, static_cast<uint32_t>(count + 7));
    std::vector<uint8_t> scalar(in.size()), avx2(in.size());
    Shuffle8With(ShuffleKernel::kScalar, in.data(), count, scalar.data());
    Shuffle8With(ShuffleKernel::kAvx2, in.data(), count, avx2.data());
    ASSERT_EQ(avx2, scalar) << "shuffle of " << count << " elements";
    std::vector<uint8_t> back(in.size());
    Unshuffle(avx2.data(), avx2.size(), 8, back.data());
    ASSERT_EQ(back, in) << "unshuffle of " << count << " elements";
  }
}

TEST_F(CodecTest, ShuffleAndUnshuffleAreInversesForEveryElementSize) {
  for (size_t elem : {1, 2, 3, 4, 5, 8, 16}) {
    for (size_t n : {0, 1, 2, 7, 8, 15, 16, 17, 255, 256, 257, 1000, 4099}) {
      const std::vector<uint8_t> in = RandomBytes(n, static_cast<uint32_t>(elem * 1000 + n));
      std::vector<uint8_t> shuffled(n), back(n);
      Shuffle(in.data(), n, elem, shuffled.data());
      Unshuffle(shuffled.data(), n, elem, back.data());
      ASSERT_EQ(back, in) << "elem " << elem << " n " << n;
      // Byte k of element i lands at k * count + i; the tail keeps its place at the end.
      const size_t count = elem > 0 ? n / elem : 0;
      for (size_t i = 0; elem > 1 && i < count; ++i) {
        for (size_t k = 0; k < elem; ++k) {
          ASSERT_EQ(shuffled[k * count + i], in[i * elem + k]) << "elem " << elem << " n " << n;
        }
      }
      for (size_t t = count * elem; elem > 1 && t < n; ++t) ASSERT_EQ(shuffled[t], in[t]);
    }
  }
}

TEST_F(CodecTest, RoundTripsEveryElementSizeAndKind) {
  for (CompressionKind kind :
       {CompressionKind::kNone, CompressionKind::kZstd, CompressionKind::kShuffleZstd}) {
    for (size_t elem : {1, 2, 4, 8}) {
      for (size_t n : {1, 3, 8, 1001, 65536 + 5}) {
        std::vector<uint8_t> raw = RandomBytes(n, static_cast<uint32_t>(n + elem));
        // Half zeros so that compression pays off for part of the cases.
        for (size_t i = 0; i < n / 2; ++i) raw[i] = 0;
        RoundTrip(raw, elem, Options(kind));
      }
    }
  }
}

TEST_F(CodecTest, EmptyInputIsStoredRawAndRoundTrips) {
  const std::vector<uint8_t> empty;
  Result<EncodedChunk> encoded = Encode(empty, 4, Options(CompressionKind::kShuffleZstd), scratch_);
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  EXPECT_EQ(encoded->codec, Codec::kRaw);
  EXPECT_TRUE(encoded->stored.empty());
  EXPECT_EQ(encoded->xxh3, Checksum(empty));
  std::vector<uint8_t> dst;
  EXPECT_TRUE(Decode(Codec::kRaw, {}, 4, encoded->xxh3, dst, scratch_).ok());
}

TEST_F(CodecTest, IncompressibleDataIsStoredRawWithoutCopy) {
  const std::vector<uint8_t> raw = RandomBytes(1 << 16, 3);
  Result<EncodedChunk> encoded = Encode(raw, 4, Options(CompressionKind::kShuffleZstd), scratch_);
  ASSERT_TRUE(encoded.ok());
  EXPECT_EQ(encoded->codec, Codec::kRaw);
  EXPECT_EQ(encoded->stored.data(), raw.data());
  EXPECT_EQ(encoded->stored.size(), raw.size());
}

TEST_F(CodecTest, KindNoneForcesRawEvenForZeros) {
  const std::vector<uint8_t> zeros(4096, 0);
  EXPECT_EQ(RoundTrip(zeros, 4, Options(CompressionKind::kNone)), Codec::kRaw);
}

TEST_F(CodecTest, CompressibleDataIsStoredZstd) {
  std::vector<uint8_t> raw(1 << 16);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>("checkpoint"[i % 10]);
  EXPECT_EQ(RoundTrip(raw, 4, Options(CompressionKind::kZstd)), Codec::kZstd);
}

TEST_F(CodecTest, SmoothFloatsAreStoredShuffledAndSmallerThanPlainZstd) {
  const std::vector<uint8_t> raw = SmoothFloats(1 << 16);
  EXPECT_EQ(RoundTrip(raw, 4, Options(CompressionKind::kShuffleZstd)), Codec::kShuffleZstd);
  Result<EncodedChunk> shuffled = Encode(raw, 4, Options(CompressionKind::kShuffleZstd), scratch_);
  ASSERT_TRUE(shuffled.ok());
  const size_t shuffled_size = shuffled->stored.size();
  Result<EncodedChunk> plain = Encode(raw, 4, Options(CompressionKind::kZstd), scratch_);
  ASSERT_TRUE(plain.ok());
  EXPECT_LT(shuffled_size, plain->codec == Codec::kRaw ? raw.size() : plain->stored.size());
}

TEST_F(CodecTest, ShuffleOfSingleByteElementsIsPlainZstd) {
  const std::vector<uint8_t> zeros(4096, 0);
  EXPECT_EQ(RoundTrip(zeros, 1, Options(CompressionKind::kShuffleZstd)), Codec::kZstd);
}

TEST_F(CodecTest, SizesNotMultipleOfElementSizeRoundTripShuffled) {
  std::vector<uint8_t> raw = SmoothFloats(1000);
  raw.push_back(1);
  raw.push_back(2);
  raw.push_back(3);
  EXPECT_EQ(RoundTrip(raw, 4, Options(CompressionKind::kShuffleZstd)), Codec::kShuffleZstd);
  EXPECT_EQ(RoundTrip(raw, 8, Options(CompressionKind::kShuffleZstd)), Codec::kShuffleZstd);
}

TEST_F(CodecTest, MinSavingDecidesBetweenRawAndCompressed) {
  // Half the bytes zero, half random: zstd saves a bit under half.
  std::vector<uint8_t> raw = RandomBytes(1 << 16, 11);
  std::fill(raw.begin(), raw.begin() + raw.size() / 2, 0);
  EXPECT_EQ(RoundTrip(raw, 1, Options(CompressionKind::kZstd, 1, 0.3)), Codec::kZstd);
  EXPECT_EQ(RoundTrip(raw, 1, Options(CompressionKind::kZstd, 1, 0.6)), Codec::kRaw);
}

TEST_F(CodecTest, LevelComesPerCallIncludingFastModes) {
  const std::vector<uint8_t> raw = SmoothFloats(1 << 14);
  for (int level : {-7, -1, 1, 3, 19}) {
    EXPECT_EQ(RoundTrip(raw, 4, Options(CompressionKind::kShuffleZstd, level)), Codec::kShuffleZstd)
        << "level " << level;
  }
}

TEST_F(CodecTest, BadOptionsAndShortOutputAreInvalidArgument) {
  const std::vector<uint8_t> raw(100, 0);
  EXPECT_EQ(Encode(raw, 4, Options(CompressionKind::kZstd, 42), scratch_).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Encode(raw, 4, Options(CompressionKind::kZstd, 1, 1.5), scratch_).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<uint8_t> out(99);
  EXPECT_EQ(Encode(raw, 4, Options(CompressionKind::kZstd), scratch_, out).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(CodecTest, EncodeIntoCallerBufferPointsIntoIt) {
  const std::vector<uint8_t> raw(4096, 7);
  std::vector<uint8_t> out(raw.size());
  Result<EncodedChunk> encoded = Encode(raw, 4, Options(CompressionKind::kZstd), scratch_, out);
  ASSERT_TRUE(encoded.ok());
  EXPECT_EQ(encoded->codec, Codec::kZstd);
  EXPECT_EQ(encoded->stored.data(), out.data());
}

TEST_F(CodecTest, RawDecodeInPlaceChecksOnlyTheChecksum) {
  std::vector<uint8_t> raw = RandomBytes(1000, 5);
  const uint64_t sum = Checksum(raw);
  EXPECT_TRUE(Decode(Codec::kRaw, raw, 4, sum, raw, scratch_).ok());
  raw[500] ^= 1;
  EXPECT_EQ(Decode(Codec::kRaw, raw, 4, sum, raw, scratch_).code(), StatusCode::kCorruption);
}

class CodecCorruptionTest : public CodecTest {
 protected:
  void SetUp() override {
    raw_ = SmoothFloats(4096);
    Result<EncodedChunk> encoded =
        Encode(raw_, 4, Options(CompressionKind::kShuffleZstd), scratch_);
    ASSERT_TRUE(encoded.ok());
    ASSERT_EQ(encoded->codec, Codec::kShuffleZstd);
    stored_.assign(encoded->stored.begin(), encoded->stored.end());
    xxh3_ = encoded->xxh3;
  }
  Status DecodeStored(const std::vector<uint8_t>& stored, size_t raw_size,
                      std::vector<uint8_t>* dst = nullptr) {
    std::vector<uint8_t> local;
    if (dst == nullptr) dst = &local;
    dst->assign(raw_size, 0);
    return Decode(Codec::kShuffleZstd, stored, 4, xxh3_, *dst, decode_scratch_);
  }

  std::vector<uint8_t> raw_;
  std::vector<uint8_t> stored_;
  uint64_t xxh3_ = 0;
};

TEST_F(CodecCorruptionTest, NoBitFlipDecodesToWrongBytes) {
  // A flip in a field zstd does not need (e.g. the window size) may still decode to the same
  // bytes; what must never happen is OK with different bytes.
  size_t rejected = 0;
  for (size_t byte = 0; byte < stored_.size(); ++byte) {
    std::vector<uint8_t> bad = stored_;
    bad[byte] ^= static_cast<uint8_t>(1u << (byte % 8));
    std::vector<uint8_t> dst;
    Status status = DecodeStored(bad, raw_.size(), &dst);
    if (status.ok()) {
      ASSERT_EQ(dst, raw_) << "flip in byte " << byte << " decoded to other bytes";
    } else {
      ASSERT_EQ(status.code(), StatusCode::kCorruption) << "flip in byte " << byte;
      ++rejected;
    }
  }
  EXPECT_GT(rejected, stored_.size() * 9 / 10);
}

TEST_F(CodecCorruptionTest, TruncatedStoredBytesAreCorruption) {
  for (size_t n = 0; n < stored_.size(); n += std::max<size_t>(1, stored_.size() / 50)) {
    std::vector<uint8_t> bad(stored_.begin(), stored_.begin() + static_cast<ptrdiff_t>(n));
    EXPECT_EQ(DecodeStored(bad, raw_.size()).code(), StatusCode::kCorruption) << "length " << n;
  }
}

TEST_F(CodecCorruptionTest, WrongRawSizeIsCorruptionNamingTheFramesDeclaredSize) {
  // The frame header declares 16384 bytes; a raw size that differs is refused before decoding.
  Status shorter = DecodeStored(stored_, raw_.size() - 4);
  EXPECT_EQ(shorter.code(), StatusCode::kCorruption);
  EXPECT_NE(shorter.message().find("declares 16384 decoded bytes, the index says 16380"),
            std::string::npos)
      << shorter.message();
  Status longer = DecodeStored(stored_, raw_.size() + 4);
  EXPECT_EQ(longer.code(), StatusCode::kCorruption);
  EXPECT_NE(longer.message().find("declares 16384 decoded bytes, the index says 16388"),
            std::string::npos)
      << longer.message();
}

// A frame whose header leaves its content size out (zstd's streaming API may).
std::vector<uint8_t> FrameWithoutContentSize(const std::vector<uint8_t>& raw) {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
  std::vector<uint8_t> frame(ZSTD_compressBound(raw.size()));
  const size_t size = ZSTD_compress2(cctx, frame.data(), frame.size(), raw.data(), raw.size());
  ZSTD_freeCCtx(cctx);
  EXPECT_FALSE(ZSTD_isError(size));
  frame.resize(ZSTD_isError(size) ? 0 : size);
  return frame;
}

TEST_F(CodecCorruptionTest, FrameWithoutDeclaredSizeDecodingToMoreIsCorruption) {
  const std::vector<uint8_t> frame = FrameWithoutContentSize(std::vector<uint8_t>(4096, 7));
  ASSERT_EQ(ZSTD_getFrameContentSize(frame.data(), frame.size()), ZSTD_CONTENTSIZE_UNKNOWN);
  std::vector<uint8_t> dst(4000);
  Status status = Decode(Codec::kZstd, frame, 1, 0, dst, scratch_);
  EXPECT_EQ(status.code(), StatusCode::kCorruption);
  std::vector<uint8_t> exact(4096);
  EXPECT_TRUE(
      Decode(Codec::kZstd, frame, 1, Checksum(std::vector<uint8_t>(4096, 7)), exact, scratch_)
          .ok());
}

TEST_F(CodecCorruptionTest, BytesAfterTheFrameAreCorruption) {
  // A second frame after the first: zstd would decode both, the format allows one.
  std::vector<uint8_t> two = stored_;
  two.insert(two.end(), stored_.begin(), stored_.end());
  Status status = DecodeStored(two, raw_.size() * 2);
  EXPECT_EQ(status.code(), StatusCode::kCorruption);
  EXPECT_NE(status.message().find("the zstd frame ends after"), std::string::npos)
      << status.message();
}

TEST_F(CodecCorruptionTest, WrongChecksumIsCorruption) {
  xxh3_ ^= 1;
  Status status = DecodeStored(stored_, raw_.size());
  EXPECT_EQ(status.code(), StatusCode::kCorruption);
  EXPECT_NE(status.message().find("checksum mismatch"), std::string::npos) << status.message();
}

TEST_F(CodecCorruptionTest, RawChunkOfWrongSizeIsCorruption) {
  std::vector<uint8_t> dst(raw_.size() + 1);
  EXPECT_EQ(Decode(Codec::kRaw, raw_, 4, xxh3_, dst, scratch_).code(), StatusCode::kCorruption);
}

TEST(CodecNameTest, NamesAndBytes) {
  EXPECT_EQ(CodecName(Codec::kRaw), "raw");
  EXPECT_EQ(CodecName(Codec::kZstd), "zstd");
  EXPECT_EQ(CodecName(Codec::kShuffleZstd), "shuffle+zstd");
  EXPECT_EQ(CodecFromByte(0), Codec::kRaw);
  EXPECT_EQ(CodecFromByte(1), Codec::kZstd);
  EXPECT_EQ(CodecFromByte(2), Codec::kShuffleZstd);
  EXPECT_FALSE(CodecFromByte(3).has_value());
  EXPECT_FALSE(CodecFromByte(255).has_value());
}

}  // namespace
}  // namespace asyncckpt::codec
