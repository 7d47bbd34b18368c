// io_limits: the machine's limits that scripts/bench holds asyncckpt against, measured in the
// checkpoint directory's file system with the plainest code that reaches them.
//
//   - Sequential write of --bytes to a new file with O_DIRECT, 1 MiB aligned buffers, through
//     liburing directly, keeping QD writes in flight; the final fsync counts in the time (as
//     a checkpoint's is counted in its time to durable). One fresh file per run, preallocated
//     with fallocate first (as fio lays out its files, and as the engine preallocates its data
//     files): writes past a file's end are punted by io_uring to worker threads that serialise
//     on the inode lock, which measured about half the speed here.
//   - Sequential read of that file, O_DIRECT, the same way, at each queue depth.
//   Each queue depth runs --repeats times (default 3) and reports the medians: on a virtual
//   disk with a host cache, one short run can be twice as fast as the next.
//   - A parallel memcpy of --memcpy_bytes on every core (best of three), into memory touched
//     beforehand.
//
// Usage: io_limits --dir DIR [--bytes N] [--qd 1,2,4,...] [--repeats N] [--memcpy_bytes N]
//                  [--json FILE]
// Prints one line per measurement and, with --json, one JSON object. The file it writes is
// removed at the end.

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kBlockBytes = 1 << 20;
constexpr size_t kAlignment = 4096;

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "io_limits: %s\n", what.c_str());
  std::exit(1);
}

[[noreturn]] void DieErrno(const std::string& what, int error) {
  Die(what + ": " + std::strerror(error));
}

struct Options {
  std::string dir;
  uint64_t bytes = 1ull << 30;
  std::vector<unsigned> queue_depths = {1, 2, 4, 8, 16, 32, 64};
  uint64_t memcpy_bytes = 1ull << 30;
  int repeats = 3;
  std::string json;
};

uint64_t ParseBytes(const std::string& text) {
  char* end = nullptr;
  const double number = std::strtod(text.c_str(), &end);
  const std::string unit = end;
  double scale = 1;
  if (unit == "KiB" || unit == "k" || unit == "K") scale = 1 << 10;
  if (unit == "MiB" || unit == "M") scale = 1 << 20;
  if (unit == "GiB" || unit == "G") scale = 1 << 30;
  if (!(number > 0) || (scale == 1 && !unit.empty())) Die("bad byte size '" + text + "'");
  return static_cast<uint64_t>(number * scale);
}

Options ParseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Die("missing value for " + flag);
    const std::string value = argv[++i];
    if (flag == "--dir") {
      options.dir = value;
    } else if (flag == "--bytes") {
      options.bytes = ParseBytes(value);
    } else if (flag == "--memcpy_bytes") {
      options.memcpy_bytes = ParseBytes(value);
    } else if (flag == "--repeats") {
      options.repeats = std::atoi(value.c_str());
      if (options.repeats < 1 || options.repeats > 100) Die("bad --repeats '" + value + "'");
    } else if (flag == "--json") {
      options.json = value;
    } else if (flag == "--qd") {
      options.queue_depths.clear();
      std::stringstream list(value);
      for (std::string item; std::getline(list, item, ',');) {
        const int depth = std::atoi(item.c_str());
        if (depth < 1 || depth > 4096) Die("bad queue depth '" + item + "'");
        options.queue_depths.push_back(static_cast<unsigned>(depth));
      }
    } else {
      Die("unknown flag " + flag);
    }
  }
  if (options.dir.empty()) Die("--dir is required");
  options.bytes = std::max<uint64_t>(options.bytes / kBlockBytes, 1) * kBlockBytes;
  return options;
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, AlignedFree>;

// QD blocks of 1 MiB, filled with a pattern no file system or device could compress away.
Buffer MakeBlocks(unsigned depth) {
  void* memory = nullptr;
  if (posix_memalign(&memory, kAlignment, size_t{depth} * kBlockBytes) != 0) Die("out of memory");
  auto* bytes = static_cast<uint64_t*>(memory);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < size_t{depth} * kBlockBytes / 8; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    bytes[i] = state;
  }
  return Buffer(static_cast<uint8_t*>(memory));
}

