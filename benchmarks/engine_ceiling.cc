// engine_ceiling: the save engine's own ceiling (issue 17). Saves a host state through the
// engine into a null sink (null_file_system.h: data-file writes are accepted and dropped), so
// that the figure is what snapshot copy, encode, checksum, the graph's messages and the commit
// cost, with no disk; beside it, a plain parallel memcpy of the same bytes on the same threads.
//
// Usage: engine_ceiling --dir DIR [--bytes 1GiB] [--threads N] [--tensors 8] [--saves 5]
//                       [--codecs none,shuffle+zstd] [--level 1] [--chunk_bytes 4MiB]
//                       [--sink null|posix|uring] [--queue_depth 64] [--files 2]
//                       [--max_to_keep 2] [--json PATH]
//   --dir      where the checkpoint directories, indexes and state file go (tmpfs is best)
//   --threads  the engine's background_threads and the memcpy's threads; default: the CPUs this
//              process may run on (run it under `taskset -c 0` for one core)
//   --sink     null (the default): the ceiling; posix or uring: the same saves into DIR's own
//              file system (the tmpfs variant of scripts/bench --sinks)
// Per codec: the median over --saves saves (after one warm-up) of bytes / seconds to durable,
// with the level pinned (EngineOptions::adapt_level off), so that shuffle+zstd is measured at
// --level and not at whatever the engine falls back to when encoding is the bottleneck.

#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/compression.h"
#include "benchmarks/null_file_system.h"
#include "src/engine/engine.h"
#include "src/state/checkpoint_state.h"

namespace asyncckpt::bench {
namespace {

struct Options {
  std::string dir;
  uint64_t bytes = 1ull << 30;
  unsigned threads = 0;
  int tensors = 8;
  int saves = 5;
  std::vector<std::string> codecs = {"none", "shuffle+zstd"};
  int level = 1;
  uint64_t chunk_bytes = 4ull << 20;
  std::string json;
  std::string sink = "null";
  unsigned queue_depth = 64;
  uint32_t files = 2;
  int max_to_keep = 2;
};

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "engine_ceiling: %s\n", why.c_str());
  std::exit(2);
}

uint64_t ParseBytes(const std::string& text) {
  size_t used = 0;
  const double value = std::stod(text, &used);
  const std::string unit = text.substr(used);
  double scale = 1;
  if (unit == "KiB") scale = 1 << 10;
  if (unit == "MiB") scale = 1 << 20;
  if (unit == "GiB") scale = 1 << 30;
  if (!unit.empty() && scale == 1) Die("bad size '" + text + "'");
  return static_cast<uint64_t>(value * scale);
}

std::vector<std::string> Split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) out.push_back(part);
  return out;
}

Options Parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Die(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--dir")
      options.dir = value;
    else if (flag == "--bytes")
      options.bytes = ParseBytes(value);
    else if (flag == "--threads")
      options.threads = static_cast<unsigned>(std::stoul(value));
    else if (flag == "--tensors")
      options.tensors = std::stoi(value);
    else if (flag == "--saves")
      options.saves = std::stoi(value);
    else if (flag == "--codecs")
      options.codecs = Split(value);
    else if (flag == "--level")
      options.level = std::stoi(value);
    else if (flag == "--chunk_bytes")
      options.chunk_bytes = ParseBytes(value);
    else if (flag == "--json")
      options.json = value;
    else if (flag == "--sink")
      options.sink = value;
    else if (flag == "--queue_depth")
      options.queue_depth = static_cast<unsigned>(std::stoul(value));
    else if (flag == "--max_to_keep")
      options.max_to_keep = std::stoi(value);
    else if (flag == "--files")
      options.files = static_cast<uint32_t>(std::stoul(value));
    else
      Die("unknown flag " + flag);
  }
  if (options.dir.empty()) Die("--dir is required");
  if (options.threads == 0) {
    cpu_set_t set;
    options.threads = sched_getaffinity(0, sizeof(set), &set) == 0
                          ? static_cast<unsigned>(CPU_COUNT(&set))
                          : std::max(1u, std::thread::hardware_concurrency());
  }
  return options;
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

