#pragma once

// The asyncckpt CLI's commands. Each takes the arguments after the command name and returns the
// process exit status; errors are one clear line on stderr.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "asyncckpt/status.h"
#include "src/cli/flags.h"

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

/// Parses a command's flags, expecting `positional` arguments; prints the help or the error.
/// Returns nullopt with *exit_code set when the command should end now.
std::optional<ParsedFlags> ParseOrExit(const std::string& usage, const std::vector<FlagSpec>& specs,
                                       int argc, char** argv, size_t positional, int* exit_code);

/// Prints `status` as the command's one line on stderr; returns kExitFailed.
int Fail(const Status& status);

/// `asyncckpt train-sim`: the synthetic training job.
int TrainSimCommand(int argc, char** argv);
/// `asyncckpt inspect PATH`: tensors, dtypes, shapes, chunk and codec stats.
int InspectCommand(int argc, char** argv);
/// `asyncckpt verify PATH`: checks every chunk; exit 0 only when all is sound.
int VerifyCommand(int argc, char** argv);
/// `asyncckpt latest DIR`: prints the path of the checkpoint a resume would use
/// (FindResumeCheckpoints), naming on stderr the damaged ones it passed over.
int LatestCommand(int argc, char** argv);
/// `asyncckpt export --format safetensors CHECKPOINT OUT_DIR`: the tensors as safetensors.
int ExportCommand(int argc, char** argv);
/// `asyncckpt import --format safetensors IN CHECKPOINT_DIR`: a checkpoint made from them.
int ImportCommand(int argc, char** argv);
/// `asyncckpt gc DIR`: lists the quarantined checkpoints and their bytes; with
/// --remove-quarantined removes them, and nothing else.
int GcCommand(int argc, char** argv);

}  // namespace asyncckpt::cli
