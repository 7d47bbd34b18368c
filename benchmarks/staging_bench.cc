// What the staging pool costs a save per chunk: one lease and one return, first-fit over a free
// list that other saves in flight may have fragmented, with the copy threads contending for it.
// (The snapshot copy itself, against a plain memcpy, is copy_bench's; a whole save against a
// whole-state memcpy is `asyncckpt train-sim`'s.)

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "asyncckpt/device.h"
#include "src/staging/staging_pool.h"

namespace asyncckpt {
namespace {

constexpr size_t kPage = StagingPool::kPageBytes;

// Leases `bytes`, or stops the benchmark with the reason.
bool Lease(benchmark::State& state, StagingPool& pool, size_t bytes, StagingLease* out) {
  Result<StagingLease> lease = pool.lease(bytes);
  if (!lease.ok()) {
    state.SkipWithError(lease.status().ToString().c_str());
    return false;
  }
  *out = std::move(lease).value();
  return true;
}

// One lease and its return on an empty pool: the cost every chunk of a save pays twice over
// the pool's mutex.
void BM_LeaseAndReturn(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  StagingPool pool(HostDevice(), 64u << 20);
  if (Status prepared = pool.Prepare(); !prepared.ok()) {
    state.SkipWithError(prepared.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    StagingLease lease;
    if (!Lease(state, pool, bytes, &lease)) return;
    benchmark::DoNotOptimize(lease.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_LeaseAndReturn)->ArgName("bytes")->Arg(4 << 10)->Arg(1 << 20)->Arg(4 << 20);

// try_lease on a full pool: what a save that finds no room pays before it waits or skips.
void BM_TryLeaseWhenFull(benchmark::State& state) {
  StagingPool pool(HostDevice(), 16u << 20);
  StagingLease all;
  if (!Lease(state, pool, pool.budget(), &all)) return;
  for (auto _ : state) {
    Result<StagingLease> lease = pool.try_lease(kPage);
    if (!lease.ok() || lease->data() != nullptr) {
      state.SkipWithError("try_lease on a full pool did not come back empty");
      return;
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_TryLeaseWhenFull);

// Lease and return with the free list cut into `holes` one-page holes that are too small, so
// first fit walks all of them: the worst case after many small leases were returned out of
// order.
void BM_LeaseAndReturnFragmented(benchmark::State& state) {
  const size_t holes = static_cast<size_t>(state.range(0));
  StagingPool pool(HostDevice(), (2 * holes + 4) * kPage);
  std::vector<StagingLease> leases(2 * holes);
  for (auto& lease : leases) {
    if (!Lease(state, pool, kPage, &lease)) return;
  }
  for (size_t i = 0; i < leases.size(); i += 2) leases[i].reset();
  for (auto _ : state) {
    StagingLease lease;
    if (!Lease(state, pool, 2 * kPage, &lease)) return;  // fits only in the tail
    benchmark::DoNotOptimize(lease.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_LeaseAndReturnFragmented)->ArgName("holes")->Arg(16)->Arg(256)->Arg(4096);

// Several copy threads leasing and returning 4 MiB chunks from one pool at once.
void BM_LeaseAndReturnContended(benchmark::State& state) {
  constexpr uint64_t kChunk = 4u << 20;
  static std::unique_ptr<StagingPool> pool;
  // No thread enters the loop before every thread reached it, so thread 0's setup is seen by
  // all; none leaves it before all are done, so thread 0 may tear down after it.
  if (state.thread_index() == 0) {
    pool = std::make_unique<StagingPool>(HostDevice(), kChunk * state.threads());
  }
  for (auto _ : state) {
    StagingLease lease;
    if (!Lease(state, *pool, kChunk, &lease)) break;
    benchmark::DoNotOptimize(lease.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  if (state.thread_index() == 0) pool.reset();
}
BENCHMARK(BM_LeaseAndReturnContended)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

}  // namespace
}  // namespace asyncckpt

BENCHMARK_MAIN();
