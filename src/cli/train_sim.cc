// `asyncckpt train-sim`: the command, and the run it makes of the checked flags: a synthetic
// training job that checkpoints as it goes, resumes from its checkpoint directory after a
// restart or a pre-emption, and measures what checkpointing cost the training loop.

#include "src/cli/train_sim.h"

#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/session.h"
#include "asyncckpt/state.h"
#include "src/cli/commands.h"
#include "src/cli/flags.h"
#include "src/cli/kill_point.h"
#include "src/cli/memcpy_yardstick.h"
#include "src/cli/shard_job.h"
#include "src/cli/shard_resume.h"
#include "src/cli/shard_startup.h"
#include "src/cli/sim_model.h"
#include "src/cli/train_sim_gpu.h"
#include "src/cli/train_sim_memory.h"
#include "src/cli/train_sim_report.h"
#include "src/cli/train_sim_session.h"
#include "src/saver/coordination.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt::cli {

namespace {

using SteadyClock = std::chrono::steady_clock;

// A new directory under $TMPDIR (or /tmp) for a run given no --checkpoint_dir.
Result<std::string> MakeTempCheckpointDir() {
  std::error_code ec;
  std::string base = std::filesystem::temp_directory_path(ec).string();
  if (ec) base = "/tmp";
  std::string pattern = base + "/asyncckpt-train-sim-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    return Status::IOError("cannot create a checkpoint directory under " + base + ": " +
                           std::strerror(errno));
  }
  return pattern;
}

// XXH3 of the input's saved state: runs whose digests agree go on with the same records.
uint64_t IteratorDigest(RecordDatasetIterator& input) {
  IteratorState state;
  if (!input.save(&state).ok()) return 0;
  XXH3_state_t* hash = XXH3_createState();
  XXH3_64bits_reset(hash);
  for (const auto& entry : state.entries()) {
    XXH3_64bits_update(hash, entry.bytes.data(), entry.bytes.size());
  }
  const uint64_t digest = XXH3_64bits_digest(hash);
  XXH3_freeState(hash);
  return digest;
}

// --verify: reads and checks every checkpoint the state file lists, counting them.
Status VerifyListed(const std::string& dir, int* verified) {
  ASSIGN_OR_RETURN(CheckpointState state, GetCheckpointState(dir));
  *verified = 0;
  for (const auto& name : state.all_model_checkpoint_paths) {
    ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir + "/" + name));
    VerifyReport report = reader->verify();
    if (!report.problems.empty()) {
      return Status::Corruption(dir + "/" + name + " failed verification: " + report.problems[0]);
    }
    ++*verified;
  }
  return Status::OK();
}

// The process's peak resident set (VmHWM in /proc/self/status); 0 where it cannot be read.
uint64_t PeakRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) << 10;
  }
  return 0;
}

// What one run holds, declared in the order it is built, so that it is destroyed in reverse:
// the session first, then the creators and hooks, the input, and the model last.
struct RunParts {
  // --kill_at: the savers' file system, which kills this rank at its point, and its target.
  std::unique_ptr<io::FileSystem> own_fs;
  std::unique_ptr<io::FileSystem> kill_fs;
  std::unique_ptr<TrainModel> model;
  GpuModel* gpu = nullptr;  // --device cuda: the model, borrowed
  std::unique_ptr<RecordDatasetIterator> input;
  // The time the last step ended, which every hook's save_secs timer reads.
  std::shared_ptr<std::atomic<double>> step_end;
  SaveRecorder recorder;
  std::function<SaverTotals()> totals;
  std::unique_ptr<SessionRunHook> hook;  // null for --saver none
  std::unique_ptr<CheckpointInputPipelineHook> input_hook;
  std::unique_ptr<SessionRunHook> input_first;  // the input's commit before the model's
  std::unique_ptr<MemcpyYardstickHook> yardstick;
  std::unique_ptr<Coordinator> own_coordinator;  // one process over a sharded job's directory
  std::unique_ptr<CheckpointSessionCreator> single_creator;  // a job of one process
  std::unique_ptr<ShardedSessionCreator> sharded_creator;    // --shard
  std::unique_ptr<SeedCheckedCreator> seed_checked;          // the one the session calls
  std::unique_ptr<MonitoredSession> session;
};

