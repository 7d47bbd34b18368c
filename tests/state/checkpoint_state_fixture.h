#pragma once

// Test support for the tests of src/state: a checkpoint directory in a fresh temporary
// directory (StateDirTest, which each test file derives its suite from), a file system that logs
// and fails chosen operations (FaultyFileSystem), an example state, and a validator that reads
// "complete <wall time>" from the index. Shared by tests/state/*_test.cc.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"
#include "src/state/checkpoint_state.h"

namespace asyncckpt::state_testing {

namespace fs = std::filesystem;

inline constexpr char kBasename[] = "model.ckpt";

inline std::string Name(int step) { return std::string(kBasename) + "-" + std::to_string(step); }

// Passes every call through, logs "<op> <path>", and fails the ops `fault` picks (it returns
// the errno to fail with, or 0).
class FaultyFileSystem : public io::FileSystemWrapper {
 public:
  using Fault = std::function<int(const std::string& op, const std::string& path)>;

  explicit FaultyFileSystem(io::FileSystem* target) : FileSystemWrapper(target) {}

  void set_fault(Fault fault) {
    std::lock_guard lock(mu_);
    fault_ = std::move(fault);
  }
  std::vector<std::string> ops() const {
    std::lock_guard lock(mu_);
    return ops_;
  }
  int count(const std::string& op) const {
    std::lock_guard lock(mu_);
    int n = 0;
    for (const std::string& line : ops_) n += line.rfind(op + " ", 0) == 0;
    return n;
  }

  io::IoStatus open(const std::string& path, const io::OpenOptions& options,
                    std::unique_ptr<io::File>* file) override {
    if (int e = Check("open", path)) return io::IoStatus::FromErrno(e, "open", path);
    return target()->open(path, options, file);
  }
  io::IoStatus remove_file(const std::string& path) override {
    if (int e = Check("remove_file", path)) return io::IoStatus::FromErrno(e, "remove", path);
    return target()->remove_file(path);
  }
  io::IoStatus remove_tree(const std::string& path) override {
    if (int e = Check("remove_tree", path)) return io::IoStatus::FromErrno(e, "remove", path);
    return target()->remove_tree(path);
  }
  io::IoStatus rename(const std::string& from, const std::string& to) override {
    if (int e = Check("rename", from)) return io::IoStatus::FromErrno(e, "rename", from);
    return target()->rename(from, to);
  }
  io::IoStatus exchange(const std::string& a, const std::string& b) override {
    if (int e = Check("exchange", a)) return io::IoStatus::FromErrno(e, "exchange", a);
    return target()->exchange(a, b);
  }
  io::IoStatus sync_dir(const std::string& path) override {
    if (int e = Check("sync_dir", path)) return io::IoStatus::FromErrno(e, "sync", path);
    return target()->sync_dir(path);
  }

 private:
  int Check(const std::string& op, const std::string& path) {
    std::lock_guard lock(mu_);
    ops_.push_back(op + " " + path);
    return fault_ ? fault_(op, path) : 0;
  }

