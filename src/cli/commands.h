#pragma once

// The asyncckpt CLI's commands. Each takes the arguments after the command name and returns the
// process exit status; errors are one clear line on stderr.

namespace asyncckpt::cli {

/// Exit status: success (and --help).
inline constexpr int kExitOk = 0;
/// Exit status: the operation failed: I/O, a damaged or missing checkpoint, a failed save, memory
/// that ran out mid-run.
inline constexpr int kExitFailed = 1;
/// Exit status: bad usage, found before anything ran: an unknown command or flag, a missing or
/// extra argument, a bad or out-of-range value, a job too large for the machine's memory.
inline constexpr int kExitUsage = 2;

/// Runs `command` (one of the commands below) named `name`, as the last line of defence: an
/// exception that escapes it is one line on stderr and kExitFailed, never an abort.
int RunCommand(const char* name, int (*command)(int, char**), int argc, char** argv) noexcept;

/// `asyncckpt train-sim`: the synthetic training job.
int TrainSimCommand(int argc, char** argv);
/// `asyncckpt inspect PATH`: tensors, dtypes, shapes, chunk and codec stats.
int InspectCommand(int argc, char** argv);
/// `asyncckpt verify PATH`: checks every chunk; exit 0 only when all is sound.
int VerifyCommand(int argc, char** argv);
/// `asyncckpt latest DIR`: prints the latest checkpoint's path.
int LatestCommand(int argc, char** argv);

}  // namespace asyncckpt::cli
