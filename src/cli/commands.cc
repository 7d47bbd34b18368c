#include "src/cli/commands.h"

#include <cinttypes>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "asyncckpt/reader.h"
#include "asyncckpt/state.h"
#include "src/cli/flags.h"
#include "src/cli/json.h"

namespace asyncckpt::cli {

namespace {

// Parses a command's flags; prints help or the error. Returns nullopt with *exit_code set when
// the command should end now.
std::optional<ParsedFlags> ParseOrExit(const std::string& usage, const std::vector<FlagSpec>& specs,
                                       int argc, char** argv, size_t positional, int* exit_code) {
  auto flags = ParseFlags(specs, argc, argv);
  if (!flags.ok()) {
    if (flags.status().code() == StatusCode::kCancelled) {
      std::fputs(FlagsHelp(usage, specs).c_str(), stdout);
      *exit_code = kExitOk;
    } else {
      std::fprintf(stderr, "asyncckpt: %s\n", flags.status().message().c_str());
      *exit_code = kExitUsage;
    }
    return std::nullopt;
  }
  if (flags->positional().size() != positional) {
    std::fprintf(stderr, "asyncckpt: expected %zu argument(s); usage: %s\n", positional,
                 usage.c_str());
    *exit_code = kExitUsage;
    return std::nullopt;
  }
  return std::move(flags).value();
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string text = "[";
  // Appended piece by piece: GCC 12 at -O3 reports `"," + std::string&&` as an overlapping
  // memcpy (-Wrestrict, a known false positive), which a Release build with -Werror refuses.
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) text += ',';
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

int Fail(const Status& status) {
  std::fprintf(stderr, "asyncckpt: %s\n", status.ToString().c_str());
  return kExitFailed;
}

}  // namespace

int RunCommand(const char* name, int (*command)(int, char**), int argc, char** argv) noexcept {
  try {
    return command(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "asyncckpt %s: out of memory (an allocation failed; lower the sizes the flags "
                 "ask for, or free memory)\n",
                 name);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "asyncckpt %s: unexpected error: %s\n", name, e.what());
  } catch (...) {
    std::fprintf(stderr, "asyncckpt %s: unexpected error\n", name);
  }
  return kExitFailed;
}

int InspectCommand(int argc, char** argv) {
  const std::vector<FlagSpec> specs = {{"json", "", "print one JSON object", true}};
  int exit_code = 0;
  auto flags = ParseOrExit("asyncckpt inspect PATH [--json]", specs, argc, argv, 1, &exit_code);
  if (!flags) return exit_code;
  auto reader = CheckpointReader::Open(flags->positional()[0]);
  if (!reader.ok()) return Fail(reader.status());
  const auto& meta = (*reader)->metadata();
  uint64_t raw = 0, stored = 0, chunks = 0;
  std::map<std::string, uint64_t> codecs;
  for (const auto& t : (*reader)->tensors()) {
    raw += t.bytes;
    stored += t.stored_bytes;
    chunks += t.num_chunks;
    for (const auto& [codec, n] : t.chunks_by_codec) codecs[codec] += n;
  }
  if (flags->get_switch("json")) {
    JsonWriter json;
    json.begin_object();
    json.field("path", (*reader)->path());
    json.field("step", meta.step);
    json.field("wall_time", meta.wall_time);
    json.key("user_metadata").begin_object();
    for (const auto& [k, v] : meta.user) json.field(k, v);
    json.end_object();
    json.field("num_data_files", static_cast<uint64_t>((*reader)->num_data_files()));
    json.field("bytes_raw", raw);
    json.field("bytes_stored", stored);
    json.field("chunks", chunks);
    json.key("chunks_by_codec").begin_object();
    for (const auto& [k, v] : codecs) json.field(k, v);
    json.end_object();
    json.key("tensors").begin_array();
    for (const auto& t : (*reader)->tensors()) {
      json.begin_object();
      json.field("name", t.name);
      json.field("dtype", std::string(DTypeName(t.dtype)));
      json.key("shape").begin_array();
      for (int64_t d : t.shape) json.value(d);
      json.end_array();
      json.field("bytes", t.bytes);
      json.field("stored_bytes", t.stored_bytes);
      json.field("chunks", t.num_chunks);
      json.key("chunks_by_codec").begin_object();
      for (const auto& [k, v] : t.chunks_by_codec) json.field(k, v);
      json.end_object();
      json.end_object();
    }
    json.end_array();
    json.end_object();
    std::printf("%s\n", json.str().c_str());
    return kExitOk;
  }
  std::printf("checkpoint %s\n  step %" PRId64 ", %zu tensors, %u data files\n",
              (*reader)->path().c_str(), meta.step, (*reader)->tensors().size(),
              (*reader)->num_data_files());
  std::printf("  %s raw, %s stored (ratio %.2f), %" PRIu64 " chunks:", FormatBytes(raw).c_str(),
              FormatBytes(stored).c_str(), stored ? double(raw) / double(stored) : 1.0, chunks);
  for (const auto& [k, v] : codecs) std::printf(" %s=%" PRIu64, k.c_str(), v);
  std::printf("\n");
  for (const auto& [k, v] : meta.user) std::printf("  metadata %s = %s\n", k.c_str(), v.c_str());
  std::printf("  %-40s %-7s %-16s %12s %12s %7s\n", "tensor", "dtype", "shape", "bytes", "stored",
              "chunks");
  for (const auto& t : (*reader)->tensors()) {
    std::printf("  %-40s %-7s %-16s %12" PRIu64 " %12" PRIu64 " %7" PRIu64 "\n", t.name.c_str(),
                std::string(DTypeName(t.dtype)).c_str(), ShapeString(t.shape).c_str(), t.bytes,
                t.stored_bytes, t.num_chunks);
  }
  return kExitOk;
}

int VerifyCommand(int argc, char** argv) {
  int exit_code = 0;
  auto flags = ParseOrExit("asyncckpt verify PATH", {}, argc, argv, 1, &exit_code);
  if (!flags) return exit_code;
  auto reader = CheckpointReader::Open(flags->positional()[0]);
  if (!reader.ok()) return Fail(reader.status());
  const VerifyReport report = (*reader)->verify();
  for (const auto& problem : report.problems)
    std::fprintf(stderr, "damaged: %s\n", problem.c_str());
  if (!report.problems.empty()) {
    std::fprintf(stderr, "asyncckpt: %s is damaged (%zu problems)\n", (*reader)->path().c_str(),
                 report.problems.size());
    return kExitFailed;
  }
  std::printf("%s: OK (%" PRIu64 " chunks, %s verified)\n", (*reader)->path().c_str(),
              report.chunks_checked, FormatBytes(double(report.bytes_checked)).c_str());
  return kExitOk;
}

int LatestCommand(int argc, char** argv) {
  int exit_code = 0;
  auto flags = ParseOrExit("asyncckpt latest DIR", {}, argc, argv, 1, &exit_code);
  if (!flags) return exit_code;
  auto latest = LatestCheckpoint(flags->positional()[0]);
  if (!latest.ok()) return Fail(latest.status());
  std::printf("%s\n", latest->c_str());
  return kExitOk;
}

}  // namespace asyncckpt::cli
