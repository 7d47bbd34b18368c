// The fault sweep (issue 8): one resumed job of a saver (synchronous, asynchronous, or the input
// pipeline's hook; io_uring or POSIX underneath) is run once per counted file-system operation
// N and per fault (ENOSPC that stays, a one-shot EIO, a one-shot ENOSPC short transfer), each
// time with the N-th operation failing. Every run must either commit a checkpoint that verifies
// or fail with an error that reaches the hook (and, for the model savers, the listeners); it
// must never leave a name in the committed namespace that does not verify, nor a state file
// naming one. After a simulated crash (unsynced data dropped) and a restart, nothing of the run
// may be left over but committed checkpoints, every one of them listed.

#include <errno.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/state.h"
#include "io/fault_injection_file_system.h"
#include "src/util/log.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;

enum class HookKind { kSync, kAsync, kInput };
enum class Backend { kUring, kPosix };

const char* HookName(HookKind kind) {
  switch (kind) {
    case HookKind::kSync:
      return "sync";
    case HookKind::kAsync:
      return "async";
    case HookKind::kInput:
      return "input";
  }
  return "?";
}

// One kind of fault the sweep puts at operation N.
struct Fault {
  const char* name;
  int errno_value;
  io::FaultMode mode;
  bool stays;  // fail_after (the disk stays full) rather than fail_at (one operation)
};

constexpr Fault kFaults[] = {
    {"ENOSPC from N on", ENOSPC, io::FaultMode::kFail, true},
    {"EIO at N", EIO, io::FaultMode::kFail, false},
    {"ENOSPC short transfer at N", ENOSPC, io::FaultMode::kShortTransfer, false},
};

// Holds the log lines of one run, to print them only when the run breaks an assertion: a sweep
// logs every fault it injects.
class LogCapture {
 public:
  LogCapture() {
    previous_ = SetLogSink([this](LogLevel, std::string_view line) {
      std::lock_guard lock(mu_);
      lines_ += std::string(line) + "\n";
    });
  }
  ~LogCapture() { SetLogSink(previous_); }
  std::string Take() {
    std::lock_guard lock(mu_);
    return std::exchange(lines_, std::string());
  }

 private:
  LogSinkFunction previous_;
  std::mutex mu_;
  std::string lines_;
};

// Records what the model savers tell their listeners.
class RecordingListener final : public CheckpointSaverListener {
 public:
  bool after_save(int64_t step, const SaveStats& stats) override {
    (void)step;
    std::lock_guard lock(mu_);
    if (!stats.status.ok()) failures_.push_back(stats.status);
    return false;
  }
  std::vector<Status> failures() const {
    std::lock_guard lock(mu_);
    return failures_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Status> failures_;
};

// An input iterator whose state is a counter and a few KiB derived from it (several chunks).
class PayloadIterator final : public SaveableIterator {
 public:
  void Next() { ++counter_; }
  Status save(IteratorState* state) override {
    const int64_t counter[1] = {counter_};
    Status status = state->put_i64("counter", counter);
    if (!status.ok()) return status;
    std::vector<uint8_t> payload(10000);
    for (size_t i = 0; i < payload.size(); ++i) {
      payload[i] = static_cast<uint8_t>((counter_ * 131 + i * 7) ^ (i >> 5));
    }
    return state->put_bytes("payload", payload);
  }
  Status restore(const IteratorState& state) override {
    auto counter = state.get_i64("counter", 1);
    if (!counter.ok()) return counter.status();
    counter_ = (*counter)[0];
    return Status::OK();
  }

