#include "io/fault_injection_file_system.h"

#include <cerrno>
#include <cstdint>
#include <utility>

#include "io/posix_file_system.h"

namespace asyncckpt::io {

// What the crash simulation knows about one file; every field guarded by the wrapper's mu_.
struct FaultInjectionFileSystem::FileState {
  std::string path;          // where the file is now (follows renames)
  bool dirty = false;        // written or truncated since the last sync
  bool synced = false;       // synced at least once
  uint64_t synced_size = 0;  // its length at the last sync
  uint64_t writes = 0;       // bumped by every write, to spot writes racing a sync
};

namespace {

// The bytes a short transfer of n moves: the first half, in whole 4 KiB blocks on a direct
// file (whose writes must stay aligned).
size_t ShortLength(size_t n, bool direct) {
  size_t half = n / 2;
  if (direct) half -= half % 4096;
  return half;
}

// The failure an injected fault reports; `done` of `n` bytes were transferred first when the
// fault is a short transfer.
IoStatus InjectedFailure(int errno_value, FaultMode mode, std::string_view verb,
                         std::string_view subject, size_t done = 0, size_t n = 0) {
  std::string detail = "injected fault";
  if (mode == FaultMode::kShortTransfer && n > 0) {
    detail += " after " + std::to_string(done) + " of " + std::to_string(n) + " bytes";
  }
  return IoStatus(errno_value,
                  IoStatus::FromErrno(errno_value, verb, subject).message() + " (" + detail + ")");
}

}  // namespace

class FaultInjectionFileSystem::FaultFile final : public File {
 public:
  FaultFile(FaultInjectionFileSystem* fs, std::unique_ptr<File> inner,
            std::shared_ptr<FileState> state)
      : fs_(fs), inner_(std::move(inner)), state_(std::move(state)) {}

  File* inner() const { return inner_.get(); }
  // Null for a file opened read-only: nothing to roll back.
  FileState* state() const { return state_.get(); }

  const std::string& path() const override { return inner_->path(); }
  bool is_direct() const override { return inner_->is_direct(); }
  int fd() const override { return -1; }
  IoStatus size(uint64_t* bytes) override { return inner_->size(bytes); }

  IoStatus write_at(uint64_t offset, const void* data, size_t n) override {
    const Injected fault = fs_->Check(FaultOp::kWrite, {path()});
    if (state_ != nullptr && (fault.errno_value == 0 || fault.mode == FaultMode::kShortTransfer)) {
      fs_->MarkDirty(*state_);
    }
    if (fault.errno_value == 0) return inner_->write_at(offset, data, n);
    return TransferPartly(fault, "write", offset, n,
                          [&](size_t done) { return inner_->write_at(offset, data, done); });
  }

  IoStatus read_at(uint64_t offset, void* data, size_t n) override {
    const Injected fault = fs_->Check(FaultOp::kRead, {path()});
    if (fault.errno_value == 0) return inner_->read_at(offset, data, n);
    return TransferPartly(fault, "read", offset, n,
                          [&](size_t done) { return inner_->read_at(offset, data, done); });
  }

  IoStatus truncate(uint64_t bytes) override {
    IoStatus s = fs_->CheckFail(FaultOp::kTruncate, "truncate", path(), {path()});
    if (!s.ok()) return s;
    if (state_ != nullptr) fs_->MarkDirty(*state_);
    return inner_->truncate(bytes);
  }

  // An injected failure reserves nothing, as a full disk may leave it.
  IoStatus allocate(uint64_t offset, uint64_t n) override {
    IoStatus s =
        fs_->CheckFail(FaultOp::kAllocate, "allocate", DescribeOffset(path(), offset), {path()});
    if (!s.ok()) return s;
    if (state_ != nullptr) fs_->MarkDirty(*state_);
    return inner_->allocate(offset, n);
  }

