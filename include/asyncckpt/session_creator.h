#pragma once

// A SessionCreator that restores the newest checkpoint of a directory (TensorFlow's
// ChiefSessionCreator with its Scaffold's restore), for MonitoredSession: at the start and after
// every pre-emption, the model state comes back from the newest step that can be resumed whole.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "asyncckpt/file_system.h"
#include "asyncckpt/session.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"

namespace asyncckpt {

/// Options of CheckpointSessionCreator.
struct CheckpointSessionCreatorOptions {
  /// The savers' checkpoint_dir.
  std::string checkpoint_dir;
  /// The model's checkpoints are "<model_basename>-<step>", listed in the state file
  /// "checkpoint" (SaverOptions::basename).
  std::string model_basename = "model.ckpt";
  /// The input pipeline's basename (InputCheckpointBasename of the input hook's options). When
  /// set, the creator restores the model of the newest step that has both a model and an input
  /// checkpoint (NewestCompleteStep), and the input hook then restores the input of that step.
  /// Empty: the model's latest listed checkpoint.
  std::string input_basename;
  /// Start from step 0 when `checkpoint_dir` holds checkpoints past step 0 but none to resume
  /// (no model checkpoint with an input partner, or none listed). Off (the default): that is
  /// FailedPrecondition naming what was found, since a fresh start would train over them. On,
  /// a pre-emption before this job's saves have replaced them may restore one of them. Not
  /// needed for a re-creation while every session so far started afresh: what is found then
  /// is this job's own, its model saves still in flight. Also needed to start from step 0
  /// when there is nothing to resume but quarantined (damaged) checkpoints of either basename,
  /// "<basename>-<step>.corrupt-<hex>": without it that is FailedPrecondition naming them.
  bool allow_fresh_start = false;
  /// Puts the registry's tensors back to their initial values when there is no checkpoint to
  /// restore (TensorFlow's Scaffold init_fn). Null: the registry is taken to hold the initial
  /// state at the first create_session(); a later one (a re-creation after a pre-emption) that
  /// finds nothing to restore then fails with FailedPrecondition, as the state has moved on.
  std::function<Status()> init_fn;
  /// Where the state files, the directory and the checkpoint are read (borrowed; must outlive
  /// the creator). Null: POSIX for the state files and the listing, the reader's default
  /// backend for the checkpoint.
  io::FileSystem* file_system = nullptr;
};

/// Restores a TensorRegistry from the newest complete checkpoint of a directory and returns
/// its step; 0 for a directory without checkpoints (running init_fn if set). Every chunk read is
/// checksummed, and a checkpoint whose metadata names another step than its directory is
/// Corruption. A checkpoint whose restore finds damage (Corruption: a chunk failing its
/// checksum, which start-up's size checks cannot see) is logged as an error naming the file,
/// tensor and chunk, quarantined as start-up does (through the saver of this process that holds
/// the directory, or under its lock taken for the moment; left in place when another job holds
/// it), and the newest good step before it is restored instead. A state file that cannot be
/// read, or any other failure, fails create_session() with that error, naming the file; the
/// registry may then be partly restored. Saves still in flight are not waited for: a re-created
/// session comes back at the newest step committed when create_session() runs. Called from the
/// training thread; the registry is borrowed and must outlive the creator, and its buffers must not
/// be in use by a save while create_session() runs.
class CheckpointSessionCreator final : public SessionCreator {
 public:
  /// Validates the options: InvalidArgument for an empty checkpoint_dir, a basename that is not
  /// a plain name, or a null registry.
  static Result<std::unique_ptr<CheckpointSessionCreator>> Create(
      CheckpointSessionCreatorOptions options, const TensorRegistry* registry);
  ~CheckpointSessionCreator() override;

  /// Restores the newest step to resume (see CheckpointSessionCreatorOptions::input_basename)
  /// and returns it; 0 without one. Logs what it restored, or why it starts afresh.
  Result<int64_t> create_session() override;

  /// The model checkpoint the last create_session() restored; empty when it started afresh.
  const std::string& restored_from() const;

  /// Internal state (defined in the source file).
  class Impl;

 private:
  explicit CheckpointSessionCreator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace asyncckpt
