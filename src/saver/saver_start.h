#pragma once

// A saver's start: its storage (lock, clean-up) and, in a multi-process job, the agreement of the
// ranks on the job token, on who writes what, and on whether every rank has started.

#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/saver_options.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"
#include "src/saver/saver_storage.h"

namespace asyncckpt {

/// What a saver's begin() hands its engine.
struct SaverStart {
  /// Entries rank 0 (or the single process) removed from checkpoint_dir at the start.
  std::vector<std::string> removed;
  /// The job's token (multi-process jobs; empty otherwise).
  std::string job_token;
  /// Multi-process jobs: the tensors and boxes this rank writes (replicas held by a lower rank
  /// left out). Null in a single process: the engine takes the hook's registry.
  std::unique_ptr<TensorRegistry> written;
};

/// A saver's start. One process: storage->Start(options) (lock, clean-up). A multi-process job
/// (options.coordinator of size > 1; collective): rank 0 runs storage->Start while the others
/// wait, then every rank learns the job token, rank != 0 attaches to the directory
/// (storage->Attach), and the ranks agree on who writes what (AgreeOnWriters). Every rank
/// returns the same error when one rank could not start, naming it.
Result<SaverStart> StartSaver(const SaverOptions& options, const TensorRegistry& registry,
                              SaverStorage* storage);

/// Collective in a multi-process job (a no-op otherwise): OK on every rank when `local` is OK
/// on every rank, else on every rank the error of the lowest failing rank, naming it. The hooks
/// call it after creating their engine, so that no rank trains on alone.
Status AgreeStarted(const SaverOptions& options, const Status& local);

}  // namespace asyncckpt
