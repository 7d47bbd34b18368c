#include "src/cli/memory_budget.h"

#include <sys/sysinfo.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <optional>
#include <sstream>

#include "src/cli/flags.h"

namespace asyncckpt::cli {

namespace {

// MemAvailable in bytes, from /proc/meminfo; nullopt when it cannot be read.
std::optional<uint64_t> MemAvailable() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

std::optional<uint64_t> ReadNumber(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return std::nullopt;
  uint64_t value = 0;
  auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (err != std::errc() || end != text.data() + text.size()) return std::nullopt;  // "max"
  return value;
}

// Room left under this process's cgroup v2 memory limit; nullopt when there is none.
std::optional<uint64_t> CgroupRoom() {
  std::ifstream cgroup("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroup, line)) {
    if (line.rfind("0::", 0) != 0) continue;  // the v2 hierarchy's line
    const std::string dir = "/sys/fs/cgroup" + line.substr(3);
    const std::optional<uint64_t> max = ReadNumber(dir + "/memory.max");
    if (!max) return std::nullopt;
    const uint64_t current = ReadNumber(dir + "/memory.current").value_or(0);
    return *max > current ? *max - current : 0;
  }
  return std::nullopt;
}

}  // namespace

AvailableMemory MachineAvailableMemory() {
  AvailableMemory available;
  if (std::optional<uint64_t> bytes = MemAvailable()) {
    available = {*bytes, "MemAvailable in /proc/meminfo"};
  } else {
    struct sysinfo info {};
    if (sysinfo(&info) == 0) {
      available = {(uint64_t{info.freeram} + info.bufferram) * info.mem_unit,
                   "sysinfo (free and buffer RAM)"};
    } else {
      available = {UINT64_MAX, "nothing (the machine's memory cannot be read)"};
    }
  }
  if (std::optional<uint64_t> room = CgroupRoom(); room && *room < available.bytes) {
    available = {*room, "the cgroup's memory.max less memory.current"};
  }
  return available;
}

uint64_t TotalBytes(const std::vector<MemoryPart>& parts) {
  uint64_t total = 0;
  for (const MemoryPart& part : parts) {
    total = part.bytes > UINT64_MAX - total ? UINT64_MAX : total + part.bytes;
  }
  return total;
}

Status CheckMemoryFits(const std::vector<MemoryPart>& parts, const AvailableMemory& available,
                       const std::string& hint) {
  const uint64_t total = TotalBytes(parts);
  if (total <= available.bytes || parts.empty()) return Status::OK();
  const MemoryPart& largest =
      *std::max_element(parts.begin(), parts.end(),
                        [](const MemoryPart& a, const MemoryPart& b) { return a.bytes < b.bytes; });
  std::ostringstream message;
  message << "not enough memory for " << largest.flags << ": train-sim needs "
          << FormatBytes(double(total)) << " (";
  bool first = true;
  for (const MemoryPart& part : parts) {
    if (part.bytes == 0) continue;
    message << (first ? "" : " + ") << part.what << " " << FormatBytes(double(part.bytes));
    if (!part.flags.empty() && part.flags != largest.flags) message << " [" << part.flags << "]";
    first = false;
  }
  message << ") but " << available.source << " says " << FormatBytes(double(available.bytes))
          << " are available";
  if (!hint.empty()) message << "; " << hint;
  return Status::InvalidArgument(message.str());
}

}  // namespace asyncckpt::cli
