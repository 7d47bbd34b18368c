#include <cstdio>
#include <cstring>
#include <string>

#include "src/cli/commands.h"

namespace {

constexpr char kUsage[] =
    "usage: asyncckpt COMMAND [flags]\n"
    "\n"
    "commands:\n"
    "  train-sim         run a synthetic training job that checkpoints as it goes\n"
    "  inspect PATH      list a checkpoint's tensors, dtypes, shapes, chunks and codecs\n"
    "  verify PATH       check every chunk of a checkpoint (exit 0 only when all is sound)\n"
    "  latest DIR        print the latest checkpoint named by DIR/checkpoint\n"
    "\n"
    "`asyncckpt COMMAND --help` describes a command's flags.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "train-sim") return asyncckpt::cli::TrainSimCommand(argc - 2, argv + 2);
  if (command == "inspect") return asyncckpt::cli::InspectCommand(argc - 2, argv + 2);
  if (command == "verify") return asyncckpt::cli::VerifyCommand(argc - 2, argv + 2);
  if (command == "latest") return asyncckpt::cli::LatestCommand(argc - 2, argv + 2);
  std::fprintf(stderr, "asyncckpt: unknown command '%s' (try asyncckpt --help)\n", command.c_str());
  return 2;
}