  IoStatus sync() override {
    IoStatus s = fs_->CheckFail(FaultOp::kSync, "sync", path(), {path()});
    if (!s.ok() || state_ == nullptr) return s.ok() ? inner_->sync() : s;
    uint64_t writes_before;
    {
      std::lock_guard<std::mutex> lock(fs_->mu_);
      writes_before = state_->writes;
    }
    if (s = inner_->sync(); !s.ok()) return s;
    uint64_t bytes = 0;
    if (s = inner_->size(&bytes); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(fs_->mu_);
    state_->synced = true;
    state_->synced_size = bytes;
    // A write that raced this sync may not be durable: keep the file dirty then.
    if (state_->writes == writes_before) state_->dirty = false;
    return IoStatus::Ok();
  }

 private:
  // What a write or read hit by `fault` does: a short transfer first moves its share through
  // `transfer(bytes)`; then the injected failure.
  template <typename Transfer>
  IoStatus TransferPartly(const Injected& fault, std::string_view verb, uint64_t offset, size_t n,
                          Transfer transfer) {
    size_t done = 0;
    if (fault.mode == FaultMode::kShortTransfer) done = ShortLength(n, is_direct());
    if (done > 0) {
      if (IoStatus s = transfer(done); !s.ok()) return s;
    }
    return InjectedFailure(fault.errno_value, fault.mode, verb, DescribeOffset(path(), offset),
                           done, n);
  }

  FaultInjectionFileSystem* fs_;
  std::unique_ptr<File> inner_;
  std::shared_ptr<FileState> state_;
};

// Counts each request as it is submitted and cuts it as its fault says; see the class comment.
class FaultInjectionFileSystem::FaultQueue final : public IoQueue {
 public:
  FaultQueue(FaultInjectionFileSystem* fs, IoCallback on_complete)
      : fs_(fs), on_complete_(std::move(on_complete)) {}
  // The target's queue drains first: its callbacks call on_complete_.
  ~FaultQueue() override { inner_.reset(); }

  IoStatus Start(unsigned depth) {
    IoQueueOptions options{
        depth, [this](uint64_t inner_tag, IoStatus status) { Done(inner_tag, std::move(status)); }};
    return fs_->target()->new_io_queue(options, &inner_);
  }

  void submit_write(const WriteOp& op, uint64_t tag) override {
    WriteOp inner = op;
    const uint64_t inner_tag =
        Admit(op.file, op.offset, op.length, FaultOp::kWrite, tag, &inner.file, &inner.length);
    inner_->submit_write(inner, inner_tag);
  }
  void submit_read(const ReadOp& op, uint64_t tag) override {
    ReadOp inner = op;
    const uint64_t inner_tag =
        Admit(op.file, op.offset, op.length, FaultOp::kRead, tag, &inner.file, &inner.length);
    inner_->submit_read(inner, inner_tag);
  }
  void drain() override { inner_->drain(); }
  unsigned depth() const override { return inner_->depth(); }
  std::string name() const override { return "fault_injection(" + inner_->name() + ")"; }

 private:
  // What travels with a request through the target's queue (its tag there is the address).
  struct Pending {
    uint64_t tag;
    IoStatus fault;  // ok: none drawn
  };

  // Counts the request, draws its fault, and points *inner_file / *inner_length at what the
  // target's queue is to do; returns the target-queue tag.
  uint64_t Admit(File* file, uint64_t offset, size_t length, FaultOp kind, uint64_t tag,
                 File** inner_file, size_t* inner_length) {
    auto pending = std::make_unique<Pending>(Pending{tag, IoStatus::Ok()});
    auto* wrapped = dynamic_cast<FaultFile*>(file);
    if (wrapped != nullptr) *inner_file = wrapped->inner();
    if (file != nullptr) {
      const Injected fault = fs_->Check(kind, {file->path()});
      if (kind == FaultOp::kWrite && wrapped != nullptr && wrapped->state() != nullptr &&
          (fault.errno_value == 0 || fault.mode == FaultMode::kShortTransfer)) {
        fs_->MarkDirty(*wrapped->state());
      }
      if (fault.errno_value != 0) {
        const size_t done =
            fault.mode == FaultMode::kShortTransfer ? ShortLength(length, file->is_direct()) : 0;
        pending->fault = InjectedFailure(fault.errno_value, fault.mode,
                                         kind == FaultOp::kWrite ? "write" : "read",
                                         DescribeOffset(file->path(), offset), done, length);
        *inner_length = done;
      }
    }
    return reinterpret_cast<uintptr_t>(pending.release());
  }

  void Done(uint64_t inner_tag, IoStatus status) {
    std::unique_ptr<Pending> pending(reinterpret_cast<Pending*>(inner_tag));
    // A short transfer that failed underneath reports that failure, as File::write_at does.
    on_complete_(pending->tag, status.ok() ? std::move(pending->fault) : std::move(status));
  }

