#pragma once

// An input iterator whose whole state is one counter, for tests of the input hook and of the
// savers beside it.

#include <cstdint>

#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/status.h"

namespace asyncckpt::testing_support {

/// A SaveableIterator whose state is the number of Next() calls; `max_state_bytes` is what it
/// reports (0: it cannot tell).
class CountingIterator final : public SaveableIterator {
 public:
  explicit CountingIterator(uint64_t max_state_bytes = 0) : max_state_bytes_(max_state_bytes) {}
  void Next() { ++counter_; }
  Status save(IteratorState* state) override {
    const int64_t counter[1] = {counter_};
    return state->put_i64("counter", counter);
  }
  Status restore(const IteratorState& state) override {
    auto counter = state.get_i64("counter", 1);
    if (!counter.ok()) return counter.status();
    counter_ = (*counter)[0];
    return Status::OK();
  }
  uint64_t max_state_bytes() const override { return max_state_bytes_; }

 private:
  uint64_t max_state_bytes_;
  int64_t counter_ = 0;
};

}  // namespace asyncckpt::testing_support
