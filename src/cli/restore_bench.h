#pragma once

// `asyncckpt restore-bench PATH`: restores every tensor of a checkpoint into host memory through
// the public reader, as a training job's restore would, and reports the read throughput (bytes
// on disk per second) and the decoded throughput (raw bytes per second) of each repeat.

namespace asyncckpt::cli {

/// `asyncckpt restore-bench PATH [--queue_depth N] [--o_direct 0|1] [--repeat N]
/// [--drop_cache] [--json]`; exit status as commands.h says.
int RestoreBenchCommand(int argc, char** argv);

}  // namespace asyncckpt::cli
