#include "src/cli/commands.h"

#include <cinttypes>
#include <cstdio>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "asyncckpt/reader.h"
#include "asyncckpt/state.h"
#include "src/cli/flags.h"
#include "src/cli/json.h"
#include "src/state/checkpoint_names.h"
#include "src/state/committed_steps.h"
#include "src/util/io_status.h"

namespace asyncckpt::cli {

namespace {

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

// "[0:13,0:33]": a slice's box as first:end per dimension.
std::string BoxString(const SliceInfo& slice) {
  std::string text = "[";
  for (size_t i = 0; i < slice.shape.size(); ++i) {
    if (i != 0) text += ',';
    text += std::to_string(slice.offset[i]);
    text += ':';
    text += std::to_string(slice.offset[i] + slice.shape[i]);
  }
  return text + "]";
}

// What one rank wrote of a sharded checkpoint.
struct RankTotals {
  uint64_t slices = 0;
  uint64_t bytes = 0;
  uint64_t stored_bytes = 0;
  uint64_t chunks = 0;
};

std::vector<RankTotals> TotalsByRank(const CheckpointReader& reader) {
  std::vector<RankTotals> ranks(reader.world_size());
  for (const TensorInfo& t : reader.tensors()) {
    for (const SliceInfo& slice : t.slices) {
      if (slice.writer_rank >= ranks.size()) continue;  // the reader checked; never happens
      RankTotals& rank = ranks[slice.writer_rank];
      ++rank.slices;
      rank.bytes += slice.bytes;
      rank.stored_bytes += slice.stored_bytes;
      rank.chunks += slice.num_chunks;
    }
  }
  return ranks;
}

size_t CountSlices(const CheckpointReader& reader) {
  size_t slices = 0;
  for (const TensorInfo& t : reader.tensors()) slices += t.slices.size();
  return slices;
}

}  // namespace

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

int Fail(const Status& status) {
  std::fprintf(stderr, "asyncckpt: %s\n", status.ToString().c_str());
  return kExitFailed;
}

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
    json.field("sharded", (*reader)->sharded());
    json.field("world_size", static_cast<uint64_t>((*reader)->world_size()));
    if ((*reader)->sharded()) {
      json.key("ranks").begin_array();
      const std::vector<RankTotals> ranks = TotalsByRank(**reader);
      for (size_t r = 0; r < ranks.size(); ++r) {
        json.begin_object();
        json.field("rank", static_cast<uint64_t>(r));
        json.field("slices", ranks[r].slices);
        json.field("bytes", ranks[r].bytes);
        json.field("stored_bytes", ranks[r].stored_bytes);
        json.field("chunks", ranks[r].chunks);
        json.end_object();
      }
      json.end_array();
    }
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
      if ((*reader)->sharded()) {
        json.key("slices").begin_array();
        for (const SliceInfo& slice : t.slices) {
          json.begin_object();
          json.key("offset").begin_array();
          for (int64_t d : slice.offset) json.value(d);
          json.end_array();
          json.key("shape").begin_array();
          for (int64_t d : slice.shape) json.value(d);
          json.end_array();
          json.field("writer_rank", static_cast<uint64_t>(slice.writer_rank));
          json.field("bytes", slice.bytes);
          json.field("stored_bytes", slice.stored_bytes);
          json.field("chunks", slice.num_chunks);
          json.end_object();
        }
        json.end_array();
      }
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
  if ((*reader)->sharded()) {
    std::printf("  sharded: %zu slices written by %u ranks\n", CountSlices(**reader),
                (*reader)->world_size());
    const std::vector<RankTotals> ranks = TotalsByRank(**reader);
    for (size_t r = 0; r < ranks.size(); ++r) {
      std::printf("    rank %zu: %" PRIu64 " slices, %s raw, %s stored, %" PRIu64 " chunks\n", r,
                  ranks[r].slices, FormatBytes(double(ranks[r].bytes)).c_str(),
                  FormatBytes(double(ranks[r].stored_bytes)).c_str(), ranks[r].chunks);
    }
  }
  for (const auto& [k, v] : meta.user) std::printf("  metadata %s = %s\n", k.c_str(), v.c_str());
  std::printf("  %-40s %-7s %-16s %12s %12s %7s\n", "tensor", "dtype", "shape", "bytes", "stored",
              "chunks");
  for (const auto& t : (*reader)->tensors()) {
    std::printf("  %-40s %-7s %-16s %12" PRIu64 " %12" PRIu64 " %7" PRIu64 "\n", t.name.c_str(),
                std::string(DTypeName(t.dtype)).c_str(), ShapeString(t.shape).c_str(), t.bytes,
                t.stored_bytes, t.num_chunks);
    // Sharded: the global tensor's line, then one line per slice: its box and writer rank.
    for (const SliceInfo& slice : t.slices) {
      // Appended, not `"slice " + std::string&&`: the -Wrestrict false positive above.
      std::string box = "slice ";
      box += BoxString(slice);
      std::string rank = "rank ";
      rank += std::to_string(slice.writer_rank);
      std::printf("    %-38s %-7s %-16s %12" PRIu64 " %12" PRIu64 " %7" PRIu64 "\n", box.c_str(),
                  rank.c_str(), ShapeString(slice.shape).c_str(), slice.bytes, slice.stored_bytes,
                  slice.num_chunks);
    }
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
  if ((*reader)->sharded()) {
    // Open() refuses slices that overlap or leave a gap, so reaching here means they tile.
    std::printf("%s: OK (sharded over %u ranks: %zu slices tile %zu tensors; %" PRIu64
                " chunks, %s verified)\n",
                (*reader)->path().c_str(), (*reader)->world_size(), CountSlices(**reader),
                (*reader)->tensors().size(), report.chunks_checked,
                FormatBytes(double(report.bytes_checked)).c_str());
    return kExitOk;
  }
  std::printf("%s: OK (%" PRIu64 " chunks, %s verified)\n", (*reader)->path().c_str(),
              report.chunks_checked, FormatBytes(double(report.bytes_checked)).c_str());
  return kExitOk;
}

int LatestCommand(int argc, char** argv) {
  const std::vector<FlagSpec> specs = {
      {"basename", "",
       "the checkpoints' basename (default: the state file's latest entry's, or "
       "model.ckpt)"},
      {"state_file", kCheckpointStateFileName, "the state file's name in DIR"}};
  int exit_code = 0;
  auto flags = ParseOrExit("asyncckpt latest DIR [--basename NAME] [--state_file NAME]", specs,
                           argc, argv, 1, &exit_code);
  if (!flags) return exit_code;
  // What a resume would restore, not merely what the state file names: the damaged ones a start
  // would quarantine are passed over, and said so on stderr.
  auto resume = FindResumeCheckpoints(flags->positional()[0], flags->get("basename"),
                                      flags->get("state_file"));
  if (!resume.ok()) return Fail(resume.status());
  if (!resume->state_file_problem.empty()) {
    std::fprintf(stderr, "asyncckpt: note: %s\n", resume->state_file_problem.c_str());
  }
  for (const std::string& skipped : resume->skipped) {
    std::fprintf(stderr, "asyncckpt: skipped %s\n", skipped.c_str());
  }
  std::printf("%s\n", resume->latest_path.c_str());
  return kExitOk;
}

int GcCommand(int argc, char** argv) {
  const std::vector<FlagSpec> specs = {
      {"remove-quarantined", "", "remove the quarantined checkpoints listed", true}};
  int exit_code = 0;
  auto flags =
      ParseOrExit("asyncckpt gc DIR [--remove-quarantined]", specs, argc, argv, 1, &exit_code);
  if (!flags) return exit_code;
  const std::string dir = flags->positional()[0];
  std::unique_ptr<io::FileSystem> fs = io::NewPosixFileSystem();
  auto found = ListQuarantinedCheckpoints(*fs, dir);
  if (!found.ok()) return Fail(found.status());
  const bool remove = flags->get_switch("remove-quarantined");
  uint64_t total = 0;
  int failed = 0;
  for (const QuarantinedCheckpoint& q : *found) {
    total += q.bytes;
    const std::string path = JoinCheckpointPath(dir, q.name);
    if (!remove) {
      std::printf("%s  %s\n", path.c_str(), FormatBytes(double(q.bytes)).c_str());
      continue;
    }
    // Only what was just listed as quarantined: nothing a job reads or writes.
    const Status removed = ToStatus(fs->remove_tree(path));
    if (!removed.ok()) {
      std::fprintf(stderr, "asyncckpt: could not remove %s: %s\n", path.c_str(),
                   removed.ToString().c_str());
      ++failed;
      continue;
    }
    std::printf("removed %s  %s\n", path.c_str(), FormatBytes(double(q.bytes)).c_str());
  }
  std::printf("%zu quarantined checkpoint%s, %s%s\n", found->size(), found->size() == 1 ? "" : "s",
              FormatBytes(double(total)).c_str(),
              remove || found->empty() ? "" : " (--remove-quarantined removes them)");
  return failed == 0 ? kExitOk : kExitFailed;
}

}  // namespace asyncckpt::cli