  FaultInjectionFileSystem* const fs_;
  const IoCallback on_complete_;
  std::unique_ptr<IoQueue> inner_;
};

namespace {

bool IsUnder(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
}

}  // namespace

FaultInjectionFileSystem::FaultInjectionFileSystem(FileSystem* target)
    : FileSystemWrapper(target) {}

FaultInjectionFileSystem::~FaultInjectionFileSystem() = default;

std::string FaultInjectionFileSystem::name() const {
  return "fault_injection(" + target()->name() + ")";
}

FaultInjectionFileSystem::Injected FaultInjectionFileSystem::Check(
    FaultOp op, std::initializer_list<std::string_view> paths) {
  std::lock_guard<std::mutex> lock(mu_);
  ++count_;
  Injected fault;
  if (fail_at_ != 0 && (fail_once_ ? count_ == fail_at_ : count_ >= fail_at_)) {
    fault = positional_;
  } else {
    for (const Rule& rule : rules_) {
      if ((static_cast<uint32_t>(rule.ops) & static_cast<uint32_t>(op)) == 0) continue;
      for (std::string_view path : paths) {
        if (path.find(rule.path_substring) != std::string_view::npos) {
          fault = Injected{rule.errno_value, rule.mode};
          break;
        }
      }
      if (fault.errno_value != 0) break;
    }
  }
  if (fault.errno_value != 0) ++injected_;
  return fault;
}

IoStatus FaultInjectionFileSystem::CheckFail(FaultOp op, std::string_view verb,
                                             std::string_view subject,
                                             std::initializer_list<std::string_view> paths) {
  const Injected fault = Check(op, paths);
  if (fault.errno_value == 0) return IoStatus::Ok();
  return InjectedFailure(fault.errno_value, fault.mode, verb, subject);
}

void FaultInjectionFileSystem::fail_after(uint64_t n, int errno_value, FaultMode mode) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_at_ = count_ + (n == 0 ? 1 : n);
  fail_once_ = false;
  positional_ = Injected{errno_value, mode};
}

void FaultInjectionFileSystem::fail_at(uint64_t n, int errno_value, FaultMode mode) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_at_ = count_ + (n == 0 ? 1 : n);
  fail_once_ = true;
  positional_ = Injected{errno_value, mode};
}

void FaultInjectionFileSystem::fail_ops_matching(std::string path_substring, int errno_value,
                                                 FaultOp ops, FaultMode mode) {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.push_back({std::move(path_substring), errno_value, ops, mode});
}

void FaultInjectionFileSystem::clear_faults() {
  std::lock_guard<std::mutex> lock(mu_);
  fail_at_ = 0;
  fail_once_ = false;
  positional_ = Injected{};
  rules_.clear();
}

uint64_t FaultInjectionFileSystem::operation_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

uint64_t FaultInjectionFileSystem::injected_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

std::shared_ptr<FaultInjectionFileSystem::FileState> FaultInjectionFileSystem::TrackFile(
    const std::string& path, bool truncated) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<FileState>& state = files_[path];
  if (state == nullptr) {
    state = std::make_shared<FileState>();
    state->path = path;
  }
  if (truncated) {
    state->dirty = true;
    ++state->writes;
  }
  return state;
}

void FaultInjectionFileSystem::MarkDirty(FileState& state) {
  std::lock_guard<std::mutex> lock(mu_);
  state.dirty = true;
  ++state.writes;
}

IoStatus FaultInjectionFileSystem::open(const std::string& path, const OpenOptions& options,
                                        std::unique_ptr<File>* file) {
  if (IoStatus s = CheckFail(FaultOp::kOpen, "open", path, {path}); !s.ok()) return s;
  std::unique_ptr<File> inner;
  if (IoStatus s = target()->open(path, options, &inner); !s.ok()) return s;
  std::shared_ptr<FileState> state;
  if (options.write) state = TrackFile(path, options.truncate);
  *file = std::make_unique<FaultFile>(this, std::move(inner), std::move(state));
  return IoStatus::Ok();
}

IoStatus FaultInjectionFileSystem::lock_file(const std::string& path,
                                             std::unique_ptr<FileLock>* lock) {
  if (IoStatus s = CheckFail(FaultOp::kLock, "lock", path, {path}); !s.ok()) return s;
  return target()->lock_file(path, lock);
}

IoStatus FaultInjectionFileSystem::new_io_queue(const IoQueueOptions& options,
                                                std::unique_ptr<IoQueue>* queue) {
  if (!options.on_complete) return IoStatus(EINVAL, "new_io_queue: on_complete is not set");
  if (options.depth == 0) return IoStatus(EINVAL, "new_io_queue: depth must be at least 1");
  auto fault_queue = std::make_unique<FaultQueue>(this, options.on_complete);
  if (IoStatus s = fault_queue->Start(options.depth); !s.ok()) return s;
  *queue = std::move(fault_queue);
  return IoStatus::Ok();
}

