#pragma once

// The naive baseline of `asyncckpt train-sim --saver naive`: what a job gets from numpy.save or
// torch.save in its training loop. One thread, on the training thread, writes every tensor to
// its own file with plain write(2) calls and fsync(2)s it, tensor after tensor. No staging, no
// chunking, no checksums, no index: the yardstick the asynchronous saver is held against.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/hooks.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/tensor.h"
#include "src/saver/save_schedule.h"

namespace asyncckpt::cli {

/// Saves every tensor of the registry into `<checkpoint_dir>/naive-<step>/<index>.bin` (index in
/// the registry's name order, zero-padded), one write + fsync per file, then fsyncs the
/// directory: at after_create_session, at each step the options' schedule is due and at end()
/// when the last step was not saved. Keeps the newest `max_to_keep` such directories (0: all).
/// Listeners hear before_save and after_save of every save (their answer is ignored). A failed
/// save fails the session with its status. The registry and listeners must outlive the hook.
class NaiveSaverHook final : public SessionRunHook {
 public:
  /// InvalidArgument when the options' schedule is invalid.
  static Result<std::unique_ptr<NaiveSaverHook>> Create(
      const SaverOptions& options, const TensorRegistry* registry,
      std::vector<CheckpointSaverListener*> listeners = {});
  ~NaiveSaverHook() override;

  /// Saves the state the session starts from.
  Status after_create_session(int64_t global_step) override;
  /// Saves when the schedule is due at this step.
  Status after_run(RunContext& context, const RunValues& values) override;
  /// Saves the last step when it was not saved yet.
  Status end(int64_t global_step) override;

  /// Every save so far: blocked_seconds equals seconds_to_durable (the whole save blocks).
  const SaverTotals& totals() const { return totals_; }
  /// `<checkpoint_dir>/naive-<step>`.
  std::string DirectoryOf(int64_t step) const;

 private:
  NaiveSaverHook(const SaverOptions& options, const TensorRegistry* registry,
                 std::vector<CheckpointSaverListener*> listeners, SaveSchedule schedule);
  Status Save(int64_t step);
  Status WriteAll(const std::string& dir) const;
  void DropOld();

  const SaverOptions options_;
  const TensorRegistry* const registry_;
  const std::vector<CheckpointSaverListener*> listeners_;
  SaveSchedule schedule_;
  SaverTotals totals_;
};

}  // namespace asyncckpt::cli