// The start-up lines on stderr: where the checkpoints go, and what the job holds (the global
// state; with --shard also each rank's share).
void AnnounceRun(const TrainSimConfig& config, const TensorRegistry& registry,
                 Coordinator* coordinator, bool lead) {
  if (coordinator != nullptr) {
    std::fprintf(stderr, "train-sim: rank %d of %d (pid %d) holds %s of the state\n",
                 coordinator->rank(), coordinator->size(), static_cast<int>(getpid()),
                 FormatBytes(double(registry.total_bytes())).c_str());
  }
  SimConfig whole = config.model;
  whole.shard = false;
  const uint64_t global_bytes = LayoutOf(whole, config.saver.chunk_bytes).state();
  if (lead)
    std::fprintf(
        stderr, "train-sim: %zu tensors, %s of state, %s saver, saving every %s\n", registry.size(),
        FormatBytes(double(global_bytes)).c_str(), config.saver_kind.c_str(),
        config.saver.save_steps ? (std::to_string(*config.saver.save_steps) + " steps").c_str()
                                : (std::to_string(*config.saver.save_secs) + " s").c_str());
}

// The checkpoint directory, the model and the input, and the clock the savers read.
Status StartRun(TrainSimConfig& config, RunSummary* summary, Coordinator* coordinator, bool lead,
                RunParts& run) {
  // First: a GPU that is missing ends the run before anything is made on disk.
  ASSIGN_OR_RETURN(run.model, MakeTrainModel(config, &run.gpu));
  if (!config.dir_was_given) {
    ASSIGN_OR_RETURN(config.saver.checkpoint_dir, MakeTempCheckpointDir());
  }
  if (lead) {
    std::fprintf(stderr, "train-sim: checkpoint_dir %s\n", config.saver.checkpoint_dir.c_str());
  }
  const TensorRegistry& registry = run.model->registry();
  AnnounceRun(config, registry, coordinator, lead);
  summary->state_bytes = registry.total_bytes();
  summary->tensors = registry.size();
  ASSIGN_OR_RETURN(run.input, OpenInput(config, coordinator));
  if (config.kill_at && config.kill_at->rank == (coordinator ? coordinator->rank() : 0)) {
    std::string fallback;
    run.own_fs =
        io::NewDefaultFileSystem({.force_posix_io = config.saver.force_posix_io}, &fallback);
    run.kill_fs = NewKillPointFileSystem(run.own_fs.get(), *config.kill_at);
    config.saver.file_system = run.kill_fs.get();
  }
  if (coordinator != nullptr) {
    // The savers of the ranks save one checkpoint together (docs/distributed.md).
    config.saver.coordinator = coordinator;
    config.saver.coordination_timeout_secs = config.coordination_timeout_secs;
  }
  // Every hook's save_secs timer reads the time the step ended, not its own moment inside
  // after_run: otherwise the memcpy or the save before a hook can push it past a trigger the
  // others missed, and model, input and yardstick go on saving at different steps.
  run.step_end = std::make_shared<std::atomic<double>>(SystemClockSeconds());
  config.saver.clock = [step_end = run.step_end] { return step_end->load(); };
  return Status::OK();
}