IoStatus FaultInjectionFileSystem::create_dir(const std::string& path) {
  if (IoStatus s = CheckFail(FaultOp::kCreateDir, "create directory", path, {path}); !s.ok()) {
    return s;
  }
  return target()->create_dir(path);
}

IoStatus FaultInjectionFileSystem::create_dirs(const std::string& path) {
  if (IoStatus s = CheckFail(FaultOp::kCreateDir, "create directory", path, {path}); !s.ok()) {
    return s;
  }
  return target()->create_dirs(path);
}

void FaultInjectionFileSystem::ForgetPaths(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = files_.begin(); it != files_.end();) {
    if (it->first == path || IsUnder(it->first, path)) {
      // An open File keeps its state object; it just no longer takes part in crashes.
      it->second->dirty = false;
      it = files_.erase(it);
    } else {
      ++it;
    }
  }
}

IoStatus FaultInjectionFileSystem::remove_file(const std::string& path) {
  if (IoStatus s = CheckFail(FaultOp::kRemove, "remove file", path, {path}); !s.ok()) return s;
  IoStatus s = target()->remove_file(path);
  if (s.ok()) ForgetPaths(path);
  return s;
}

IoStatus FaultInjectionFileSystem::remove_tree(const std::string& path) {
  if (IoStatus s = CheckFail(FaultOp::kRemove, "remove tree", path, {path}); !s.ok()) return s;
  IoStatus s = target()->remove_tree(path);
  if (s.ok()) ForgetPaths(path);
  return s;
}

void FaultInjectionFileSystem::MovePathsLocked(
    const std::string& from, const std::string& to,
    std::map<std::string, std::shared_ptr<FileState>>* moved) {
  for (auto it = files_.begin(); it != files_.end();) {
    if (it->first == from || IsUnder(it->first, from)) {
      std::string new_path = to + it->first.substr(from.size());
      it->second->path = new_path;
      (*moved)[new_path] = std::move(it->second);
      it = files_.erase(it);
    } else {
      ++it;
    }
  }
}

IoStatus FaultInjectionFileSystem::rename(const std::string& from, const std::string& to) {
  if (IoStatus s = CheckFail(FaultOp::kRename, "rename", from + " to " + to, {from, to}); !s.ok()) {
    return s;
  }
  IoStatus s = target()->rename(from, to);
  if (!s.ok()) return s;
  ForgetPaths(to);  // what `to` named before was replaced
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::shared_ptr<FileState>> moved;
  MovePathsLocked(from, to, &moved);
  files_.merge(moved);
  return IoStatus::Ok();
}

IoStatus FaultInjectionFileSystem::exchange(const std::string& a, const std::string& b) {
  if (IoStatus s = CheckFail(FaultOp::kRename, "exchange", a + " with " + b, {a, b}); !s.ok()) {
    return s;
  }
  IoStatus s = target()->exchange(a, b);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::shared_ptr<FileState>> moved;
  MovePathsLocked(a, b, &moved);
  MovePathsLocked(b, a, &moved);
  files_.merge(moved);
  return IoStatus::Ok();
}

IoStatus FaultInjectionFileSystem::sync_dir(const std::string& path) {
  if (IoStatus s = CheckFail(FaultOp::kSyncDir, "sync directory", path, {path}); !s.ok()) return s;
  return target()->sync_dir(path);
}

IoStatus FaultInjectionFileSystem::drop_unsynced_data() {
  std::lock_guard<std::mutex> lock(mu_);
  IoStatus first_error;
  for (auto it = files_.begin(); it != files_.end();) {
    FileState& state = *it->second;
    if (!state.dirty) {
      ++it;
      continue;
    }
    IoStatus s;
    if (state.synced) {
      std::unique_ptr<File> file;
      OpenOptions options;
      options.write = true;
      s = target()->open(state.path, options, &file);
      if (s.ok()) s = file->truncate(state.synced_size);
    } else {
      s = target()->remove_file(state.path);
    }
    if (!s.ok() && s.error_number() != ENOENT && first_error.ok()) first_error = std::move(s);
    state.dirty = false;
    if (state.synced) {
      ++it;
    } else {
      it = files_.erase(it);
    }
  }
  return first_error;
}

}  // namespace asyncckpt::io
