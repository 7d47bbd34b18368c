#pragma once

// Test support shared by the end-to-end tests that run the asyncckpt binary: where the binary
// is, a child process running it with stdout and stderr in files, and a fixture that owns a
// fresh temporary directory per test.

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/support/files.h"

extern char** environ;

namespace asyncckpt::testing_support {

/// The CLI: $ASYNCCKPT_CLI (set by ctest), else bin/asyncckpt beside the tests/ folder that
/// holds this binary; "" when neither can be worked out.
inline std::string CliPath() {
  if (const char* path = std::getenv("ASYNCCKPT_CLI"); path != nullptr && *path != '\0') {
    return path;
  }
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return (self.parent_path().parent_path() / "bin" / "asyncckpt").string();
}

/// `value` as 16 lower-case hex digits, the way the CLI prints digests.
inline std::string Hex(uint64_t value) {
  char buffer[20];
  std::snprintf(buffer, sizeof(buffer), "%016" PRIx64, value);
  return buffer;
}

/// Entries of `dir` that are temporaries of an unfinished save or state-file rewrite; none when
/// `dir` cannot be listed.
inline std::vector<std::string> Temporaries(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp-") != std::string::npos) names.push_back(name);
  }
  return names;
}

/// A running CLI process (posix_spawn, no shell) with stdin from /dev/null and stdout and
/// stderr in files. Reaps the child when destroyed, killing it first if it still runs, so a
/// failed assertion leaves no process behind. Not thread-safe: one thread drives it.
class CliProcess {
 public:
  /// Starts CliPath() with `args`; started() says whether that worked.
  CliProcess(const std::vector<std::string>& args, const std::string& out_path,
             const std::string& err_path)
      : CliProcess({}, args, out_path, err_path) {}
  /// Starts `launcher` (a program's full path, then its arguments; e.g. mpirun -np 4) with
  /// CliPath() and `args` after it; an empty launcher starts the CLI itself.
  CliProcess(const std::vector<std::string>& launcher, const std::vector<std::string>& args,
             const std::string& out_path, const std::string& err_path)
      : out_path_(out_path), err_path_(err_path) {
    std::vector<std::string> all = launcher;
    all.push_back(CliPath());
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& arg : all) argv.push_back(arg.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    spawn_error_ = posix_spawn(&pid_, all[0].c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (spawn_error_ != 0) pid_ = -1;
  }
  CliProcess(const CliProcess&) = delete;
  CliProcess& operator=(const CliProcess&) = delete;
  ~CliProcess() {
    if (pid_ > 0) {
      Kill();
      Wait();
    }
  }

  /// True when the process was started.
  bool started() const { return spawn_error_ == 0; }
  /// Its process id; -1 once it has been reaped (or when it never started).
  pid_t pid() const { return pid_; }
  /// The errno value posix_spawn returned; 0 when it started.
  int spawn_error() const { return spawn_error_; }
  /// Sends SIGKILL if the process has not been reaped yet.
  void Kill() {
    if (pid_ > 0) kill(pid_, SIGKILL);
  }
  /// True when the process has not exited yet (reaps it when it has).
  bool Running() {
    if (pid_ <= 0) return false;
    int status = 0;
    const pid_t reaped = waitpid(pid_, &status, WNOHANG);
    if (reaped == 0 || (reaped < 0 && errno == EINTR)) return true;
    Record(reaped < 0 ? -1 : status);
    return false;
  }
  /// Waits for the exit; the exit code, or 128 + the signal that ended it (-1 when unknown).
  int Wait() {
    while (pid_ > 0) {
      int status = 0;
      const pid_t reaped = waitpid(pid_, &status, 0);
      if (reaped < 0 && errno == EINTR) continue;
      Record(reaped < 0 ? -1 : status);
    }
    return exit_code_;
  }
  /// Wait(), but kills the process and returns nullopt when it runs past `timeout`.
  std::optional<int> WaitFor(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (Running()) {
      if (std::chrono::steady_clock::now() > deadline) {
        Kill();
        Wait();
        return std::nullopt;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return exit_code_;
  }
  /// What the process wrote to stdout so far.
  std::string out() const { return ReadFile(out_path_); }
  /// What the process wrote to stderr so far.
  std::string err() const { return ReadFile(err_path_); }

 private:
  void Record(int status) {
    pid_ = -1;
    if (status < 0) return;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  std::string out_path_, err_path_;
  pid_t pid_ = -1;
  int spawn_error_ = 0;
  int exit_code_ = -1;
};

/// One CLI run taken to its end by RunCli().
struct CliRun {
  /// Whether the process could be started, and posix_spawn's errno value when not.
  bool started = false;
  int spawn_error = 0;
  /// The exit code (or 128 + signal); nullopt when it ran past the timeout and was killed.
  std::optional<int> exit_code;
  /// Its stdout and stderr.
  std::string out, err;
};

/// Runs the CLI with `args` to its end, killing it after `timeout`; the caller asserts.
inline CliRun RunCli(const std::vector<std::string>& args, const std::string& out_path,
                     const std::string& err_path, std::chrono::milliseconds timeout) {
  CliProcess process(args, out_path, err_path);
  CliRun run;
  run.started = process.started();
  run.spawn_error = process.spawn_error();
  run.exit_code = process.WaitFor(timeout);
  run.out = process.out();
  run.err = process.err();
  return run;
}

/// A fixture that checks the CLI exists and gives each test a fresh directory under
/// ::testing::TempDir() (named `prefix` + six random characters), removed after the test.
class CliFixture : public ::testing::Test {
 protected:
  explicit CliFixture(std::string prefix) : prefix_(std::move(prefix)) {}

  void SetUp() override {
    ASSERT_FALSE(CliPath().empty()) << "set ASYNCCKPT_CLI to the asyncckpt binary (ctest does)";
    ASSERT_TRUE(std::filesystem::exists(CliPath()))
        << CliPath() << " does not exist; set ASYNCCKPT_CLI";
    std::string pattern = ::testing::TempDir() + "/" + prefix_ + "XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    root_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    if (!root_.empty()) std::filesystem::remove_all(root_, ec);
  }

  /// `name` inside the test's directory.
  std::string Path(const std::string& name) const { return root_ + "/" + name; }

  std::string root_;

 private:
  std::string prefix_;
};

// The steps of `basename`'s committed checkpoints in `dir`: "<basename>-<digits>" directories
// holding an index (a commit renames a complete directory into place, so each is whole).
inline std::vector<int64_t> CommittedSteps(const std::string& dir, const std::string& basename) {
  std::vector<int64_t> steps;
  const std::string prefix = basename + "-";
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    if (name.find_first_not_of("0123456789", prefix.size()) != std::string::npos) continue;
    if (!std::filesystem::exists(entry.path() / "index")) continue;
    steps.push_back(std::stoll(name.substr(prefix.size())));
  }
  return steps;
}

// The step a resume starts from: the newest step with both a committed model and a committed
// input checkpoint. Not NewestCompleteStep of the directory as the kill left it: a kill between
// a commit's rename and its state-file update leaves a committed checkpoint unlisted, and the
// next start lists it again before it restores (docs/durability.md, finding 7).
inline std::optional<int64_t> NewestCommittedPair(const std::string& dir) {
  std::vector<int64_t> model = CommittedSteps(dir, "model.ckpt");
  std::optional<int64_t> newest;
  for (int64_t step : CommittedSteps(dir, "input.ckpt")) {
    if (std::find(model.begin(), model.end(), step) != model.end()) {
      newest = std::max(newest.value_or(step), step);
    }
  }
  return newest;
}

}  // namespace asyncckpt::testing_support