 private:
  int64_t counter_ = 0;
};

// What one job of the sweep did.
struct JobOutcome {
  // The first failure a hook call returned (begin, after_create_session, before_run,
  // after_run, end); OK when there was none.
  Status reported;
  // True when `reported` came from begin(), before any save.
  bool failed_in_begin = false;
  // The failed saves the listeners heard of (model savers only).
  std::vector<Status> listener_failures;
};

// Figures of one sweep.
struct SweepCounts {
  uint64_t runs = 0;
  uint64_t faults_injected = 0;
  uint64_t commits = 0;
  uint64_t failures_reported = 0;
  uint64_t not_reached = 0;  // runs that ended before their fault's operation
};

// The figures of every sweep this process ran, printed once at its end (the whole sweep when
// the binary runs alone: build/tests/fault_sweep_test).
SweepCounts& Totals() {
  static SweepCounts totals;
  return totals;
}

class PrintTotals final : public ::testing::Environment {
 public:
  void TearDown() override {
    const SweepCounts& totals = Totals();
    std::printf(
        "fault sweep: %llu runs, %llu faults injected, %llu commits, %llu failures "
        "reported\n",
        static_cast<unsigned long long>(totals.runs),
        static_cast<unsigned long long>(totals.faults_injected),
        static_cast<unsigned long long>(totals.commits),
        static_cast<unsigned long long>(totals.failures_reported));
  }
};

[[maybe_unused]] ::testing::Environment* const kPrintTotals =
    ::testing::AddGlobalTestEnvironment(new PrintTotals);

class FaultSweepTest : public ::testing::TestWithParam<std::tuple<HookKind, Backend>> {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/fault_sweep_test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    root_ = pattern;
    kind_ = std::get<0>(GetParam());
    if (std::get<1>(GetParam()) == Backend::kUring) {
      std::string why;
      base_ = io::NewUringFileSystem(io::IoOptions{}, &why);
      if (!base_) GTEST_SKIP() << "io_uring is not available here: " << why;
    } else {
      base_ = io::NewPosixFileSystem();
    }
    weights_.resize(3000);
    for (size_t i = 0; i < weights_.size(); ++i) weights_[i] = 0.25f * static_cast<float>(i);
    counters_.assign(700, 0);
    ASSERT_TRUE(registry_
                    .add({"weights",
                          DType::kF32,
                          {static_cast<int64_t>(weights_.size())},
                          weights_.data(),
                          weights_.size() * sizeof(float),
                          nullptr,
                          {},
                          {}})
                    .ok());
    ASSERT_TRUE(registry_
                    .add({"counters",
                          DType::kI64,
                          {static_cast<int64_t>(counters_.size())},
                          counters_.data(),
                          counters_.size() * sizeof(int64_t),
                          nullptr,
                          {},
                          {}})
                    .ok());
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }

  std::string basename() const { return kind_ == HookKind::kInput ? "input.ckpt" : "model.ckpt"; }
  std::string state_file() const {
    return kind_ == HookKind::kInput ? kInputStateFileName : kCheckpointStateFileName;
  }

  // The model state at `step`: what a training step would have made of it.
  void SetState(int64_t step) {
    for (size_t i = 0; i < counters_.size(); ++i)
      counters_[i] = step * 1000 + static_cast<int64_t>(i);
    weights_[0] = static_cast<float>(step);
  }

  SaverOptions ModelOptions(const std::string& dir, io::FileSystem* file_system) const {
    SaverOptions options;
    options.checkpoint_dir = dir;
    options.save_steps = 1;
    options.max_to_keep = 1;  // every save's retention deletes the previous checkpoint
    options.chunk_bytes = 4096;
    options.num_data_files = 2;
    options.background_threads = 2;
    options.queue_depth = 8;
    options.file_system = file_system;
    return options;
  }

  InputPipelineOptions InputOptions(const std::string& dir, io::FileSystem* file_system) const {
    InputPipelineOptions options;
    options.saver.checkpoint_dir = dir;
    options.saver.save_steps = 1;
    options.saver.max_to_keep = 1;
    options.model_basename = "";  // unpaired: the sweep is about one saver's own names
    options.saver.chunk_bytes = 4096;
    options.saver.file_system = file_system;
    return options;
  }

  // Runs one job that starts at `start` and makes one step: begin, the session's save (model)
  // or restore (input), the save of step start + 1, end. Stops at the first failure, as
  // MonitoredSession does, and destroys the hook.
  JobOutcome RunJob(const std::string& dir, io::FileSystem* file_system, int64_t start) {
    JobOutcome outcome;
    RecordingListener listener;
    std::unique_ptr<SessionRunHook> hook;
    PayloadIterator iterator;
    if (kind_ == HookKind::kInput) {
      auto created = CheckpointInputPipelineHook::Create(InputOptions(dir, file_system), &iterator);
      EXPECT_TRUE(created.ok()) << created.status().ToString();
      if (!created.ok()) return outcome;
      hook = std::move(*created);
    } else if (kind_ == HookKind::kSync) {
      auto created =
          CheckpointSaverHook::Create(ModelOptions(dir, file_system), &registry_, {&listener});
      EXPECT_TRUE(created.ok()) << created.status().ToString();
      if (!created.ok()) return outcome;
      hook = std::move(*created);
    } else {
      auto created =
          AsyncCheckpointSaverHook::Create(ModelOptions(dir, file_system), &registry_, {&listener});
      EXPECT_TRUE(created.ok()) << created.status().ToString();
      if (!created.ok()) return outcome;
      hook = std::move(*created);
    }
    auto run = [&]() -> Status {
      Status status = hook->begin();
      if (!status.ok()) {
        outcome.failed_in_begin = true;
        return status;
      }
      SetState(start);
      status = hook->after_create_session(start);
      if (!status.ok()) return status;
      RunContext context(start + 1);
      auto args = hook->before_run(context);
      if (!args.ok()) return args.status();
      iterator.Next();
      SetState(start + 1);
      status = hook->after_run(context, RunValues{});
      if (!status.ok()) return status;
      return hook->end(start + 1);
    };
    outcome.reported = run();
    hook.reset();  // waits for anything still in flight
    outcome.listener_failures = listener.failures();
    return outcome;
  }

