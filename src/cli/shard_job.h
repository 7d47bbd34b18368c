#pragma once

// The multi-process side of `asyncckpt train-sim --shard` (run under mpirun): MPI's life in the
// CLI, the collectives train-sim itself needs (the global digest, rank 0's clock, per-rank
// figures), and a SessionCreator that makes every rank resume from the same step. Every
// function here that takes a Coordinator is collective: every rank calls it, in the same order,
// from the training thread (docs/distributed.md).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/coordinator.h"
#include "asyncckpt/file_system.h"
#include "asyncckpt/session.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"
#include "src/cli/shard_resume.h"

namespace asyncckpt::cli {

/// Whether this build can run train-sim --shard: asyncckpt was built with ASYNCCKPT_MPI.
bool ShardJobsSupported();

/// MPI's life for one command, and the job's Coordinator over MPI_COMM_WORLD. One per process;
/// created and destroyed on the thread that runs the training loop.
class MpiSession {
 public:
  /// Initialises MPI (MPI_THREAD_FUNNELED: only the training thread calls MPI) and creates the
  /// Coordinator, whose collectives give up after `timeout_seconds`. FailedPrecondition
  /// naming the build option when asyncckpt was built without MPI.
  static Result<std::unique_ptr<MpiSession>> Start(double timeout_seconds);
  /// Destroys the Coordinator, then finalises MPI (which waits for every rank to get there).
  ~MpiSession();

  /// The job's Coordinator; lives as long as this session.
  Coordinator& coordinator() { return *coordinator_; }
  /// Ends every process of the job with `exit_code` (MPI_Abort): a rank that fails on its own
  /// would otherwise leave the others waiting in their next collective.
  [[noreturn]] void Abort(int exit_code);
  /// Makes a launcher that would report a failed job as a success exit non-zero: under Open
  /// MPI's orte_enable_recovery, ends the local launcher (mpirun, or its orted) with SIGTERM,
  /// once it has read what this process printed, and after giving another rank `after_others`
  /// to end it first (the rank that printed the job's error); then ends this process with
  /// `exit_code`, without MPI_Finalize. Returns at once under any other launch, whose mpirun
  /// already sees the exit code.
  void FailTheLaunch(int exit_code,
                     std::chrono::milliseconds after_others = std::chrono::milliseconds(0));

 private:
  MpiSession() = default;
  std::unique_ptr<Coordinator> coordinator_;
};

/// XXH3-64 over the bytes of every global tensor, in name order, each tensor's bytes in global
/// order: the digest one process holding the whole state computes over it (RegistryDigest),
/// whatever the number of ranks. Every tensor of `registry` must be a dimension-0 slice
/// (global_offset zero past dimension 0) held by exactly one rank, and every rank must hold
/// the same names; the slices travel through all_gather one tensor at a time, so each rank
/// holds at most one global tensor more. Collective.
Result<uint64_t> GlobalDigest(Coordinator& coordinator, const TensorRegistry& registry);

/// Rank 0's `value` on every rank (broadcast). Collective.
Result<double> RankZeroValue(Coordinator& coordinator, double value);

/// Collective, every step under save_secs: the step's end on rank 0's clock (RankZeroValue), so
/// that every rank's timers fire at the same step. FailedPrecondition naming both steps when
/// what comes is rank 0's AgreeOnEnd (src/saver/coordination.h), which train-sim calls after
/// its loop: rank 0's training ended before this rank's `step`.
Result<double> StepClock(Coordinator& coordinator, double now, int64_t step);

/// Every rank's `value`, in rank order (all_gather). Collective.
Result<std::vector<uint64_t>> GatherValues(Coordinator& coordinator, uint64_t value);

/// Options of ShardedSessionCreator.
struct ShardedSessionCreatorOptions {
  /// The savers' checkpoint_dir, shared by every rank.
  std::string checkpoint_dir;
  /// The model's checkpoints, listed in the state file "checkpoint" (written by rank 0).
  std::string model_basename = "model.ckpt";
  /// This rank's input pipeline basename: non-empty when the input is checkpointed beside the
  /// model, so that a step is complete only when the input checkpoints of every rank of the job
  /// that saved it are committed too. Empty: the model alone.
  std::string input_basename;
  /// With checkpoints past step 0 but no step to resume: start from step 0 anyway, after rank 0
  /// moved every model and input checkpoint into a new subdirectory (SetAsideCheckpoints), so
  /// that none is trained over or deleted. Off: such a start fails, saying what it would move.
  bool allow_fresh_start = false;
  /// Where rank 0 reads and moves checkpoints (borrowed); null: the POSIX file system.
  io::FileSystem* file_system = nullptr;
  /// Puts the registry back to the initial state when there is nothing to restore.
  std::function<Status()> init_fn;
};

/// A SessionCreator for a job of any number of ranks: rank 0 picks the newest step whose model
/// checkpoint and the input checkpoints of every rank of the job that saved it (the world size
/// the model checkpoint records) are committed, and broadcasts it with that world size; input
/// checkpoints of other ranks never hold it back. Each rank restores the chunks that overlap its
/// boxes (CheckpointReader::restore of a registry of shards) and takes the input position
/// input_source() names. Every rank reaches the same decision, error included (a fresh start
/// that would train over checkpoints fails on every rank). create_session() is collective.
class ShardedSessionCreator final : public SessionCreator {
 public:
  /// InvalidArgument for an empty checkpoint_dir or a null coordinator or registry. Both are
  /// borrowed and must outlive the creator.
  static Result<std::unique_ptr<ShardedSessionCreator>> Create(ShardedSessionCreatorOptions options,
                                                               Coordinator* coordinator,
                                                               const TensorRegistry* registry);