// The hooks in the order they run: the input hook, waited for (InputCommittedFirstHook), the
// yardstick, the model saver.
Result<std::vector<SessionRunHook*>> MakeHooks(const TrainSimConfig& config, RunParts& run) {
  const TensorRegistry* registry = &run.model->registry();
  // A session restored onto another number of ranks keeps the checkpoint it restored as it is:
  // re-saved, it would no longer pair with the input checkpoints of the ranks that saved it.
  auto keep_start = [&run](int64_t step) {
    return run.sharded_creator && run.sharded_creator->keeps_restored_checkpoint(step);
  };
  ASSIGN_OR_RETURN(run.hook,
                   MakeSaverHook(config, registry, &run.recorder, &run.totals, keep_start));
  // The input is checkpointed beside the library's savers only: none saves nothing, and naive
  // stands for a job that saves its tensors and nothing else.
  if (config.saver_kind == "sync" || config.saver_kind == "async") {
    // The creator, made later, says whose input position this rank resumes.
    auto source = [&run](int64_t) {
      return run.sharded_creator ? run.sharded_creator->input_source() : std::string();
    };
    ASSIGN_OR_RETURN(run.input_hook, MakeInputHook(config, run.input.get(), source));
  }
  std::vector<SessionRunHook*> hooks;
  // Always, not only with --shard: a plain run over a directory several ranks saved pairs its
  // model checkpoints with input.ckpt, which that directory lacks, so retention protects no
  // older set until the new one is whole.
  if (run.input_hook) {
    hooks.push_back(run.input_hook.get());
    run.input_first = std::make_unique<InputCommittedFirstHook>(run.input_hook.get());
    hooks.push_back(run.input_first.get());
  }
  if (config.memcpy_yardstick) {
    ASSIGN_OR_RETURN(run.yardstick, MemcpyYardstickHook::Create(registry, config.saver));
    hooks.push_back(run.yardstick.get());  // runs just before the saver
  }
  if (run.hook) hooks.push_back(run.hook.get());
  return hooks;
}

// Where the session resumed from, on stderr.
void ReportRestore(const TrainSimConfig& config, const RunSummary& summary,
                   Coordinator* coordinator, const RunParts& run) {
  const std::string restored_from = run.sharded_creator ? run.sharded_creator->restored_from()
                                                        : run.single_creator->restored_from();
  if (restored_from.empty()) return;
  if (run.sharded_creator) {
    std::fprintf(stderr,
                 "train-sim: rank %d restored step %" PRId64 " from %s: read %" PRIu64
                 " bytes in %.3f s\n",
                 coordinator->rank(), summary.start_step, restored_from.c_str(),
                 summary.restore_bytes_read, summary.restore_seconds);
  } else {
    std::fprintf(stderr,
                 "train-sim: resuming at step %" PRId64 " from %s and %s/%s-%" PRId64
                 " (the newest step with both a model and an input checkpoint)\n",
                 summary.start_step, restored_from.c_str(), config.saver.checkpoint_dir.c_str(),
                 InputCheckpointBasename(InputOptions(config)).c_str(), summary.start_step);
  }
}

// Rank 0 removes the input checkpoints of ranks this job does not have once their model
// checkpoints are gone, and what those ranks left behind (docs/distributed.md); a failure is
// reported, never fatal.
void RemoveOrphans(const TrainSimConfig& config, Coordinator* coordinator, const RunParts& run) {
  if (!run.input_hook || (coordinator != nullptr && coordinator->rank() != 0)) return;
  const uint32_t world = coordinator ? static_cast<uint32_t>(coordinator->size()) : 1;
  std::unique_ptr<io::FileSystem> posix;
  io::FileSystem* fs = config.saver.file_system;
  if (fs == nullptr) {
    posix = io::NewPosixFileSystem();
    fs = posix.get();
  }
  auto removed = RemoveOrphanedInputCheckpoints(*fs, config.saver.checkpoint_dir,
                                                config.saver.basename, world);
  if (!removed.ok()) {
    LogWarning("could not remove the input checkpoints of ranks this job does not have: " +
               removed.status().ToString());
    return;
  }
  for (const std::string& name : *removed) {
    std::fprintf(stderr, "train-sim: removed %s: its rank is not in this job of %u\n", name.c_str(),
                 world);
  }
}