  // The names of `dir` that are "<basename>-<digits>": the committed namespace.
  std::set<std::string> CommittedNames(const std::string& dir) const {
    std::set<std::string> names;
    const std::string prefix = basename() + "-";
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
      if (name.find_first_not_of("0123456789", prefix.size()) != std::string::npos) continue;
      names.insert(name);
    }
    return names;
  }

  // Empty when the checkpoint at `path` opens and verifies, else what is wrong.
  std::string VerifyProblem(const std::string& path) const {
    ReaderOptions options;
    options.force_posix_io = true;
    auto reader = CheckpointReader::Open(path, options);
    if (!reader.ok()) return reader.status().ToString();
    VerifyReport report = (*reader)->verify();
    return report.problems.empty() ? "" : report.problems.front();
  }

  // The invariants that hold at any moment: every committed name verifies, and the state file
  // (which the prior job wrote, and which is only ever replaced atomically) names only
  // checkpoints that verify. Returns the names the state file lists.
  std::set<std::string> ExpectCommittedNamespaceSound(const std::string& dir,
                                                      const std::string& when) {
    for (const std::string& name : CommittedNames(dir)) {
      EXPECT_EQ(VerifyProblem(dir + "/" + name), "") << when << ": " << name << " is committed";
    }
    std::set<std::string> listed;
    auto state = GetCheckpointState(dir, state_file());
    EXPECT_TRUE(state.ok()) << when << ": " << state.status().ToString();
    if (!state.ok()) return listed;
    for (const std::string& name : state->all_model_checkpoint_paths) {
      listed.insert(name);
      EXPECT_EQ(VerifyProblem(dir + "/" + name), "") << when << ": the state file names " << name;
    }
    EXPECT_FALSE(state->model_checkpoint_path.empty()) << when << ": the state file names nothing";
    return listed;
  }

  // After a restart: no temporaries of any kind, and the state file lists exactly the
  // committed checkpoints on disk, at least one of them (nothing saved before is lost).
  void ExpectNothingLeftOver(const std::string& dir, const std::string& when) {
    const std::set<std::string> listed = ExpectCommittedNamespaceSound(dir, when);
    EXPECT_EQ(listed, CommittedNames(dir)) << when;
    EXPECT_FALSE(listed.empty()) << when << ": the restart lists no checkpoint";
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      EXPECT_EQ(name.find(".tmp-"), std::string::npos) << when << ": " << name << " left over";
      EXPECT_EQ(name.find(".deleting-"), std::string::npos) << when << ": " << name << " left over";
    }
  }

  // The directory a resumed job starts from: a clean job's checkpoint of step 1.
  void MakeTemplate(const std::string& dir) {
    ASSERT_TRUE(fs::create_directory(dir));
    JobOutcome prior = RunJob(dir, base_.get(), 0);
    ASSERT_TRUE(prior.reported.ok()) << prior.reported.ToString();
    ASSERT_EQ(CommittedNames(dir), (std::set<std::string>{basename() + "-1"}));
  }

  std::string root_;
  HookKind kind_ = HookKind::kSync;
  std::unique_ptr<io::FileSystem> base_;
  std::vector<float> weights_;
  std::vector<int64_t> counters_;
  TensorRegistry registry_;
};

