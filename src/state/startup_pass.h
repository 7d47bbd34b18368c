#pragma once

// The start-up pass of a CheckpointManager: recovery and garbage collection after a crash, and
// the rebuilt list of retained checkpoints. CheckpointManager::Start (defined in startup_pass.cc)
// runs it; its contract is on Start, in checkpoint_state.h.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"
#include "src/state/checkpoint_state.h"

namespace asyncckpt::state_internal {

// One checkpoint of the manager's list while start-up rebuilds it.
struct Listed {
  std::string name;
  int64_t step = 0;
  double timestamp = 0;
  std::optional<double> score =
      std::nullopt;  // from the checkpoint's metadata (ValidCheckpoint::score)
};

// CheckpointManager::Start's work, step by step (see its contract). It removes leftovers and
// quarantines unlisted damaged checkpoints as it goes; the listed ones that turn out damaged are
// only collected, because the state file on disk still names them until the caller rewrites it,
// and then quarantined by QuarantineListed.
class StartupPass {
 public:
  StartupPass(io::FileSystem& fs, const CheckpointManagerOptions& options,
              const CheckpointValidator& validator, StartupReport* report)
      : fs_(fs), options_(options), validator_(validator), report_(*report) {}

  // Does the work; an error only when the directory cannot be listed or the state file read,
  // or (before anything is changed) when another state file claims the basename or a
  // checkpoint of it was written by a newer release.
  Status Run();

  // The list after start-up, oldest first.
  const std::vector<Listed>& list() const { return list_; }
  double last_preserved_timestamp() const { return last_preserved_; }
  // True when the state file must be rewritten to say what list() says.
  bool changed() const {
    return !report_.dropped.empty() || !report_.relisted.empty() ||
           (!state_parsed_ && !list_.empty());
  }
  // Entries of other basenames in the state file (it is shared): kept as they are.
  const std::vector<Listed>& foreign() const { return foreign_; }
  // Quarantines what the old state file listed but is damaged (after the rewrite), and sorts
  // the report's quarantined names.
  void QuarantineListed();
  // Why the state file could not be trusted, or empty.
  const std::string& state_problem() const { return state_problem_; }
  // True when there was a state file, usable or not.
  bool state_file_present() const { return state_file_present_; }

 private:
  std::string Path(const std::string& name) const {
    return JoinCheckpointPath(options_.checkpoint_dir, name);
  }

  void Fail(const std::string& what);

  // The validator's answer, asked once per name and remembered: the refusal of a newer
  // release's checkpoint validates everything before the pass changes anything.
  Result<ValidCheckpoint> Validate(const std::string& name, int64_t step);

  // FailedPrecondition naming every "<basename>-<step>" directory a newer release wrote.
  Status RefuseNewer(const std::vector<std::string>& names);

  // Renames a damaged committed checkpoint to QuarantineDirName(name), logged as an error.
  void Quarantine(const std::string& name, const std::string& why);

  // A half-written save, an old copy of a re-save, an interrupted deletion, a state-file
  // temporary: never anything of value.
  bool IsLeftover(const std::string& name, bool* is_directory_kind) const;

  void RemoveLeftovers(const std::vector<std::string>& names);

  void Drop(const std::string& name, const std::string& why);

  Status LoadStateFile();

  void LoadListed(const std::string& name, double timestamp);

  // Every unlisted "<basename>-<step>" real directory: complete ones are collected, damaged
  // ones quarantined, undecidable ones left alone.
  void CollectUnlisted(const std::vector<std::string>& names);

  void Remove(const std::string& name, const std::string& what);

  // The partner's steps: from its state file, else from the directories a listing shows.
  // Over-counting only keeps more (at most max_to_keep pairs), so no validation is needed.
  std::set<int64_t> PartnerSteps() const;

  void RelistOrRemoveUnlisted();

  io::FileSystem& fs_;
  const CheckpointManagerOptions& options_;
  const CheckpointValidator& validator_;
  StartupReport& report_;

  bool state_file_present_ = false;
  bool state_parsed_ = false;
  std::string state_problem_;
  double last_preserved_ = 0;
  std::vector<Listed> list_;
  std::set<std::string> listed_names_;
  std::vector<std::pair<std::string, std::string>> listed_damaged_;  // name, what is wrong
  std::vector<Listed> foreign_;
  std::vector<Listed> unlisted_complete_;
  std::map<std::string, Result<ValidCheckpoint>> validated_;  // name -> the validator's answer
};

}  // namespace asyncckpt::state_internal