  mutable std::mutex mu_;
  Fault fault_;
  std::vector<std::string> ops_;
};

class StateDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::path(::testing::TempDir()) / "state_test_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << "mkdtemp " << pattern;
    dir_ = pattern;
    posix_ = io::NewPosixFileSystem();
    ASSERT_NE(posix_, nullptr);
    faulty_ = std::make_unique<FaultyFileSystem>(posix_.get());
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  std::set<std::string> Entries() const {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      names.insert(entry.path().filename().string());
    }
    return names;
  }

  void WriteText(const std::string& name, const std::string& text) const {
    std::ofstream out(Path(name), std::ios::binary | std::ios::trunc);
    out << text;
    ASSERT_TRUE(out.good()) << name;
  }

  std::string ReadText(const std::string& name) const {
    std::ifstream in(Path(name), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // A checkpoint directory with one file in it, as the engine leaves after the commit.
  void MakeCheckpointDir(const std::string& name, const std::string& content = "data") const {
    fs::create_directory(Path(name));
    std::ofstream(Path(name) + "/index") << content;
  }

  // The checkpoint directories of kBasename on disk.
  std::set<std::string> CheckpointDirs() const {
    std::set<std::string> names;
    for (const std::string& name : Entries()) {
      if (name.rfind(std::string(kBasename) + "-", 0) == 0 && fs::is_directory(Path(name))) {
        names.insert(name);
      }
    }
    return names;
  }

  // A checkpoint directory with an index and a data file.
  void MakeFullCheckpointDir(const std::string& name) const {
    MakeCheckpointDir(name, "index of " + name);
    std::ofstream(Path(name) + "/data-00000-of-00001") << "data of " << name;
  }

  // The entries named exactly like a checkpoint of kBasename ("model.ckpt-<step>").
  std::set<std::string> CommittedLooking() const {
    std::set<std::string> names;
    for (const std::string& name : Entries()) {
      if (CheckpointStep(name, kBasename)) names.insert(name);
    }
    return names;
  }

  // The checkpoints quarantined as "<name>.corrupt-<hex>", by their names, sorted.
  std::vector<std::string> Quarantined() const {
    std::vector<std::string> names;
    for (const std::string& name : Entries()) {
      const size_t at = name.find(".corrupt-");
      if (at != std::string::npos) names.push_back(name.substr(0, at));
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  // Temporaries and interrupted deletions.
  std::set<std::string> Leftovers() const {
    std::set<std::string> names;
    for (const std::string& name : Entries()) {
      if (name.find(".tmp-") != std::string::npos || name.find(".deleting-") != std::string::npos) {
        names.insert(name);
      }
    }
    return names;
  }

  CheckpointState ReadState() const {
    Result<CheckpointState> state = ReadCheckpointState(*posix_, dir_, kCheckpointStateFileName);
    EXPECT_TRUE(state.ok()) << state.status().ToString();
    return state.ok() ? *state : CheckpointState{};
  }

  std::unique_ptr<CheckpointManager> NewManager(int max_to_keep, double hours = 0) {
    return std::make_unique<CheckpointManager>(faulty_.get(), dir_, kBasename, max_to_keep, hours,
                                               [this] { return now_; });
  }

  // Creates the directory of `step` and records it committed at `timestamp`.
  void Commit(CheckpointManager& manager, int step, double timestamp) {
    MakeCheckpointDir(Name(step));
    const Status status = manager.RecordCommitted(Name(step), timestamp);
    ASSERT_TRUE(status.ok()) << status.ToString();
  }

  std::string dir_;
  double now_ = 0;
  std::unique_ptr<io::FileSystem> posix_;
  std::unique_ptr<FaultyFileSystem> faulty_;
};

inline CheckpointState ExampleState() {
  CheckpointState state;
  state.model_checkpoint_path = "model.ckpt-2000";
  state.all_model_checkpoint_paths = {"model.ckpt-1000", "model.ckpt-2000"};
  state.all_model_checkpoint_timestamps = {1763870000.25, 1763870060.5};
  state.last_preserved_timestamp = 1763869000;
  return state;
}

inline void ExpectSameState(const CheckpointState& a, const CheckpointState& b) {
  EXPECT_EQ(a.model_checkpoint_path, b.model_checkpoint_path);
  EXPECT_EQ(a.all_model_checkpoint_paths, b.all_model_checkpoint_paths);
  EXPECT_EQ(a.all_model_checkpoint_timestamps, b.all_model_checkpoint_timestamps);
  EXPECT_EQ(a.last_preserved_timestamp, b.last_preserved_timestamp);
}

// A validator that finds a directory complete when its index reads "complete <wall time>".
inline CheckpointValidator ContentValidator() {
  return [](const std::string& path) -> Result<ValidCheckpoint> {
    std::ifstream in(path + "/index");
    std::string word;
    double wall_time = 0;
    if (!(in >> word >> wall_time) || word != "complete") {
      return Status::Corruption(path + "/index is not complete");
    }
    return ValidCheckpoint{.wall_time = wall_time, .step = std::nullopt};
  };
}

}  // namespace asyncckpt::state_testing
