// train-sim --device cuda's model, restore and report (see train_sim_gpu.h).

#include "src/cli/train_sim_gpu.h"

#include <cstdio>

#include "asyncckpt/reader.h"
#include "src/util/elapsed.h"
#include "src/util/status_macros.h"

namespace asyncckpt::cli {

Result<std::unique_ptr<TrainModel>> MakeTrainModel(const TrainSimConfig& config, GpuModel** gpu) {
  *gpu = nullptr;
  if (!config.cuda) {
    ASSIGN_OR_RETURN(std::unique_ptr<SimModel> model, SimModel::Create(config.model));
    return std::unique_ptr<TrainModel>(std::move(model));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<GpuModel> model,
                   GpuModel::Create(config.model, config.stream_ordered));
  if (config.stream_ordered) {
    RETURN_IF_ERROR(SetCudaComputeStream(*model->device(), model->compute_stream()));
  }
  *gpu = model.get();
  return std::unique_ptr<TrainModel>(std::move(model));
}

Status RestoreIntoGpu(GpuModel& gpu, const SaverTotals& totals, RunSummary* summary) {
  summary->d2h_seconds = gpu.d2h_seconds();
  const SaveStats* newest = nullptr;
  for (const SaveStats& stats : totals.saves) {
    if (stats.status.ok() && !stats.path.empty()) newest = &stats;
  }
  if (newest == nullptr) return Status::OK();
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(newest->path));
  const auto start = SteadyClock::now();
  RETURN_IF_ERROR(reader->restore(gpu.registry()));
  summary->gpu_restore_seconds = SecondsSince(start);
  // The newest checkpoint holds the final state (end() saves the last step).
  summary->gpu_restore_exact = gpu.Digest() == summary->digest ? 1 : 0;
  return Status::OK();
}

void PrintGpuFigures(const RunSummary& s) {
  if (s.d2h_seconds <= 0) return;
  std::printf(
      "GPU state          D2H of the state %.3f s; loop time lost per save %.3f s = %.2f "
      "of it\n",
      s.d2h_seconds, LoopSecondsLostPerSave(s), LoopSecondsLostPerSave(s) / s.d2h_seconds);
  if (s.gpu_restore_exact >= 0) {
    std::printf("restore into GPU   %.3f s (%.2f GB/s), %s\n", s.gpu_restore_seconds,
                double(s.state_bytes) / s.gpu_restore_seconds / 1e9,
                s.gpu_restore_exact ? "bit-exact" : "NOT BIT-EXACT");
  }
}

}  // namespace asyncckpt::cli
