// restore_read: how fast a checkpoint comes back into host memory, for scripts/bench.
//
//   restore_read PATH [--json FILE]        asyncckpt checkpoint: CheckpointReader::Open, then
//                                          restore() of every tensor into host buffers
//   restore_read PATH --naive [--json F]   a `train-sim --saver naive` save: read(2) of every
//                                          file in PATH, one after another, on one thread
//   restore_read PATH --evict_only         only drops PATH's files from the page cache
//
// Before it reads, it drops PATH's files from the page cache (fdatasync, then
// posix_fadvise(DONTNEED) on each file, no root needed and no other file touched), so the
// read comes from the disk. Destination buffers are allocated and touched before the clock
// starts, as a job's tensors exist before it restores them. Open() counts in the time.

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/reader.h"
#include "asyncckpt/tensor.h"

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<std::string> FilesUnder(const std::string& path) {
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

void Evict(const std::string& path) {
  for (const std::string& file : FilesUnder(path)) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    (void)::fdatasync(fd);
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

struct Result {
  uint64_t bytes = 0;
  uint64_t tensors = 0;
  double seconds = 0;
};

// Every file in `path`, read(2) whole into its own buffer, one file after another.
bool ReadNaive(const std::string& path, Result* result) {
  const std::vector<std::string> files = FilesUnder(path);
  std::vector<std::vector<uint8_t>> buffers;
  for (const std::string& file : files) {
    std::error_code ec;
    buffers.emplace_back(std::filesystem::file_size(file, ec), uint8_t{1});
  }
  const auto start = Clock::now();
  for (size_t i = 0; i < files.size(); ++i) {
    const int fd = ::open(files[i].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      std::fprintf(stderr, "restore_read: cannot open %s: %s\n", files[i].c_str(),
                   std::strerror(errno));
      return false;
    }
    for (size_t done = 0; done < buffers[i].size();) {
      const ssize_t got = ::read(fd, buffers[i].data() + done, buffers[i].size() - done);
      if (got <= 0) {
        std::fprintf(stderr, "restore_read: cannot read %s\n", files[i].c_str());
        ::close(fd);
        return false;
      }
      done += static_cast<size_t>(got);
    }
    ::close(fd);
    result->bytes += buffers[i].size();
  }
  result->seconds = SecondsSince(start);
  result->tensors = files.size();
  return true;
}

// Opens the checkpoint and restores every tensor into host buffers through the public API.
bool ReadCheckpoint(const std::string& path, Result* result) {
  // Open once untimed, to learn the shapes the destination buffers need.
  auto probe = asyncckpt::CheckpointReader::Open(path);
  if (!probe.ok()) {
    std::fprintf(stderr, "restore_read: %s\n", probe.status().ToString().c_str());
    return false;
  }
  std::vector<std::vector<uint8_t>> buffers;
  asyncckpt::TensorRegistry registry;
  for (const asyncckpt::TensorInfo& info : (*probe)->tensors()) {
    buffers.emplace_back(info.bytes, uint8_t{1});
    asyncckpt::TensorRef ref;
    ref.name = info.name;
    ref.dtype = info.dtype;
    ref.shape = info.shape;
    ref.data = buffers.back().data();
    ref.bytes = info.bytes;
    if (auto status = registry.add(ref); !status.ok()) {
      std::fprintf(stderr, "restore_read: %s\n", status.ToString().c_str());
      return false;
    }
    result->bytes += info.bytes;
  }
  probe->reset();
  Evict(path);
  const auto start = Clock::now();
  auto reader = asyncckpt::CheckpointReader::Open(path);
  asyncckpt::Status status = reader.ok() ? (*reader)->restore(registry) : reader.status();
  result->seconds = SecondsSince(start);
  if (!status.ok()) {
    std::fprintf(stderr, "restore_read: %s\n", status.ToString().c_str());
    return false;
  }
  result->tensors = registry.size();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  std::string json;
  bool naive = false;
  bool evict_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--naive") {
      naive = true;
    } else if (arg == "--evict_only") {
      evict_only = true;
    } else if (arg == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (path.empty() && arg.rfind("--", 0) != 0) {
      path = arg;
    } else {
      std::fprintf(stderr, "usage: restore_read PATH [--naive] [--evict_only] [--json FILE]\n");
      return 2;
    }
  }
  if (path.empty()) {
    std::fprintf(stderr, "usage: restore_read PATH [--naive] [--evict_only] [--json FILE]\n");
    return 2;
  }
  Evict(path);
  if (evict_only) return 0;
  Result result;
  if (!(naive ? ReadNaive(path, &result) : ReadCheckpoint(path, &result))) return 1;
  const double rate = result.seconds > 0 ? static_cast<double>(result.bytes) / result.seconds : 0;
  std::printf("restored %llu bytes of %llu tensors in %.3f s: %.1f MB/s\n",
              static_cast<unsigned long long>(result.bytes),
              static_cast<unsigned long long>(result.tensors), result.seconds, rate / 1e6);
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"path\": \"" << path << "\", \"bytes\": " << result.bytes
        << ", \"tensors\": " << result.tensors << ", \"seconds\": " << result.seconds
        << ", \"bytes_per_second\": " << rate << "}\n";
    if (!out) return 1;
  }
  return 0;
}