// Moves `bytes` of `fd` sequentially in 1 MiB requests, `depth` of them in flight at once;
// returns the seconds it took (write: including the fsync at the end).
double Transfer(int fd, bool write, uint64_t bytes, unsigned depth) {
  io_uring ring;
  if (int error = io_uring_queue_init(depth, &ring, 0); error < 0) {
    DieErrno("io_uring_queue_init", -error);
  }
  Buffer blocks = MakeBlocks(depth);
  std::vector<unsigned> free_slots;
  for (unsigned slot = 0; slot < depth; ++slot) free_slots.push_back(slot);
  const uint64_t total_blocks = bytes / kBlockBytes;
  uint64_t next_block = 0;
  uint64_t done_blocks = 0;
  const auto start = Clock::now();
  while (done_blocks < total_blocks) {
    while (!free_slots.empty() && next_block < total_blocks) {
      const unsigned slot = free_slots.back();
      free_slots.pop_back();
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      uint8_t* buffer = blocks.get() + size_t{slot} * kBlockBytes;
      const uint64_t offset = next_block * kBlockBytes;
      if (write) {
        io_uring_prep_write(sqe, fd, buffer, kBlockBytes, offset);
      } else {
        io_uring_prep_read(sqe, fd, buffer, kBlockBytes, offset);
      }
      io_uring_sqe_set_data64(sqe, slot);
      ++next_block;
    }
    io_uring_cqe* cqe = nullptr;
    if (int error = io_uring_submit_and_wait(&ring, 1); error < 0) {
      DieErrno("io_uring_submit_and_wait", -error);
    }
    unsigned head = 0;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      if (cqe->res != static_cast<int>(kBlockBytes)) {
        if (cqe->res < 0) DieErrno(write ? "write" : "read", -cqe->res);
        Die("short transfer");
      }
      free_slots.push_back(static_cast<unsigned>(io_uring_cqe_get_data64(cqe)));
      ++done_blocks;
      ++seen;
    }
    io_uring_cq_advance(&ring, seen);
  }
  if (write && ::fsync(fd) != 0) DieErrno("fsync", errno);
  const double seconds = SecondsSince(start);
  io_uring_queue_exit(&ring);
  return seconds;
}

struct Point {
  unsigned depth;
  double write_seconds;  // medians over the repeats
  double read_seconds;
  std::vector<double> write_runs;
  std::vector<double> read_runs;
};

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Writes a fresh file at `depth` and reads it back, `repeats` times.
Point Measure(const std::string& path, uint64_t bytes, unsigned depth, int repeats) {
  Point point{depth, 0, 0, {}, {}};
  for (int run = 0; run < repeats; ++run) {
    ::unlink(path.c_str());
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0) DieErrno("cannot open " + path + " with O_DIRECT", errno);
    if (::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0 && errno != EOPNOTSUPP) {
      DieErrno("cannot preallocate " + path, errno);
    }
    point.write_runs.push_back(Transfer(fd, true, bytes, depth));
    point.read_runs.push_back(Transfer(fd, false, bytes, depth));
    ::close(fd);
  }
  point.write_seconds = Median(point.write_runs);
  point.read_seconds = Median(point.read_runs);
  return point;
}

std::string JsonList(const std::vector<double>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

// Best of three parallel memcpys of `bytes` on every core, in GB/s.
double MemcpyBytesPerSecond(uint64_t bytes, unsigned threads) {
  std::vector<uint8_t> source(bytes, 1);
  std::vector<uint8_t> destination(bytes, 0);
  double best = 1e30;
  for (int run = 0; run < 3; ++run) {
    const auto start = Clock::now();
    std::vector<std::thread> crew;
    const uint64_t share = (bytes / threads + 4095) / 4096 * 4096;
    for (unsigned t = 0; t < threads; ++t) {
      const uint64_t begin = std::min<uint64_t>(bytes, t * share);
      const uint64_t end = std::min<uint64_t>(bytes, begin + share);
      crew.emplace_back([&, begin, end] {
        std::memcpy(destination.data() + begin, source.data() + begin, end - begin);
      });
    }
    for (auto& thread : crew) thread.join();
    best = std::min(best, SecondsSince(start));
  }
  return static_cast<double>(bytes) / best;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = ParseOptions(argc, argv);
  const std::string path = options.dir + "/io_limits.dat";
  std::vector<Point> points;
  for (unsigned depth : options.queue_depths) {
    points.push_back(Measure(path, options.bytes, depth, options.repeats));
    std::printf("QD %3u  write %7.1f MB/s  read %7.1f MB/s  (medians of %d)\n", depth,
                options.bytes / points.back().write_seconds / 1e6,
                options.bytes / points.back().read_seconds / 1e6, options.repeats);
    std::fflush(stdout);
  }
  ::unlink(path.c_str());
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  const double memcpy_rate = MemcpyBytesPerSecond(options.memcpy_bytes, threads);
  std::printf("memcpy  %u threads  %7.1f MB/s\n", threads, memcpy_rate / 1e6);
  if (options.json.empty()) return 0;
  std::ofstream json(options.json);
  json << "{\"bytes\": " << options.bytes << ", \"block_bytes\": " << kBlockBytes
       << ", \"repeats\": " << options.repeats << ", \"memcpy_bytes\": " << options.memcpy_bytes
       << ", \"memcpy_threads\": " << threads << ", \"memcpy_bytes_per_second\": " << memcpy_rate
       << ", \"points\": [";
  for (size_t i = 0; i < points.size(); ++i) {
    const Point& p = points[i];
    json << (i ? ", " : "") << "{\"queue_depth\": " << p.depth
         << ", \"write_seconds\": " << p.write_seconds
         << ", \"write_bytes_per_second\": " << options.bytes / p.write_seconds
         << ", \"write_runs_seconds\": " << JsonList(p.write_runs)
         << ", \"read_seconds\": " << p.read_seconds
         << ", \"read_bytes_per_second\": " << options.bytes / p.read_seconds
         << ", \"read_runs_seconds\": " << JsonList(p.read_runs) << "}";
  }
  json << "]}\n";
  return json ? 0 : 1;
}
