#pragma once

// SaverCore: what every saver does around its engine, written once. The two hooks, Checkpointer
// and the input pipeline hook each keep only what differs (when to save, what to snapshot, what
// the loop hears); the core owns the start (lock, clean-up, multi-process agreement), the
// engine, a save's submission, and, when a save finishes, the totals, the listeners and the
// failure policy (SaverOptions::on_error).

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "asyncckpt/hooks.h"
#include "asyncckpt/saver_types.h"
#include "src/engine/engine.h"
#include "src/saver/save_schedule.h"
#include "src/saver/saver_start.h"
#include "src/saver/saver_storage.h"

namespace asyncckpt {

/// What sets one saver's core apart from another's.
struct SaverCoreSetup {
  /// Asynchronous: a save returns once staged, and its outcome arrives on the commit thread.
  /// Synchronous: a save returns once committed, and the listeners hear of it on the caller's
  /// thread.
  SaveMode mode = SaveMode::kAsynchronous;
  /// The state file the checkpoints are listed in.
  std::string state_file_name = kCheckpointStateFileName;
  /// Whose checkpoints retention pairs with; empty: options.paired_input_basename's.
  CheckpointPartner partner;
  /// Told of every save (borrowed).
  std::vector<CheckpointSaverListener*> listeners;
  /// The coordinator whose rank 0 decides when save_secs is due; null: options.coordinator
  /// (the input pipeline agrees on its schedule but writes each worker's checkpoints alone).
  Coordinator* schedule_coordinator = nullptr;
  /// Prefixes the saver's failures, e.g. "input pipeline checkpoint"; empty leaves them as
  /// they are.
  std::string failure_context;
  /// What a failure's log line calls one save (OnError::kContinue).
  std::string save_noun = "a background save";
};

/// One save for SaverCore::Save.
struct CoreSaveRequest {
  /// Step, wall time and user metadata.
  CheckpointMetadata metadata;
  /// Skip the save while staging is busy, when options.on_busy is kSkip (asynchronous only).
  bool may_skip = false;
  /// Whether a listener's wish to stop after this save counts (not for a session's first save,
  /// as in TensorFlow).
  bool heed_listeners = true;
  /// The tensors' plan when the saver made it already (PlanSnapshot with engine_options());
  /// empty: the engine makes it.
  std::optional<SnapshotPlan> plan;
  /// When the saver's save call began, if before Save (blocked time counts from there).
  std::optional<SteadyClock::time_point> started;
};

/// What SaverCore::Save did.
struct CoreSaveResult {
  /// False when the save was skipped (staging busy, OnBusy::kSkip).
  bool saved = false;
  /// Synchronous mode: the committed (or failed) save's stats.
  SaveStats stats;
  /// Synchronous mode: a listener heeded for this save asked the loop to stop.
  bool stop_requested = false;
};

/// Tells every listener about a finished save; true when one of them asks to stop.
bool NotifyAfterSave(const std::vector<CheckpointSaverListener*>& listeners, int64_t step,
                     const SaveStats& stats);

/// Adds one finished save to the running totals and to the window of recent saves, dropping the
/// oldest save beyond kSaverTotalsWindow.
void AddToTotals(const SaveStats& stats, SaverTotals* totals);

/// The saver core. Start, engine creation, Save, WaitAll and End run on the saver's own thread
/// (the training thread); totals() and the engine's completions may run on any thread.
class SaverCore {
 public:
  /// Validates `options` (ValidateSaverOptions) and builds its save schedule.
  static Result<std::unique_ptr<SaverCore>> Create(SaverOptions options, SaverCoreSetup setup);
  /// Waits for the saves in flight before the storage goes.
  ~SaverCore();

  /// Locks checkpoint_dir and runs its start-up clean-up (SaverStorage::Start), as one process.
  Status StartStorage();
  /// A hook's begin(): the start (StartSaver, multi-process agreement included), an engine
  /// over `registry` (or, in a multi-process job, over what this rank writes) planned once and
  /// sized by StagingBudget in this saver's mode, agreed started on every rank, then the
  /// listeners' begin(). A registry the format cannot hold is refused here, naming the tensor.
  Status StartWithEngine(const TensorRegistry& registry);
  /// The options the engine is handed: the saver's own, with this process's part of a
  /// multi-process save (job token included once started).
  const EngineOptions& engine_options() const { return engine_options_; }
  /// Replaces the engine (after waiting for the saves in flight) by one over `registry`, whose
  /// plan is `plan`, with `engine_options` (engine_options() and what the caller adds: its
  /// staging budget, its priority).
  Status CreateEngine(const TensorRegistry* registry, const SnapshotPlan& plan,
                      const EngineOptions& engine_options);
  /// Multi-process jobs, before each save of a Checkpointer, whose tensors may change from save
  /// to save (collective): the ranks agree again on who writes what in `registry`, `local` (this
  /// rank's status: a failure kept from an earlier save) travelling with it, so that every rank
  /// gets the same error when one fails. On success the engine's registry holds this rank's part
  /// of `registry`; returns whether its layout (names, dtypes, shapes, boxes, devices) differs
  /// from the last one (then RecreateEngineAcrossRanks).
  Result<bool> AgreeOnWritten(const TensorRegistry& registry, const Status& local);
  /// Multi-process jobs: a new engine over this rank's part (after waiting for the saves in
  /// flight), agreed created on every rank.
  Status RecreateEngineAcrossRanks();
  /// Whether an engine exists.
  bool has_engine() const { return engine_ != nullptr; }
  /// The engine's staging budget (0 without an engine).
  uint64_t staging_budget() const;

