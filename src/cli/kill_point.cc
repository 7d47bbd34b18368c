// train-sim --kill_at: the file system that kills its process before one chosen operation.

#include "src/cli/kill_point.h"

#include <signal.h>

#include <charconv>
#include <cstdio>
#include <utility>

namespace asyncckpt::cli {

namespace {

std::string LastComponent(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

class KillPointFileSystem final : public io::FileSystemWrapper {
 public:
  KillPointFileSystem(io::FileSystem* target, KillPoint point)
      : FileSystemWrapper(target), point_(std::move(point)) {}

  io::IoStatus open(const std::string& path, const io::OpenOptions& options,
                    std::unique_ptr<io::File>* file) override {
    if (options.write) KillIfHit("create", path);
    return FileSystemWrapper::open(path, options, file);
  }
  io::IoStatus create_dir(const std::string& path) override {
    KillIfHit("create", path);
    return FileSystemWrapper::create_dir(path);
  }
  io::IoStatus remove_file(const std::string& path) override {
    KillIfHit("remove", path);
    return FileSystemWrapper::remove_file(path);
  }
  io::IoStatus remove_tree(const std::string& path) override {
    KillIfHit("remove", path);
    return FileSystemWrapper::remove_tree(path);
  }
  io::IoStatus rename(const std::string& from, const std::string& to) override {
    KillIfHit("rename", to);
    return FileSystemWrapper::rename(from, to);
  }
  io::IoStatus exchange(const std::string& a, const std::string& b) override {
    KillIfHit("rename", a);
    KillIfHit("rename", b);
    return FileSystemWrapper::exchange(a, b);
  }

 private:
  void KillIfHit(const char* operation, const std::string& path) const {
    if (!KillPointHits(point_, operation, path)) return;
    std::fprintf(stderr, "train-sim: --kill_at %d:%s:%s: killed before %s %s\n", point_.rank,
                 point_.operation.c_str(), point_.name_prefix.c_str(), operation, path.c_str());
    std::fflush(stderr);
    ::raise(SIGKILL);
  }

  const KillPoint point_;
};

}  // namespace

Result<KillPoint> ParseKillPoint(const std::string& text) {
  const auto bad = [&] {
    return Status::InvalidArgument(
        "--kill_at must be <rank>:<rename|remove|create>:<name prefix>, got '" + text + "'");
  };
  const size_t first = text.find(':');
  const size_t second = first == std::string::npos ? first : text.find(':', first + 1);
  if (second == std::string::npos || second + 1 >= text.size()) return bad();
  KillPoint point;
  const auto [end, error] = std::from_chars(text.data(), text.data() + first, point.rank);
  if (error != std::errc() || end != text.data() + first || point.rank < 0) return bad();
  point.operation = text.substr(first + 1, second - first - 1);
  point.name_prefix = text.substr(second + 1);
  if (point.operation != "rename" && point.operation != "remove" && point.operation != "create") {
    return bad();
  }
  return point;
}

bool KillPointHits(const KillPoint& point, const std::string& operation, const std::string& path) {
  return operation == point.operation && LastComponent(path).starts_with(point.name_prefix);
}

std::unique_ptr<io::FileSystem> NewKillPointFileSystem(io::FileSystem* target, KillPoint point) {
  return std::make_unique<KillPointFileSystem>(target, std::move(point));
}

}  // namespace asyncckpt::cli
