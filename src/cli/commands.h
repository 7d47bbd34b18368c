#pragma once

// The asyncckpt CLI's commands. Each takes the arguments after the command name and returns the
// process exit status; errors are one clear line on stderr.

namespace asyncckpt::cli {

/// `asyncckpt train-sim`: the synthetic training job.
int TrainSimCommand(int argc, char** argv);
/// `asyncckpt inspect PATH`: tensors, dtypes, shapes, chunk and codec stats.
int InspectCommand(int argc, char** argv);
/// `asyncckpt verify PATH`: checks every chunk; exit 0 only when all is sound.
int VerifyCommand(int argc, char** argv);
/// `asyncckpt latest DIR`: prints the latest checkpoint's path.
int LatestCommand(int argc, char** argv);

}  // namespace asyncckpt::cli