TEST_P(FaultSweepTest, EveryFaultedRunCommitsOrReportsAndARestartLeavesNothingOver) {
  const std::string templ = root_ + "/template";
  ASSERT_NO_FATAL_FAILURE(MakeTemplate(templ));

  // Clean resumed jobs, counted: the operations to sweep. The count can differ by a read
  // between runs (the first restore of a process has read its data file in one more request),
  // so the sweep covers the operations that every clean run reached.
  uint64_t operations = UINT64_MAX;
  for (const char* name : {"/clean-1", "/clean-2"}) {
    const std::string clean = root_ + name;
    fs::copy(templ, clean, fs::copy_options::recursive);
    io::FaultInjectionFileSystem counter(base_.get());
    JobOutcome outcome = RunJob(clean, &counter, 1);
    ASSERT_TRUE(outcome.reported.ok()) << outcome.reported.ToString();
    operations = std::min(operations, counter.operation_count());
    ASSERT_EQ(CommittedNames(clean), (std::set<std::string>{basename() + "-2"}));
  }
  ASSERT_GT(operations, 10u);

  SweepCounts counts;
  LogCapture log;
  for (const Fault& fault : kFaults) {
    for (uint64_t n = 1; n <= operations; ++n) {
      const std::string when =
          std::string(HookName(kind_)) + ", " + fault.name + ", N = " + std::to_string(n);
      SCOPED_TRACE(when);
      const std::string dir = root_ + "/run";
      std::error_code ignored;
      fs::remove_all(dir, ignored);
      fs::copy(templ, dir, fs::copy_options::recursive);

      io::FaultInjectionFileSystem faults(base_.get());
      if (fault.stays) {
        faults.fail_after(n, fault.errno_value, fault.mode);
      } else {
        faults.fail_at(n, fault.errno_value, fault.mode);
      }
      const JobOutcome outcome = RunJob(dir, &faults, 1);
      ++counts.runs;
      counts.faults_injected += faults.injected_count();
      // A run may take one read fewer than the clean runs (how the reader's requests split
      // varies); then the last operations are never reached, and the run must simply commit.
      if (faults.injected_count() == 0) {
        ASSERT_LT(faults.operation_count(), n) << "the fault at operation " << n << " never hit";
        ASSERT_GE(faults.operation_count() + 2, operations) << "a run far shorter than the clean";
        ++counts.not_reached;
      }

      // Commit or report, and the report reaches the listeners too.
      for (const Status& failure : outcome.listener_failures) {
        EXPECT_FALSE(outcome.reported.ok())
            << "a listener heard of a failed save the hook never reported: " << failure.ToString();
      }
      if (outcome.reported.ok()) {
        ++counts.commits;
        EXPECT_EQ(VerifyProblem(dir + "/" + basename() + "-2"), "");
        auto latest = GetCheckpointState(dir, state_file());
        ASSERT_TRUE(latest.ok()) << latest.status().ToString();
        EXPECT_EQ(latest->model_checkpoint_path, basename() + "-2");
        // What the fault hit was no save's (a retention deletion, a clean-up at start).
      } else {
        ++counts.failures_reported;
        if (kind_ != HookKind::kInput && !outcome.failed_in_begin) {
          EXPECT_FALSE(outcome.listener_failures.empty())
              << "the hook failed with " << outcome.reported.ToString()
              << " but no listener heard of a failed save";
        }
      }
      ExpectCommittedNamespaceSound(dir, "after the faulted run");

      // A crash right after the run, then a restart without faults.
      ASSERT_TRUE(faults.drop_unsynced_data().ok());
      ExpectCommittedNamespaceSound(dir, "after the crash");
      faults.clear_faults();
      {
        std::unique_ptr<SessionRunHook> restart;
        PayloadIterator iterator;
        if (kind_ == HookKind::kInput) {
          auto created =
              CheckpointInputPipelineHook::Create(InputOptions(dir, base_.get()), &iterator);
          ASSERT_TRUE(created.ok()) << created.status().ToString();
          restart = std::move(*created);
        } else {
          auto created = CheckpointSaverHook::Create(ModelOptions(dir, base_.get()), &registry_);
          ASSERT_TRUE(created.ok()) << created.status().ToString();
          restart = std::move(*created);
        }
        const Status begun = restart->begin();
        ASSERT_TRUE(begun.ok()) << begun.ToString();
      }
      ExpectNothingLeftOver(dir, "after the restart");
      const std::string lines = log.Take();
      if (HasFailure()) {  // one broken run says enough
        ADD_FAILURE() << "the log of the run:\n" << lines;
        return;
      }
    }
  }
  Totals().runs += counts.runs;
  Totals().faults_injected += counts.faults_injected;
  Totals().commits += counts.commits;
  Totals().failures_reported += counts.failures_reported;
  std::printf(
      "fault sweep (%s, %s): %llu operations per job, %llu runs, %llu faults injected, "
      "%llu commits, %llu failures reported, %llu ended before their fault\n",
      HookName(kind_), base_->name().c_str(), static_cast<unsigned long long>(operations),
      static_cast<unsigned long long>(counts.runs),
      static_cast<unsigned long long>(counts.faults_injected),
      static_cast<unsigned long long>(counts.commits),
      static_cast<unsigned long long>(counts.failures_reported),
      static_cast<unsigned long long>(counts.not_reached));
}

INSTANTIATE_TEST_SUITE_P(HooksAndBackends, FaultSweepTest,
                         ::testing::Combine(::testing::Values(HookKind::kSync, HookKind::kAsync,
                                                              HookKind::kInput),
                                            ::testing::Values(Backend::kUring, Backend::kPosix)),
                         [](const ::testing::TestParamInfo<FaultSweepTest::ParamType>& info) {
                           return std::string(HookName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) == Backend::kUring ? "IoUring"
                                                                              : "Posix");
                         });

}  // namespace
}  // namespace asyncckpt