// Model-like float32 values (the synthetic weights of train-sim: small, full mantissas).
void Fill(std::vector<float>& data, uint64_t key) {
  for (size_t i = 0; i < data.size(); ++i) {
    uint64_t h = key ^ (i * 0x9E3779B97F4A7C15ull);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    data[i] = (static_cast<float>(h >> 40) * (1.0f / 16777216.0f) - 0.5f) * 0.1f;
  }
}

// Median of three parallel memcpys of `bytes` on `threads` threads, in bytes per second.
double MemcpyRate(const std::vector<std::vector<float>>& state, unsigned threads) {
  uint64_t bytes = 0;
  for (const auto& t : state) bytes += t.size() * sizeof(float);
  std::vector<uint8_t> destination(bytes, 1);  // touched: no first-touch faults in the timing
  std::vector<double> rates;
  for (int repeat = 0; repeat < 3; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> crew;
    for (unsigned w = 0; w < threads; ++w) {
      crew.emplace_back([&, w] {
        uint64_t offset = 0;
        for (const auto& t : state) {
          const uint64_t n = t.size() * sizeof(float);
          const uint64_t begin = n * w / threads, end = n * (w + 1) / threads;
          std::memcpy(destination.data() + offset + begin,
                      reinterpret_cast<const uint8_t*>(t.data()) + begin, end - begin);
          offset += n;
        }
      });
    }
    for (auto& thread : crew) thread.join();
    rates.push_back(static_cast<double>(bytes) / Seconds(start));
  }
  return Median(rates);
}

struct CodecResult {
  std::string codec;
  double bytes_per_second = 0;
  double blocked_seconds = 0;
  double stored_over_raw = 0;
  int final_level = 0;
  double cores_used = 0;  // process CPU seconds over wall seconds, during the timed saves
};

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

CodecResult RunCodec(const Options& options, const std::string& codec,
                     std::vector<std::vector<float>>& state, const std::string& dir) {
  auto posix = io::NewPosixFileSystem();
  NullDataFileSystem null_fs(posix.get());
  std::unique_ptr<io::FileSystem> real;
  if (options.sink == "uring") {
    std::string why;
    real = io::NewUringFileSystem(io::IoOptions{}, &why);
    if (!real) Die("no io_uring here: " + why);
  }
  io::FileSystem& fs = options.sink == "null" ? static_cast<io::FileSystem&>(null_fs)
                       : real                 ? *real
                                              : *posix;
  TensorRegistry registry;
  for (size_t t = 0; t < state.size(); ++t) {
    TensorRef ref;
    ref.name = "t";  // appended: GCC 12 -O3 -Wrestrict misfires on "t" + std::string&&
    ref.name += std::to_string(t);
    ref.dtype = DType::kF32;
    ref.shape = {static_cast<int64_t>(state[t].size())};
    ref.data = state[t].data();
    ref.bytes = state[t].size() * sizeof(float);
    const Status added = registry.add(std::move(ref));
    if (!added.ok()) Die(added.ToString());
  }
  EngineOptions engine_options;
  engine_options.saver.checkpoint_dir = dir;
  engine_options.saver.chunk_bytes = options.chunk_bytes;
  engine_options.saver.use_o_direct = true;  // the production path on a disk; the sink pretends
  engine_options.saver.background_threads = options.threads;
  engine_options.adapt_level = false;
  engine_options.max_saves_in_flight = 1;
  engine_options.saver.queue_depth = options.queue_depth;
  engine_options.saver.num_data_files = options.files;
  const auto kind = ParseCompressionKind(codec);
  if (!kind) Die("unknown codec " + codec);
  engine_options.saver.compression.kind = *kind;
  engine_options.saver.compression.level = options.level;
  if (auto made = fs.create_dirs(dir); !made.ok()) Die(made.message());
  CheckpointManager manager(&fs, dir, engine_options.saver.basename, options.max_to_keep, 0,
                            SystemClockSeconds);
  if (auto started = manager.Start(); !started.ok()) Die(started.status().ToString());
  const Result<SnapshotPlan> planned = PlanSnapshot(registry, engine_options, "engine_ceiling");
  if (!planned.ok()) Die(planned.status().ToString());
  const SnapshotPlan& plan = *planned;
  std::mutex mu;
  std::vector<SaveStats> done;
  auto engine =
      Engine::Create(engine_options, plan, &fs, &manager, &registry, [&](const SaveStats& stats) {
        std::lock_guard lock(mu);
        done.push_back(stats);
      });
  if (!engine.ok()) Die(engine.status().ToString());
  double cpu_start = 0;
  auto wall_start = std::chrono::steady_clock::now();
  for (int step = 0; step <= options.saves; ++step) {  // step 0: the warm-up
    if (step == 1) {
      cpu_start = CpuSeconds();
      wall_start = std::chrono::steady_clock::now();
    }
    SubmitRequest request;
    request.metadata.step = step + 1;
    auto submitted = (*engine)->Submit(std::move(request));
    if (!submitted.ok()) Die(submitted.status().ToString());
    (*engine)->WaitAll();
  }
  const double cores_used = (CpuSeconds() - cpu_start) / Seconds(wall_start);
  CodecResult result;
  result.codec = codec;
  result.cores_used = cores_used;
  std::vector<double> rates, blocked;
  uint64_t raw = 0, stored = 0;
  for (size_t i = 1; i < done.size(); ++i) {
    const SaveStats& stats = done[i];
    if (!stats.status.ok()) Die(stats.status.ToString());
    rates.push_back(static_cast<double>(stats.bytes_raw) / stats.seconds_to_durable);
    blocked.push_back(stats.blocked_seconds);
    raw += stats.bytes_raw;
    stored += stats.bytes_stored;
    result.final_level = stats.final_level;
  }
  // The sink saw every stored byte (padding to 4 KiB included): nothing was skipped.
  if (options.sink == "null" && null_fs.bytes_written() < stored)
    Die("the sink saw fewer bytes than the saves stored");
  result.bytes_per_second = Median(rates);
  result.blocked_seconds = Median(blocked);
  result.stored_over_raw = raw ? static_cast<double>(stored) / static_cast<double>(raw) : 0;
  return result;
}

