#pragma once

// train-sim --device cuda's pieces beside the host run: the model, stream-ordered mode, and the
// restore into GPU memory after the run.

#include <memory>

#include "asyncckpt/saver_hook.h"
#include "asyncckpt/status.h"
#include "src/cli/gpu_model.h"
#include "src/cli/sim_model.h"
#include "src/cli/train_sim_flags.h"
#include "src/cli/train_sim_summary.h"

namespace asyncckpt::cli {

/// The model --device asks for: SimModel in host memory, or GpuModel (set in *gpu, borrowed)
/// with its compute stream handed to the device when saves are stream-ordered.
Result<std::unique_ptr<TrainModel>> MakeTrainModel(const TrainSimConfig& config, GpuModel** gpu);

/// --device cuda, after the run: restores the newest committed checkpoint of `totals` into the
/// model's GPU memory, timed, and checks that its digest is the final state's
/// (summary->digest); fills the summary's GPU fields.
Status RestoreIntoGpu(GpuModel& gpu, const SaverTotals& totals, RunSummary* summary);

/// The summary's GPU lines (nothing for host state).
void PrintGpuFigures(const RunSummary& summary);

}  // namespace asyncckpt::cli