// The creator, and the session it restores (or starts afresh).
Status CreateSession(const TrainSimConfig& config, std::vector<SessionRunHook*> hooks,
                     Coordinator* coordinator, RunParts& run, RunSummary* summary) {
  SessionCreator* creator = nullptr;
  if (coordinator == nullptr) {
    // A directory a job of several ranks saved last resumes by its rules (docs/distributed.md).
    // Unreadable: the one-process creator says what is wrong.
    auto saved_by = NewestModelWorldSize(config.saver.checkpoint_dir, config.saver.basename);
    if (saved_by.ok() && *saved_by > 1) {
      run.own_coordinator = NewSingleProcessCoordinator();
      coordinator = run.own_coordinator.get();
    }
  }
  if (coordinator != nullptr) {
    ASSIGN_OR_RETURN(run.sharded_creator, MakeShardedCreator(config, run.model.get(), coordinator));
    creator = run.sharded_creator.get();
  } else {
    ASSIGN_OR_RETURN(run.single_creator, MakeCreator(config, run.model.get()));
    creator = run.single_creator.get();
  }
  run.seed_checked = std::make_unique<SeedCheckedCreator>(config, creator);
  ASSIGN_OR_RETURN(run.session, MonitoredSession::Create(hooks, run.seed_checked.get()));
  summary->start_step = run.session->global_step();
  if (run.sharded_creator) {
    summary->restore_bytes_read = run.sharded_creator->restore_bytes_read();
    summary->restore_seconds = run.sharded_creator->restore_seconds();
  }
  ReportRestore(config, *summary, coordinator, run);
  RemoveOrphans(config, coordinator, run);
  return Status::OK();
}

// One training step: a batch, the model's update, the simulated accelerator time, the step's
// end on the savers' clock, and a pre-emption where --preempt_at_steps asks for one.
Status TrainStep(StepContext& ctx, const TrainSimConfig& config, Coordinator* coordinator,
                 RunParts& run, std::vector<uint8_t>& batch, std::set<int64_t>& preempted) {
  RETURN_IF_ERROR(run.input->next_batch(config.batch_size, &batch));
  run.model->Step(ctx.step(), XXH3_64bits(batch.data(), batch.size()));
  RETURN_IF_ERROR(run.model->status());
  if (config.step_ms > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(config.step_ms));
  }
  if (coordinator != nullptr && config.saver.save_secs) {
    // One clock for the job: every rank's input hook (and yardstick) then reaches each
    // save_secs trigger at the same step, as the model savers do.
    ASSIGN_OR_RETURN(double now, StepClock(*coordinator, SystemClockSeconds(), ctx.step()));
    run.step_end->store(now);
  } else {
    run.step_end->store(SystemClockSeconds());
  }
  // After the step's work, which the pre-emption loses: the session must restore it.
  if (config.preempt_at_steps.count(ctx.step()) && preempted.insert(ctx.step()).second) {
    return Status::Unavailable("simulated pre-emption at step " + std::to_string(ctx.step()) +
                               " (--preempt_at_steps)");
  }
  return Status::OK();
}

// Files the step's time, less the yardstick's memcpy taken inside it (train-sim's own
// measurement, not a cost of checkpointing), which it adds to `yardstick_ms_in_loop`.
void RecordStep(const TrainSimConfig& config, RunParts& run, double ms,
                double* yardstick_ms_in_loop, RunSummary* summary) {
  const int64_t step = run.session->global_step();
  if (run.yardstick) {
    auto it = run.yardstick->seconds_by_step().find(step);
    if (it != run.yardstick->seconds_by_step().end()) {
      ms -= it->second * 1000;
      *yardstick_ms_in_loop += it->second * 1000;
    }
  }
  const bool saved = run.recorder.TakeSavedAt(step);
  (saved ? summary->step_ms_save : summary->step_ms_no_save).push_back(ms);
  if (config.step_series && summary->step_series.size() < kMaxSeriesSteps) {
    summary->step_series.push_back({step, ms, saved});
  }
}

