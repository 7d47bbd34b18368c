#pragma once

// What a saver holds in its checkpoint directory: the file system, the lock on its state file,
// the retention manager, and the start-up recovery of the directory; and the names of the
// files it keeps there (the lock, an input pipeline's state file).

#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/saver_options.h"
#include "asyncckpt/state.h"
#include "asyncckpt/status.h"
#include "src/state/checkpoint_state.h"

namespace asyncckpt {

/// "<state_file_name>.lock": the file in checkpoint_dir whose lock makes a saver the one writer
/// of that state file (and so of every basename it lists). Never of a checkpoint's form
/// ("<basename>-<step>") nor a temporary's.
std::string DirectoryLockFileName(const std::string& state_file_name);

/// The file system, directory lock and retention manager of a saver, ready after Start().
///
/// Locks of one process. A started storage registers its manager under its lock's path, so that
/// a reader of the same process that finds a checkpoint damaged (QuarantineFoundDamage) goes
/// through it. A saver paired with an input pipeline (options.paired_input_basename) takes the
/// input's state-file lock too, before its start-up changes anything, and keeps it for the
/// input pipeline's saver of this process, whose Start takes it over: a job one of whose locks
/// another job holds changes nothing in the directory.
struct SaverStorage {
  /// options.file_system, or the default backend the options choose (then owned here).
  io::FileSystem* fs = nullptr;
  /// The default backend when options.file_system is null.
  std::unique_ptr<io::FileSystem> owned_fs;
  /// State file and retention.
  std::unique_ptr<CheckpointManager> manager;
  /// The lock on DirectoryLockFileName(state file), held from Start() until ReleaseLock() or
  /// destruction; declared last so that it goes first, before the file system it came from.
  std::unique_ptr<io::FileLock> lock;

  /// Unregisters the manager and releases the locks.
  ~SaverStorage();

  /// Creates checkpoint_dir and locks its state file `state_file_name` before touching
  /// anything else there: while another saver (of any process and basename, this one
  /// included) holds that lock, fails with FailedPrecondition naming the lock file and its
  /// holder's PID and host, and leaves the directory as it was. With
  /// options.paired_input_basename (and no `partner`), locks the input pipeline's state file
  /// too, unless a saver of this process holds it, with the same refusal. Then creates a manager
  /// validating with ValidateCheckpointDirectory and runs its start-up recovery and garbage
  /// collection (CheckpointManager::Start). Pairs retention with `partner`, or, when that is
  /// empty, with options.paired_input_basename's input checkpoints. FailedPrecondition naming
  /// them when quarantined checkpoints of options.basename are on disk and no good one is
  /// listed, unless options.allow_fresh_start. Returns the names removed (each logged); what
  /// start-up could not do is logged, not returned. On failure the lock is released again. A
  /// second Start() keeps the lock it holds.
  Result<std::vector<std::string>> Start(
      const SaverOptions& options, const std::string& state_file_name = kCheckpointStateFileName,
      const CheckpointPartner& partner = {});
  /// For a rank other than 0 of a multi-process job, after rank 0's Start(): opens the file
  /// system and creates a manager (for the engine) without locking the directory or touching
  /// anything in it, which rank 0 alone does. FailedPrecondition when checkpoint_dir is not a
  /// directory here (the ranks do not share it).
  Status Attach(const SaverOptions& options,
                const std::string& state_file_name = kCheckpointStateFileName,
                const CheckpointPartner& partner = {});
  /// Lets another saver take the directory (the hooks call it once their last save is
  /// durable, in end()).
  void ReleaseLock();

 private:
  void OpenFileSystem(const SaverOptions& options);
  void MakeManager(const SaverOptions& options, const std::string& state_file_name,
                   const CheckpointPartner& partner);
  // Locks the paired input pipeline's state file ahead of start-up (see the struct comment).
  Status LockPartnerAhead(const SaverOptions& options);

  std::string lock_path_;     // registered with this process's held locks once started
  std::string partner_path_;  // the partner's lock this storage parked, if any
};

/// Quarantines the damaged checkpoint `dir`/`name` that a restore found (a chunk failing its
/// checksum), as start-up quarantines one: through the manager of this process that holds the
/// lock of `state_file_name`, or else under that lock taken for the moment
/// (QuarantineListedCheckpoint). Returns the quarantined name. FailedPrecondition, logged as an
/// error naming the checkpoint, when another process holds the lock: the directory is then left
/// as it is. `fs` is the file system the directory is read through.
Result<std::string> QuarantineFoundDamage(io::FileSystem& fs, const std::string& dir,
                                          const std::string& state_file_name,
                                          const std::string& name, const std::string& why);

/// The state file of input pipeline checkpoints named `basename`: "checkpoint_" + the basename
/// without ".ckpt" ("checkpoint_input" for "input.ckpt"; TensorFlow's latest_filename).
std::string InputStateFileForBasename(const std::string& basename);

}  // namespace asyncckpt