int Main(int argc, char** argv) {
  const Options options = Parse(argc, argv);
  std::vector<std::vector<float>> state(static_cast<size_t>(options.tensors));
  for (size_t t = 0; t < state.size(); ++t) {
    state[t].resize(options.bytes / sizeof(float) / state.size());
    Fill(state[t], t + 1);
  }
  const double memcpy_rate = MemcpyRate(state, options.threads);
  std::printf("threads %u  memcpy %8.1f MB/s\n", options.threads, memcpy_rate / 1e6);
  std::vector<CodecResult> results;
  for (const std::string& codec : options.codecs) {
    const std::string dir = options.dir + "/ceiling-" + options.sink + "-" +
                            std::to_string(options.threads) + "-" +
                            (codec == "none" ? "raw" : "shuffle-zstd");
    results.push_back(RunCodec(options, codec, state, dir));
    const CodecResult& r = results.back();
    std::printf(
        "threads %u  %-13s %8.1f MB/s  (%.2f x memcpy, %.1f MB/s per thread)  blocked "
        "%.3f s  stored/raw %.3f  level %d  cores used %.2f\n",
        options.threads, codec.c_str(), r.bytes_per_second / 1e6, r.bytes_per_second / memcpy_rate,
        r.bytes_per_second / 1e6 / options.threads, r.blocked_seconds, r.stored_over_raw,
        r.final_level, r.cores_used);
  }
  if (!options.json.empty()) {
    std::ofstream out(options.json);
    out << "{\"threads\": " << options.threads << ", \"bytes\": " << options.bytes
        << ", \"tensors\": " << options.tensors << ", \"saves\": " << options.saves
        << ", \"level\": " << options.level << ", \"memcpy_bytes_per_second\": " << memcpy_rate
        << ", \"codecs\": [";
    for (size_t i = 0; i < results.size(); ++i) {
      const CodecResult& r = results[i];
      out << (i ? ", " : "") << "{\"codec\": \"" << r.codec
          << "\", \"bytes_per_second\": " << r.bytes_per_second
          << ", \"blocked_seconds\": " << r.blocked_seconds
          << ", \"stored_over_raw\": " << r.stored_over_raw
          << ", \"final_level\": " << r.final_level << ", \"cores_used\": " << r.cores_used << "}";
    }
    out << "]}\n";
  }
  return 0;
}

}  // namespace
}  // namespace asyncckpt::bench

int main(int argc, char** argv) { return asyncckpt::bench::Main(argc, argv); }
