#pragma once

// What every saver shares with its caller, whichever saver it is (the two hooks, Checkpointer,
// the input pipeline hook): the listener a save is reported to, and the totals a saver keeps.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "asyncckpt/save_stats.h"

namespace asyncckpt {

/// Observes saves (TensorFlow's CheckpointSaverListener). Called on the training thread for the
/// synchronous hook; for the asynchronous hook after_save comes from the background commit.
class CheckpointSaverListener {
 public:
  virtual ~CheckpointSaverListener() = default;
  /// Once, from the hook's begin().
  virtual void begin() {}
  /// Before a save of `step` starts.
  virtual void before_save(int64_t step) { (void)step; }
  /// After a save of `step` finished (stats.status says whether it succeeded). Returning true
  /// asks the training loop to stop, except for the save a hook makes in after_create_session
  /// (at a session's start or re-creation), whose answer is ignored, as in TensorFlow.
  virtual bool after_save(int64_t step, const SaveStats& stats) {
    (void)step;
    (void)stats;
    return false;
  }
  /// Once, from the hook's end(), after the last save.
  virtual void end(int64_t step) { (void)step; }
};

/// Most recent saves SaverTotals::saves keeps. Older saves live on only in SaverTotals' running
/// totals, so that a job saving every step for weeks holds bounded memory. A SaveStats costs
/// 0.3 to 1 KiB of heap (its path, status and codec map): at 1000 the heap of a saver grew by
/// about that much per save for its first 1000 saves, which looked like a leak; at 128 it is
/// flat after the first 128 (tests/saver/save_memory_test.cc holds it to that).
inline constexpr size_t kSaverTotalsWindow = 128;

/// Totals over a hook's life: exact running totals over every save, and the most recent saves.
struct SaverTotals {
  /// Saves that committed.
  int64_t saves_committed = 0;
  /// Saves that failed.
  int64_t saves_failed = 0;
  /// Saves skipped because staging was busy (OnBusy::kSkip).
  int64_t saves_skipped = 0;
  /// Sum and maximum of blocked seconds.
  double blocked_seconds_total = 0;
  /// Longest single block of the training thread by one save.
  double blocked_seconds_max = 0;
  /// Bytes of tensor data saved, over committed saves.
  uint64_t bytes_raw = 0;
  /// Bytes written to data files, over committed saves.
  uint64_t bytes_stored = 0;
  /// Sum of seconds_to_durable over committed saves (bytes_raw over it is the save throughput).
  double seconds_to_durable_total = 0;
  /// Longest seconds_to_durable of a committed save.
  double seconds_to_durable_max = 0;
  /// Chunks written per codec name, over committed saves.
  std::map<std::string, uint64_t> chunks_by_codec;
  /// Most pinned staging memory in use at once.
  uint64_t staging_high_water_bytes = 0;
  /// Start-up cost: seconds the saver's thread spent creating engines and their staging
  /// (allocating, touching and registering pinned memory), at begin() or
  /// Checkpointer::prepare(), or inside a save that needed a new engine, whose blocked_seconds
  /// then includes it.
  double startup_seconds = 0;
  /// Entries removed at begin(): temporaries of interrupted saves and deletions, and
  /// checkpoint directories that were incomplete or older than the retained ones
  /// (docs/durability.md).
  std::vector<std::string> stale_temporaries_removed;
  /// Old checkpoints that retention dropped but could not delete (each logged; the saves that
  /// dropped them still count as committed, and the next start retries).
  int64_t retention_failures = 0;
  /// The stats of the most recent saves, committed or failed (at most kSaverTotalsWindow), in
  /// the order they finished (step order), oldest first.
  std::deque<SaveStats> saves;
};

}  // namespace asyncckpt