// The training loop to config.steps, a pre-emption-free stop, or the end of the data; then the
// session's close. Sets the loop's and the run's wall times.
Status TrainLoop(const TrainSimConfig& config, Coordinator* coordinator, bool lead, RunParts& run,
                 RunSummary* summary) {
  MonitoredSession& session = *run.session;
  std::vector<uint8_t> batch;
  std::set<int64_t> preempted;  // the --preempt_at_steps already injected
  const auto wall_start = SteadyClock::now();
  auto last_progress = wall_start;
  double yardstick_ms_in_loop = 0;
  Status status;
  // --end_rank_early: this rank's loop stops there while the others go on.
  int64_t last_step = config.steps;
  if (config.end_rank_early &&
      config.end_rank_early->first == (coordinator ? coordinator->rank() : 0)) {
    last_step = config.end_rank_early->second;
  }
  while (!session.should_stop() && session.global_step() < last_step) {
    const auto step_start = SteadyClock::now();
    status = session.run([&](StepContext& ctx) {
      return TrainStep(ctx, config, coordinator, run, batch, preempted);
    });
    if (status.ok()) status = run.recorder.gone_rank();
    if (!status.ok()) break;
    const double ms =
        std::chrono::duration<double, std::milli>(SteadyClock::now() - step_start).count();
    RecordStep(config, run, ms, &yardstick_ms_in_loop, summary);
    if (!config.quiet && lead &&
        SteadyClock::now() - last_progress > std::chrono::milliseconds(500)) {
      last_progress = SteadyClock::now();
      const SaverTotals now = run.totals();
      std::fprintf(
          stderr,
          "\rtrain-sim: step %" PRId64 "/%" PRId64 "  checkpoints %" PRId64 "  blocked %.2fs   ",
          session.global_step(), config.steps, now.saves_committed, now.blocked_seconds_total);
    }
  }
  summary->loop_seconds = std::chrono::duration<double>(SteadyClock::now() - wall_start).count() -
                          yardstick_ms_in_loop / 1000;
  if (status.code() == StatusCode::kOutOfRange) {
    std::fprintf(stderr, "\ntrain-sim: the dataset ended at step %" PRId64 "\n",
                 session.global_step());
    status = Status::OK();
  }
  if (status.ok() && coordinator != nullptr && coordinator->size() > 1 && config.saver.save_secs) {
    // Matched with a rank still training's StepClock, which then fails at once naming this end.
    status = AgreeOnEnd(*coordinator, session.global_step());
  }
  Status closed = session.close();
  if (!config.quiet && lead) std::fprintf(stderr, "\n");
  if (status.ok()) status = closed;
  RETURN_IF_ERROR(status);
  summary->wall_seconds = std::chrono::duration<double>(SteadyClock::now() - wall_start).count();
  return Status::OK();
}

// The run's final figures: steps, totals, digests, the input's, memory, verification, and with
// --shard every rank's (collective).
Status FinishRun(const TrainSimConfig& config, Coordinator* coordinator, bool lead, RunParts& run,
                 RunSummary* summary) {
  RemoveOrphans(config, run.own_coordinator ? run.own_coordinator.get() : coordinator, run);
  summary->final_step = run.session->global_step();
  summary->recoveries = run.session->recoveries();
  summary->totals = run.totals();
  if (coordinator != nullptr) {
    ASSIGN_OR_RETURN(summary->digest, GlobalDigest(*coordinator, run.model->registry()));
  } else {
    summary->digest = run.model->Digest();
  }
  summary->input_digest = IteratorDigest(*run.input);
  summary->records_consumed = run.input->records_emitted();
  summary->input_checkpoints = run.input_hook ? run.input_hook->saves_committed() : 0;
  if (run.yardstick) summary->memcpy_seconds_by_step = run.yardstick->seconds_by_step();
  summary->peak_rss_bytes = PeakRssBytes();
  if (run.gpu != nullptr) RETURN_IF_ERROR(RestoreIntoGpu(*run.gpu, summary->totals, summary));
  // naive and none write no checkpoint the reader could verify.
  if (config.verify && run.input_hook && lead) {
    RETURN_IF_ERROR(VerifyListed(config.saver.checkpoint_dir, &summary->verified));
  }
  if (coordinator != nullptr) {
    ASSIGN_OR_RETURN(summary->ranks, GatherFigures(*coordinator, *summary));
  }
  return Status::OK();
}

}  // namespace