  /// Restores the newest step complete on every rank and returns it; 0 without one.
  Result<int64_t> create_session() override;

  /// The basename of the input checkpoint this rank restores at the step the last
  /// create_session() returned (InputSourceBasename); empty without one.
  const std::string& input_source() const { return input_source_; }
  /// Ranks of the job that saved the step restored last; 0 when it started afresh.
  uint32_t saved_world_size() const { return saved_world_size_; }
  /// True when the last create_session() restored `step` from a checkpoint another number of
  /// ranks saved: the savers keep it as it is (set_keep_start_checkpoint), since re-saved by
  /// this job it would no longer pair with the input checkpoints of the ranks that saved it.
  bool keeps_restored_checkpoint(int64_t step) const {
    return !restored_from_.empty() && restored_step_ == step && saved_world_size_ != 0 &&
           saved_world_size_ != static_cast<uint32_t>(coordinator_->size());
  }
  /// The model checkpoint the last create_session() restored; empty when it started afresh.
  const std::string& restored_from() const { return restored_from_; }
  /// Bytes this rank read from data files in the last restore (0 when it started afresh).
  uint64_t restore_bytes_read() const { return restore_bytes_read_; }
  /// Seconds the last restore took on this rank.
  double restore_seconds() const { return restore_seconds_; }

 private:
  ShardedSessionCreator(ShardedSessionCreatorOptions options, Coordinator* coordinator,
                        const TensorRegistry* registry)
      : options_(std::move(options)), coordinator_(coordinator), registry_(registry) {}
  struct Decision {
    bool found = false;      // a step to resume
    bool any_found = false;  // a model checkpoint past step 0 exists
    ResumePoint point;
    std::string why_none;  // when none is found: why the newest model checkpoint is not one
  };
  Result<Decision> Decide();
  Status Restore(int64_t step);
  // Rank 0 moves the checkpoints a fresh start would train over aside; collective.
  Status SetAsideForFreshStart();

  ShardedSessionCreatorOptions options_;
  Coordinator* coordinator_;
  const TensorRegistry* registry_;
  int sessions_ = 0;  // create_session() calls so far
  int restores_ = 0;  // of which restored a checkpoint
  std::string restored_from_;
  int64_t restored_step_ = -1;
  std::string input_source_;
  uint32_t saved_world_size_ = 0;
  uint64_t restore_bytes_read_ = 0;
  double restore_seconds_ = 0;
};

}  // namespace asyncckpt::cli
