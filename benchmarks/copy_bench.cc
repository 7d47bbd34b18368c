// The snapshot copy into staging (StreamingCopy, non-temporal stores) against a plain memcpy,
// side by side in one run: each thread copies its share of a 1 GiB state in 4 MiB pieces, the
// engine's default chunk, into memory that was touched before. The ratio of the two rows is
// what train-sim's blocked/memcpy reports for a whole save.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "device/streaming_copy.h"

namespace asyncckpt {
namespace {

constexpr size_t kStateBytes = size_t{1} << 30;
constexpr size_t kPieceBytes = size_t{4} << 20;

struct Buffers {
  std::unique_ptr<uint8_t[]> source{new uint8_t[kStateBytes]};
  std::unique_ptr<uint8_t[]> staging{new uint8_t[kStateBytes]};
  Buffers() {
    std::memset(source.get(), 0x5A, kStateBytes);
    std::memset(staging.get(), 0, kStateBytes);
  }
};

Buffers& Shared() {
  static Buffers buffers;
  return buffers;
}

template <bool kStreaming>
void BM_SnapshotCopy(benchmark::State& state) {
  Buffers& buffers = Shared();
  const size_t share = kStateBytes / static_cast<size_t>(state.threads());
  const size_t begin = share * static_cast<size_t>(state.thread_index());
  for (auto _ : state) {
    for (size_t at = begin; at < begin + share; at += kPieceBytes) {
      if constexpr (kStreaming) {
        StreamingCopy(buffers.staging.get() + at, buffers.source.get() + at, kPieceBytes);
      } else {
        std::memcpy(buffers.staging.get() + at, buffers.source.get() + at, kPieceBytes);
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * share));
  state.SetLabel(kStreaming && !StreamingCopyAvailable() ? "no AVX2: plain memcpy" : "");
}
BENCHMARK_TEMPLATE(BM_SnapshotCopy, false)
    ->Name("BM_SnapshotCopy/memcpy")
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime();
BENCHMARK_TEMPLATE(BM_SnapshotCopy, true)
    ->Name("BM_SnapshotCopy/streaming")
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime();

}  // namespace
}  // namespace asyncckpt

BENCHMARK_MAIN();