Status RunTrainSim(TrainSimConfig& config, RunSummary* summary, Coordinator* coordinator) {
  const bool lead = coordinator == nullptr || coordinator->rank() == 0;
  if (coordinator != nullptr) {
    summary->rank = coordinator->rank();
    summary->world_size = coordinator->size();
  }
  RunParts run;
  RETURN_IF_ERROR(StartRun(config, summary, coordinator, lead, run));
  ASSIGN_OR_RETURN(std::vector<SessionRunHook*> hooks, MakeHooks(config, run));
  RETURN_IF_ERROR(CreateSession(config, std::move(hooks), coordinator, run, summary));
  RETURN_IF_ERROR(TrainLoop(config, coordinator, lead, run, summary));
  return FinishRun(config, coordinator, lead, run, summary);
}

namespace {

// Parses the command line into `flags`; false with `exit_code` set when the command ends here:
// --help (printed), a bad flag or an unexpected argument.
bool ParseCommandLine(int argc, char** argv, ParsedFlags* flags, int* exit_code) {
  auto parsed = ParseFlags(TrainSimFlags(), argc, argv);
  if (!parsed.ok()) {
    if (parsed.status().code() == StatusCode::kCancelled) {
      std::fputs(FlagsHelp(kTrainSimUsage, TrainSimFlags()).c_str(), stdout);
      *exit_code = kExitOk;
      return false;
    }
    std::fprintf(stderr, "asyncckpt train-sim: %s\n", parsed.status().message().c_str());
    *exit_code = kExitUsage;
    return false;
  }
  if (!parsed->positional().empty()) {
    std::fprintf(stderr, "asyncckpt train-sim: unexpected argument '%s'\n",
                 parsed->positional()[0].c_str());
    *exit_code = kExitUsage;
    return false;
  }
  *flags = std::move(parsed).value();
  return true;
}

// --shard: MPI starts before the flags are checked, since the checks need the rank and the
// number of ranks. Every rank checks the same flags, so a bad one fails every rank alike.
Result<std::unique_ptr<MpiSession>> StartMpi(const ParsedFlags& flags) {
  auto timeout = flags.get_double("coordination_timeout_secs");
  return MpiSession::Start(timeout.ok() && *timeout > 0 ? *timeout : 300);
}

// The flags checked, and the memory plan against the machine.
Result<TrainSimConfig> CheckedConfig(const ParsedFlags& flags, Coordinator* coordinator) {
  auto config = [&]() -> Result<TrainSimConfig> {
    if (coordinator == nullptr) return ConfigFromFlags(flags);
    // The model's checks need the rank and the world size; ConfigFromFlags reads them here.
    ShardContext context{coordinator->rank(), coordinator->size()};
    return ConfigFromFlags(flags, &context);
  }();
  if (!config.ok()) return config.status();
  RETURN_IF_ERROR(CheckTrainSimMemory(flags, *config));
  return config;
}

// The summary on stdout and --metrics_json: the lead rank's report.
int Report(const TrainSimConfig& config, const RunSummary& summary) {
  // --shard: the global state, the sum of the ranks' slices (train-sim replicates nothing).
  uint64_t state_bytes = summary.ranks.empty() ? summary.state_bytes : 0;
  for (const RankFigures& rank : summary.ranks) state_bytes += rank.shard_bytes;
  PrintSummary(config, summary, state_bytes);
  if (!config.metrics_json.empty()) {
    Status written = WriteMetricsJson(config, summary, state_bytes);
    if (!written.ok()) {
      std::fprintf(stderr, "asyncckpt train-sim: %s\n", written.message().c_str());
      return kExitFailed;
    }
  }
  return kExitOk;
}

// Everything after the flags and the MPI session: the exit code of this process.
int RunTrainSimCommand(const ParsedFlags& flags, MpiSession* mpi) {
  Coordinator* coordinator = mpi != nullptr ? &mpi->coordinator() : nullptr;
  const bool lead = coordinator == nullptr || coordinator->rank() == 0;
  auto config = CheckedConfig(flags, coordinator);
  if (coordinator != nullptr && coordinator->size() > 1) {
    // Every rank's usage error, and options that differ, reach rank 0, which prints them.
    Status agreed = AgreeOnConfig(*coordinator, config);
    if (!agreed.ok()) {
      if (agreed.code() != StatusCode::kInvalidArgument) {
        std::fprintf(stderr, "asyncckpt train-sim: rank %d: %s\n", coordinator->rank(),
                     agreed.message().c_str());
      } else if (lead) {
        std::fprintf(stderr, "asyncckpt train-sim: %s\n", agreed.message().c_str());
      }
      return kExitUsage;
    }
  }
  if (!config.ok()) {
    if (lead) std::fprintf(stderr, "asyncckpt train-sim: %s\n", config.status().message().c_str());
    return kExitUsage;
  }
  if (coordinator != nullptr && coordinator->size() > 1) {
    // The dataset every rank reads, once rank 0 has written it: the same on every rank.
    Status agreed = AgreeOnDataset(*coordinator, *config);
    if (!agreed.ok()) {
      if (lead) std::fprintf(stderr, "asyncckpt train-sim: %s\n", agreed.message().c_str());
      return agreed.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailed;
    }
  }
  RunSummary summary;
  Status status = RunTrainSim(*config, &summary, coordinator);
  if (!status.ok()) {
    std::fprintf(stderr, "asyncckpt train-sim: %s%s\n",
                 coordinator ? ("rank " + std::to_string(coordinator->rank()) + ": ").c_str() : "",
                 status.ToString().c_str());
    // The other ranks may be waiting for this one in a collective: end the job.
    if (mpi && coordinator->size() > 1) mpi->Abort(kExitFailed);
    return kExitFailed;
  }
  if (!lead) return kExitOk;
  return Report(*config, summary);
}

}  // namespace

int TrainSimCommand(int argc, char** argv) {
  ParsedFlags flags;
  if (int exit_code = kExitOk; !ParseCommandLine(argc, argv, &flags, &exit_code)) {
    return exit_code;
  }
  std::unique_ptr<MpiSession> mpi;
  if (flags.get_switch("shard")) {
    auto started = StartMpi(flags);
    if (!started.ok()) {
      std::fprintf(stderr, "asyncckpt train-sim: %s\n", started.status().message().c_str());
      return started.status().code() == StatusCode::kFailedPrecondition ? kExitUsage : kExitFailed;
    }
    mpi = std::move(started).value();
  }
  const int exit_code = RunTrainSimCommand(flags, mpi.get());
  if (exit_code != kExitOk && mpi != nullptr) {
    // Rank 0 prints a usage error for every rank: it ends the launcher, the others wait for it.
    const bool printed_by_lead = exit_code == kExitUsage && mpi->coordinator().rank() != 0;
    mpi->FailTheLaunch(exit_code,
                       printed_by_lead ? std::chrono::seconds(3) : std::chrono::seconds(0));
  }
  return exit_code;
}

}  // namespace asyncckpt::cli
