#include "src/cli/restore_bench.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/reader.h"
#include "asyncckpt/saver_options.h"
#include "src/cli/commands.h"
#include "src/cli/flags.h"
#include "src/cli/json.h"
#include "src/cli/memory_budget.h"
#include "src/format/format.h"
#include "src/util/status_macros.h"

namespace asyncckpt::cli {
namespace {

constexpr char kUsage[] =
    "asyncckpt restore-bench PATH [--queue_depth N] [--o_direct 0|1] [--repeat N] "
    "[--drop_cache] [--json]";
constexpr int64_t kMaxRepeat = 1000;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// One restore's figures.
struct Repeat {
  double seconds = 0;
  bool cache_dropped = false;
  std::string drop_problem;  // why the cache could not be dropped, when it could not
};

struct BenchFlags {
  unsigned queue_depth = kDefaultQueueDepth;
  bool o_direct = true;
  int64_t repeat = 1;
  bool drop_cache = false;
  bool json = false;
};

// Host buffers for every tensor, page-aligned so that O_DIRECT reads raw chunks straight into
// them, and touched once so that page faults stay out of the timing.
class HostBuffers {
 public:
  Status Allocate(const CheckpointReader& reader, TensorRegistry* registry) {
    for (const TensorInfo& info : reader.tensors()) {
      void* data = nullptr;
      if (info.bytes > 0) {
        const uint64_t rounded = (info.bytes + 4095) / 4096 * 4096;
        data = std::aligned_alloc(4096, rounded);
        if (data == nullptr) {
          return Status::ResourceExhausted("cannot allocate " + FormatBytes(double(info.bytes)) +
                                           " for tensor '" + info.name + "'");
        }
        buffers_.emplace_back(data);
        std::memset(data, 0, rounded);
      }
      RETURN_IF_ERROR(registry->add(TensorRef{info.name,
                                              info.dtype,
                                              info.shape,
                                              data,
                                              static_cast<size_t>(info.bytes),
                                              nullptr,
                                              {},
                                              {}}));
    }
    return Status::OK();
  }

