#include "src/cli/memcpy_yardstick.h"

#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <vector>

#include "src/util/status_macros.h"

namespace asyncckpt::cli {

namespace {

// The engine copies in pieces of one chunk (4 MiB by default); so does the yardstick.
constexpr size_t kPieceBytes = 4 << 20;

struct Piece {
  const uint8_t* source;
  uint64_t offset;  // into the destination
  size_t bytes;
};

std::vector<Piece> PiecesOf(const TensorRegistry& registry) {
  std::vector<Piece> pieces;
  uint64_t offset = 0;
  for (const TensorRef& ref : registry.tensors()) {
    const auto* source = static_cast<const uint8_t*>(ref.data);
    for (uint64_t at = 0; at < ref.bytes; at += kPieceBytes) {
      pieces.push_back(
          Piece{source + at, offset + at, std::min<size_t>(kPieceBytes, ref.bytes - at)});
    }
    offset += ref.bytes;
  }
  return pieces;
}

}  // namespace

double TimeStateMemcpy(const TensorRegistry& registry, uint8_t* destination) {
  const std::vector<Piece> pieces = PiecesOf(registry);
  const auto start = std::chrono::steady_clock::now();
  tbb::parallel_for(size_t{0}, pieces.size(), [&](size_t i) {
    std::memcpy(destination + pieces[i].offset, pieces[i].source, pieces[i].bytes);
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Result<std::unique_ptr<MemcpyYardstickHook>> MemcpyYardstickHook::Create(
    const TensorRegistry* registry, const SaverOptions& saver) {
  ASSIGN_OR_RETURN(SaveSchedule schedule, SaveSchedule::Create(saver));
  std::unique_ptr<MemcpyYardstickHook> hook(new MemcpyYardstickHook(registry, std::move(schedule)));
  const uint64_t bytes = std::max<uint64_t>(registry->total_bytes(), 1);
  hook->destination_.reset(new (std::nothrow) uint8_t[bytes]);
  if (!hook->destination_) {
    return Status::Unavailable("cannot allocate " + std::to_string(bytes) +
                               " bytes for the memcpy yardstick (--memcpy_yardstick=false "
                               "turns it off)");
  }
  // Touched now, so no measurement pays for first-touch page faults.
  std::memset(hook->destination_.get(), 0, bytes);
  return hook;
}

MemcpyYardstickHook::MemcpyYardstickHook(const TensorRegistry* registry, SaveSchedule schedule)
    : registry_(registry), schedule_(std::move(schedule)) {}

MemcpyYardstickHook::~MemcpyYardstickHook() = default;

void MemcpyYardstickHook::Measure(int64_t step) {
  schedule_.mark(step);
  schedule_.mark_saved(step);
  seconds_by_step_[step] = TimeStateMemcpy(*registry_, destination_.get());
  // The saver's totals keep the stats of its newest kSaverTotalsWindow saves; the yardsticks
  // they are held against need no more, and a record per save would grow with the run.
  while (seconds_by_step_.size() > kSaverTotalsWindow)
    seconds_by_step_.erase(seconds_by_step_.begin());
}

Status MemcpyYardstickHook::after_create_session(int64_t global_step) {
  Measure(global_step);
  return Status::OK();
}

Status MemcpyYardstickHook::after_run(RunContext& context, const RunValues& values) {
  (void)values;
  if (schedule_.due(context.step())) Measure(context.step());
  return Status::OK();
}

Status MemcpyYardstickHook::end(int64_t global_step) {
  if (schedule_.final_save_needed(global_step)) Measure(global_step);
  return Status::OK();
}

}  // namespace asyncckpt::cli
