#pragma once

// The memory plan of `asyncckpt train-sim`: a run that cannot fit in the machine's memory is a
// clear usage error naming the flags that size it, not a std::bad_alloc halfway through start-up.

#include "asyncckpt/status.h"
#include "src/cli/flags.h"
#include "src/cli/train_sim_flags.h"

namespace asyncckpt::cli {

/// Checks the memory the run will hold (state, staging, the yardstick's copy, input buffers)
/// against what the machine has, or --max_memory, before anything is allocated: InvalidArgument
/// naming the flags as given, with a hint of the flags that would make it fit where there is one.
Status CheckTrainSimMemory(const ParsedFlags& flags, const TrainSimConfig& config);

}  // namespace asyncckpt::cli
