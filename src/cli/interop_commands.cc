// `asyncckpt export` and `asyncckpt import`: a checkpoint's tensors as safetensors files and
// back (ExportSafetensors, ImportSafetensors).

#include <cstdio>
#include <string>
#include <vector>

#include "asyncckpt/safetensors.h"
#include "src/cli/commands.h"

namespace asyncckpt::cli {
namespace {

// --format: safetensors is the one format there is; the flag names it so that others can come.
bool FormatIsSafetensors(const ParsedFlags& flags, int* exit_code) {
  if (flags.get("format") == "safetensors") return true;
  std::fprintf(stderr, "asyncckpt: --format '%s' is not supported (only 'safetensors')\n",
               flags.get("format").c_str());
  *exit_code = kExitUsage;
  return false;
}

// Input refused before anything was written is bad usage (exit 2); anything else failed (1).
int Refused(const Status& status) {
  if (status.code() != StatusCode::kInvalidArgument) return Fail(status);
  std::fprintf(stderr, "asyncckpt: %s\n", status.message().c_str());
  return kExitUsage;
}

}  // namespace

int ExportCommand(int argc, char** argv) {
  const std::vector<FlagSpec> specs = {
      {"format", "safetensors", "the files' format"},
      {"select", "", "the tensors to export, by exported name: a glob ('model.*') or a prefix"},
      {"max_shard_bytes", "0",
       "most tensor bytes per file (512MiB, 5GB, ...); 0: one model.safetensors"},
      {"keep_names", "", "keep the checkpoint's '/'-joined names (default: '.'-joined)", true},
  };
  int exit_code = 0;
  auto flags = ParseOrExit("asyncckpt export --format safetensors CHECKPOINT OUT_DIR [flags]",
                           specs, argc, argv, 2, &exit_code);
  if (!flags || !FormatIsSafetensors(*flags, &exit_code)) return exit_code;
  SafetensorsExportOptions options;
  options.select = flags->get("select");
  options.keep_names = flags->get_switch("keep_names");
  Result<uint64_t> max_bytes = flags->get_bytes("max_shard_bytes");
  if (!max_bytes.ok()) return Refused(max_bytes.status());
  options.max_shard_bytes = *max_bytes;
  auto report = ExportSafetensors(flags->positional()[0], flags->positional()[1], options);
  if (!report.ok()) return Refused(report.status());
  for (const std::string& file : report->files) {
    std::printf("%s/%s\n", flags->positional()[1].c_str(), file.c_str());
  }
  std::fprintf(stderr, "asyncckpt: exported %llu tensors, %llu bytes\n",
               static_cast<unsigned long long>(report->tensors),
               static_cast<unsigned long long>(report->bytes));
  return kExitOk;
}

int ImportCommand(int argc, char** argv) {
  const std::vector<FlagSpec> specs = {
      {"format", "safetensors", "the files' format"},
      {"step", "0", "the step of the checkpoint made"},
      {"basename", "model.ckpt", "the checkpoint is CHECKPOINT_DIR/<basename>-<step>"},
      {"prefix", "", "put before every tensor name (e.g. model/)"},
      {"compression", "shuffle+zstd", "none, zstd or shuffle+zstd"},
  };
  int exit_code = 0;
  auto flags = ParseOrExit("asyncckpt import --format safetensors IN CHECKPOINT_DIR [flags]", specs,
                           argc, argv, 2, &exit_code);
  if (!flags || !FormatIsSafetensors(*flags, &exit_code)) return exit_code;
  SafetensorsImportOptions options;
  Result<int64_t> step = flags->get_int("step");
  if (!step.ok()) return Refused(step.status());
  if (*step < 0)
    return Refused(Status::InvalidArgument("--step must be >= 0, got " + std::to_string(*step)));
  std::optional<CompressionKind> codec = ParseCompressionKind(flags->get("compression"));
  if (!codec) {
    return Refused(Status::InvalidArgument("--compression '" + flags->get("compression") +
                                           "' is not none, zstd or shuffle+zstd"));
  }
  options.step = *step;
  options.basename = flags->get("basename");
  options.prefix = flags->get("prefix");
  options.compression.kind = *codec;
  auto made = ImportSafetensors(flags->positional()[0], flags->positional()[1], options);
  if (!made.ok()) return Refused(made.status());
  std::printf("%s\n", made->c_str());
  return kExitOk;
}

}  // namespace asyncckpt::cli
