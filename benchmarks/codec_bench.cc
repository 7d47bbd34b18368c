// Throughput of the per-chunk codec on 4 MiB chunks, the engine's default chunk size: byte
// shuffle and unshuffle by element size, encode and decode for each codec the savers offer,
// and the XXH3 checksum every chunk pays. The data imitates trained float32 weights: a smooth
// signal plus noise, so exponents and high mantissa bytes repeat and low bytes do not.

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "asyncckpt/compression.h"
#include "src/codec/codec.h"

namespace asyncckpt::codec {
namespace {

constexpr size_t kChunkBytes = 4u << 20;

// A smoothly varying signal (several slow sines, as rows of a weight matrix drift) plus
// Gaussian noise of about a tenth of its amplitude: float32, kChunkBytes of it.
const std::vector<uint8_t>& WeightLikeChunk() {
  static const std::vector<uint8_t> chunk = [] {
    std::vector<float> values(kChunkBytes / sizeof(float));
    std::mt19937 rng(1234);
    std::normal_distribution<float> noise(0.f, 0.002f);
    for (size_t i = 0; i < values.size(); ++i) {
      const float x = static_cast<float>(i);
      values[i] = 0.02f * std::sin(x * 1.3e-3f) + 0.01f * std::sin(x * 7.1e-5f + 0.5f) + noise(rng);
    }
    std::vector<uint8_t> bytes(kChunkBytes);
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return bytes;
  }();
  return chunk;
}

void BM_Shuffle(benchmark::State& state) {
  const size_t elem = static_cast<size_t>(state.range(0));
  const std::vector<uint8_t>& src = WeightLikeChunk();
  std::vector<uint8_t> dst(src.size());
  for (auto _ : state) {
    Shuffle(src.data(), src.size(), elem, dst.data());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * src.size()));
}
BENCHMARK(BM_Shuffle)->ArgName("elem")->Arg(2)->Arg(4)->Arg(8);

void BM_Unshuffle(benchmark::State& state) {
  const size_t elem = static_cast<size_t>(state.range(0));
  const std::vector<uint8_t>& raw = WeightLikeChunk();
  std::vector<uint8_t> shuffled(raw.size());
  Shuffle(raw.data(), raw.size(), elem, shuffled.data());
  std::vector<uint8_t> dst(raw.size());
  for (auto _ : state) {
    Unshuffle(shuffled.data(), shuffled.size(), elem, dst.data());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  if (dst != raw) state.SkipWithError("unshuffle did not restore the chunk");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * raw.size()));
}
BENCHMARK(BM_Unshuffle)->ArgName("elem")->Arg(2)->Arg(4)->Arg(8);

// The two shuffle kernels for 8-byte elements side by side (BM_Shuffle/8 runs the one the CPU
// picks).
void BM_Shuffle8Kernel(benchmark::State& state) {
  const auto kernel = static_cast<ShuffleKernel>(state.range(0));
  if (!KernelSupported(kernel)) return state.SkipWithError("this CPU lacks the kernel");
  const std::vector<uint8_t>& src = WeightLikeChunk();
  std::vector<uint8_t> dst(src.size());
  for (auto _ : state) {
    Shuffle8With(kernel, src.data(), src.size() / 8, dst.data());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * src.size()));
}
BENCHMARK(BM_Shuffle8Kernel)->ArgName("avx2")->Arg(0)->Arg(1);

void BM_Checksum(benchmark::State& state) {
  const std::vector<uint8_t>& raw = WeightLikeChunk();
  for (auto _ : state) benchmark::DoNotOptimize(Checksum(raw));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * raw.size()));
}
BENCHMARK(BM_Checksum);

CompressionOptions Options(CompressionKind kind, int level) {
  CompressionOptions options;
  options.kind = kind;
  options.level = level;
  return options;
}

// Reports what every save pays per chunk: the ratio is raw bytes over stored bytes, 1.0 when
// the codec chose to store the chunk raw.
void BM_Encode(benchmark::State& state, CompressionKind kind, int level) {
  const std::vector<uint8_t>& raw = WeightLikeChunk();
  const CompressionOptions options = Options(kind, level);
  Scratch scratch;
  std::vector<uint8_t> out(raw.size());
  size_t stored = raw.size();
  for (auto _ : state) {
    Result<EncodedChunk> encoded = Encode(raw, sizeof(float), options, scratch, out);
    if (!encoded.ok()) {
      state.SkipWithError(encoded.status().ToString().c_str());
      return;
    }
    stored = encoded->stored.size();
    benchmark::DoNotOptimize(encoded->stored.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * raw.size()));
  state.counters["ratio"] = static_cast<double>(raw.size()) / static_cast<double>(stored);
}
BENCHMARK_CAPTURE(BM_Encode, raw, CompressionKind::kNone, 1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, zstd_l1, CompressionKind::kZstd, 1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, shuffle_zstd_l1, CompressionKind::kShuffleZstd, 1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, shuffle_zstd_l3, CompressionKind::kShuffleZstd, 3)
    ->Unit(benchmark::kMillisecond);

// Decoding includes the checksum of the decoded bytes, as every restore does.
void BM_Decode(benchmark::State& state, CompressionKind kind, int level) {
  const std::vector<uint8_t>& raw = WeightLikeChunk();
  Scratch scratch;
  std::vector<uint8_t> out(raw.size());
  Result<EncodedChunk> encoded = Encode(raw, sizeof(float), Options(kind, level), scratch, out);
  if (!encoded.ok()) {
    state.SkipWithError(encoded.status().ToString().c_str());
    return;
  }
  // Kept apart from `raw`, so a raw chunk is decoded from a copy as a restore reads it.
  const std::vector<uint8_t> stored(encoded->stored.begin(), encoded->stored.end());
  std::vector<uint8_t> dst(raw.size());
  for (auto _ : state) {
    Status status = Decode(encoded->codec, stored, sizeof(float), encoded->xxh3, dst, scratch);
    if (!status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  if (dst != raw) state.SkipWithError("decode did not restore the chunk");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * raw.size()));
  state.counters["ratio"] = static_cast<double>(raw.size()) / static_cast<double>(stored.size());
}
BENCHMARK_CAPTURE(BM_Decode, raw, CompressionKind::kNone, 1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, zstd_l1, CompressionKind::kZstd, 1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, shuffle_zstd_l1, CompressionKind::kShuffleZstd, 1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, shuffle_zstd_l3, CompressionKind::kShuffleZstd, 3)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace asyncckpt::codec

BENCHMARK_MAIN();