 private:
  std::vector<std::unique_ptr<void, FreeDeleter>> buffers_;
};

Result<BenchFlags> ReadFlags(const ParsedFlags& flags) {
  BenchFlags out;
  ASSIGN_OR_RETURN(const int64_t depth, flags.get_int("queue_depth"));
  if (depth < 1 || depth > kMaxQueueDepth) {
    return Status::InvalidArgument("--queue_depth " + flags.get("queue_depth") +
                                   " is out of range [1, " + std::to_string(kMaxQueueDepth) + "]");
  }
  out.queue_depth = static_cast<unsigned>(depth);
  ASSIGN_OR_RETURN(out.o_direct, flags.get_bool("o_direct"));
  ASSIGN_OR_RETURN(out.repeat, flags.get_int("repeat"));
  if (out.repeat < 1 || out.repeat > kMaxRepeat) {
    return Status::InvalidArgument("--repeat " + flags.get("repeat") + " is out of range [1, " +
                                   std::to_string(kMaxRepeat) + "]");
  }
  out.drop_cache = flags.get_switch("drop_cache");
  out.json = flags.get_switch("json");
  return out;
}

// Asks the kernel to drop the data files' cached pages; "" when it did, else why not.
std::string DropCache(const CheckpointReader& reader) {
  for (uint32_t i = 0; i < reader.num_data_files(); ++i) {
    const std::string path = reader.path() + "/" + format::DataFileName(i, reader.num_data_files());
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "open " + path + ": " + std::strerror(errno);
    const int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    if (rc != 0) return "posix_fadvise(DONTNEED) " + path + ": " + std::strerror(rc);
  }
  return "";
}

Status MeasureOnce(CheckpointReader& reader, const TensorRegistry& registry, bool drop_cache,
                   Repeat* repeat) {
  if (drop_cache) {
    repeat->drop_problem = DropCache(reader);
    repeat->cache_dropped = repeat->drop_problem.empty();
  }
  const auto start = std::chrono::steady_clock::now();
  Status status = reader.restore(registry);
  repeat->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return status;
}

double PerSecond(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds : 0.0;
}

void PrintText(const CheckpointReader& reader, const BenchFlags& flags, uint64_t stored,
               uint64_t raw, const std::vector<Repeat>& repeats) {
  std::printf("restore-bench %s\n  %zu tensors, %s on disk, %s raw; queue depth %u, O_DIRECT %s\n",
              reader.path().c_str(), reader.tensors().size(), FormatBytes(double(stored)).c_str(),
              FormatBytes(double(raw)).c_str(), flags.queue_depth, flags.o_direct ? "on" : "off");
  for (size_t i = 0; i < repeats.size(); ++i) {
    const Repeat& r = repeats[i];
    std::printf("  repeat %zu: %.3f s, read %s/s, decoded %s/s%s\n", i + 1, r.seconds,
                FormatBytes(PerSecond(stored, r.seconds)).c_str(),
                FormatBytes(PerSecond(raw, r.seconds)).c_str(),
                flags.drop_cache ? (r.cache_dropped ? ", page cache dropped" : "") : "");
    if (flags.drop_cache && !r.cache_dropped) {
      std::printf("    could not drop the page cache: %s\n", r.drop_problem.c_str());
    }
  }
}

void PrintJson(const CheckpointReader& reader, const BenchFlags& flags, uint64_t stored,
               uint64_t raw, const std::vector<Repeat>& repeats) {
  JsonWriter json;
  json.begin_object();
  json.field("path", reader.path());
  json.field("tensors", static_cast<uint64_t>(reader.tensors().size()));
  json.field("bytes_stored", stored);
  json.field("bytes_raw", raw);
  json.field("queue_depth", static_cast<uint64_t>(flags.queue_depth));
  json.field("o_direct", flags.o_direct);
  json.field("drop_cache", flags.drop_cache);
  json.key("repeats").begin_array();
  for (const Repeat& r : repeats) {
    json.begin_object();
    json.field("seconds", r.seconds);
    json.field("read_bytes_per_second", PerSecond(stored, r.seconds));
    json.field("raw_bytes_per_second", PerSecond(raw, r.seconds));
    if (flags.drop_cache) {
      json.field("cache_dropped", r.cache_dropped);
      if (!r.cache_dropped) json.field("cache_drop_problem", r.drop_problem);
    }
    json.end_object();
  }
  json.end_array();
  json.end_object();
  std::printf("%s\n", json.str().c_str());
}

}  // namespace

int RestoreBenchCommand(int argc, char** argv) {
  const std::vector<FlagSpec> specs = {
      {"queue_depth", std::to_string(kDefaultQueueDepth),
       "most reads in flight at once (1 to 4096)"},
      {"o_direct", "1", "read with O_DIRECT (1) or through the page cache (0)"},
      {"repeat", "1", "restores to run (1 to 1000)"},
      {"drop_cache", "", "drop the data files' cached pages before each restore", true},
      {"json", "", "print one JSON object", true}};
  auto parsed = ParseFlags(specs, argc, argv);
  if (!parsed.ok()) {
    if (parsed.status().code() == StatusCode::kCancelled) {
      std::fputs(FlagsHelp(kUsage, specs).c_str(), stdout);
      return kExitOk;
    }
    std::fprintf(stderr, "asyncckpt: %s\n", parsed.status().message().c_str());
    return kExitUsage;
  }
  if (parsed->positional().size() != 1) {
    std::fprintf(stderr, "asyncckpt: expected 1 argument(s); usage: %s\n", kUsage);
    return kExitUsage;
  }
  Result<BenchFlags> flags = ReadFlags(*parsed);
  if (!flags.ok()) {
    std::fprintf(stderr, "asyncckpt: %s\n", flags.status().message().c_str());
    return kExitUsage;
  }
  ReaderOptions options;
  options.queue_depth = flags->queue_depth;
  options.use_o_direct = flags->o_direct;
  auto reader = CheckpointReader::Open(parsed->positional()[0], options);
  if (!reader.ok()) {
    std::fprintf(stderr, "asyncckpt: %s\n", reader.status().ToString().c_str());
    return kExitFailed;
  }
  uint64_t stored = 0, raw = 0;
  for (const TensorInfo& info : (*reader)->tensors()) {
    stored += info.stored_bytes;
    raw += info.bytes;
  }
  const AvailableMemory available = MachineAvailableMemory();
  Status fits = CheckMemoryFits({{"restored tensors", parsed->positional()[0], raw}}, available,
                                "restore a smaller checkpoint, or free memory");
  if (!fits.ok()) {
    std::fprintf(stderr, "asyncckpt: %s\n", fits.message().c_str());
    return kExitUsage;
  }
  TensorRegistry registry;
  HostBuffers buffers;
  if (Status allocated = buffers.Allocate(**reader, &registry); !allocated.ok()) {
    std::fprintf(stderr, "asyncckpt: %s\n", allocated.ToString().c_str());
    return kExitFailed;
  }
  std::vector<Repeat> repeats(static_cast<size_t>(flags->repeat));
  for (Repeat& repeat : repeats) {
    Status status = MeasureOnce(**reader, registry, flags->drop_cache, &repeat);
    if (!status.ok()) {
      std::fprintf(stderr, "asyncckpt: %s\n", status.ToString().c_str());
      return kExitFailed;
    }
  }
  if (flags->json) {
    PrintJson(**reader, *flags, stored, raw, repeats);
  } else {
    PrintText(**reader, *flags, stored, raw, repeats);
  }
  return kExitOk;
}

}  // namespace asyncckpt::cli
