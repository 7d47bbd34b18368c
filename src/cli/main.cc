#include <cstdio>
#include <cstring>
#include <string>

#include "src/cli/commands.h"
#include "src/cli/restore_bench.h"

namespace {

constexpr char kUsage[] =
    "usage: asyncckpt COMMAND [flags]\n"
    "\n"
    "commands:\n"
    "  train-sim         run a synthetic training job that checkpoints as it goes\n"
    "  inspect PATH      list a checkpoint's tensors, dtypes, shapes, chunks and codecs\n"
    "  verify PATH       check every chunk of a checkpoint (exit 0 only when all is sound)\n"
    "  latest DIR        print the checkpoint a resume in DIR would use (DIR/checkpoint's\n"
    "                    latest, passing over damaged ones)\n"
    "  gc DIR            list the quarantined (damaged) checkpoints in DIR and their size;\n"
    "                    --remove-quarantined removes them, and nothing else\n"
    "  restore-bench PATH  restore every tensor into memory and report the read throughput\n"
    "  export --format safetensors CHECKPOINT OUT_DIR   the tensors as safetensors files\n"
    "  import --format safetensors IN CHECKPOINT_DIR    a checkpoint made from safetensors files\n"
    "\n"
    "`asyncckpt COMMAND --help` describes a command's flags.\n"
    "\n"
    "exit status: 0 success, 1 the operation failed (I/O, a damaged or missing checkpoint, a\n"
    "failed save), 2 bad usage (unknown command or flag, bad value, missing argument).\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace asyncckpt::cli;
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? kExitUsage : kExitOk;
  }
  const std::string command = argv[1];
  int (*run)(int, char**) = nullptr;
  if (command == "train-sim") run = TrainSimCommand;
  if (command == "inspect") run = InspectCommand;
  if (command == "verify") run = VerifyCommand;
  if (command == "latest") run = LatestCommand;
  if (command == "gc") run = GcCommand;
  if (command == "restore-bench") run = RestoreBenchCommand;
  if (command == "export") run = ExportCommand;
  if (command == "import") run = ImportCommand;
  if (run == nullptr) {
    std::fprintf(stderr, "asyncckpt: unknown command '%s' (try asyncckpt --help)\n",
                 command.c_str());
    return kExitUsage;
  }
  return RunCommand(argv[1], run, argc - 2, argv + 2);
}
