#pragma once

// The run of `asyncckpt train-sim`: a synthetic training job that checkpoints as it goes,
// resumes from its checkpoint directory, and measures what checkpointing cost the training
// loop. The command itself (TrainSimCommand in commands.h) checks the flags
// (train_sim_flags.h) and the memory plan (train_sim_memory.h), runs this, and prints the
// report (train_sim_report.h).

#include "asyncckpt/coordinator.h"
#include "asyncckpt/status.h"
#include "src/cli/train_sim_flags.h"
#include "src/cli/train_sim_summary.h"

namespace asyncckpt::cli {

/// Runs the job `config` describes to config.steps (or the end of its data), filling `summary`.
/// Makes a temporary checkpoint directory when none was given, and sets the config's
/// checkpoint_dir, dataset and input path to what the run used. `coordinator`: the job's, with
/// --shard (then collective: every rank calls it); null for a job of one process.
Status RunTrainSim(TrainSimConfig& config, RunSummary* summary, Coordinator* coordinator);

}  // namespace asyncckpt::cli