  /// Saves through the engine: before_save listeners once the save is certain, the schedule
  /// marked, a skipped save counted; synchronous mode waits until it is committed. Returns an
  /// error only for a save refused before anything was written (bad tensors or metadata).
  Result<CoreSaveResult> Save(CoreSaveRequest request);

  /// Hands the loop what the background reported: a listener's stop request, and failures as
  /// on_error says (kStop: the first failure kept, and a stop requested while one is kept;
  /// kContinue: logged).
  /// Returns the first failure kept so far (OK without one). `context` may be null.
  Status Deliver(RunContext* context);
  /// Records a failure that the saver found itself (a synchronous save's), for Deliver.
  void RecordFailure(const Status& failure);
  /// Blocks until every submitted save is committed or failed, and retention's removals are
  /// done.
  void WaitAll();
  /// Blocks until every submitted save is committed or failed (durable); retention's removals
  /// may go on. Then Deliver(nullptr).
  Status WaitUntilSaved();
  /// Blocks until `finished` saves in all have committed or failed (SaverTotals'
  /// saves_committed + saves_failed), or `timeout_seconds` passed (negative: no limit). True
  /// when they have.
  bool WaitForFinishedSaves(int64_t finished, double timeout_seconds) const;
  /// A multi-process saver's rank says it ended its training at `step`, before its final save,
  /// so that no other rank waits a timeout for it: in the checkpoint directory for the sharded
  /// commit (ShardEndedFileName; a failure is logged), and under save_secs in the schedule's
  /// collective (SaveSchedule::agree_on_end), whose FailedPrecondition says the ranks ended at
  /// different steps. OK for one process.
  Status AnnounceEnd(int64_t step);
  /// The end of the saver: waits, tells the listeners end(step), destroys the engine and
  /// releases the directory lock. Returns WaitUntilSaved's status.
  Status Finish(std::optional<int64_t> end_step);

  /// The schedule built from the options.
  SaveSchedule& schedule() { return schedule_; }
  /// The schedule, to ask whether a save is due.
  const SaveSchedule& schedule() const { return schedule_; }
  /// The saver's options.
  const SaverOptions& options() const { return engine_options_.saver; }
  /// The file system, after a start.
  io::FileSystem* fs() const { return storage_.fs; }
  /// The state file and retention manager, after a start.
  CheckpointManager* manager() const { return storage_.manager.get(); }
  /// Totals so far (thread-safe).
  SaverTotals totals() const;

 private:
  SaverCore(SaverOptions options, SaverCoreSetup setup, SaveSchedule schedule);
  // An engine over `registry`, planned here and sized by StagingBudget in this saver's mode.
  Status CreatePlannedEngine(const TensorRegistry* registry);
  void OnDone(const SaveStats& stats);
  void Record(const SaveStats& stats);
  bool synchronous() const { return setup_.mode == SaveMode::kSynchronous; }

  EngineOptions engine_options_;  // the saver's options, and the job token once agreed
  const SaverCoreSetup setup_;
  SaveSchedule schedule_;
  SaverStorage storage_;
  // Multi-process jobs: what this rank writes (the engine's registry); null in one process.
  std::unique_ptr<TensorRegistry> written_;

  mutable std::mutex mu_;                     // guards what the commit thread reports
  mutable std::condition_variable finished_;  // a save was added to totals_
  SaverTotals totals_;
  uint64_t staging_high_water_ = 0;  // over every engine so far
  std::vector<Status> unreported_failures_;
  // Per asynchronous save submitted and not yet done, oldest first: whether its listeners'
  // answer counts.
  std::deque<bool> heed_answers_;
  bool stop_requested_by_listener_ = false;
  Status first_error_;
  std::optional<SaveStats> last_done_;  // synchronous mode: the save just waited for

  std::unique_ptr<Engine> engine_;  // last: destroyed (and waited for) first
};

}  // namespace asyncckpt
