// Tests of src/state/startup_pass.cc: CheckpointManager::Start: recovery, garbage collection and
// relisting.

#include "src/state/startup_pass.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"
#include "io/fault_injection_file_system.h"
#include "src/util/log.h"
#include "tests/state/checkpoint_state_fixture.h"

namespace asyncckpt {
namespace {

using namespace state_testing;  // NOLINT(build/namespaces): the shared fixture
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// The shared fixture, named after the unit these tests cover.
class StartupPassTest : public StateDirTest {};

// Collects what the library logs while it lives.
class CapturedLog {
 public:
  CapturedLog()
      : previous_(SetLogSink([this](LogLevel level, std::string_view line) {
          text_ += std::string(LogLevelName(level)) + ": " + std::string(line) + "\n";
        })) {}
  ~CapturedLog() { SetLogSink(std::move(previous_)); }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
  LogSinkFunction previous_;
};

// ---- recovery -----------------------------------------------------------------------------------

TEST_F(StartupPassTest, StartContinuesRetentionAndDropsMissingDirectories) {
  {
    auto first = NewManager(3);
    for (int step = 1; step <= 5; ++step) Commit(*first, step, step);
  }
  fs::remove_all(Path(Name(4)));  // lost while the job was down
  auto manager = NewManager(3);
  ASSERT_TRUE(manager->Start().ok());
  EXPECT_THAT(manager->retained(), ElementsAre(Name(3), Name(5)));
  EXPECT_THAT(ReadState().all_model_checkpoint_paths, ElementsAre(Name(3), Name(5)));
  EXPECT_THAT(ReadState().all_model_checkpoint_timestamps, ElementsAre(3.0, 5.0));
  Commit(*manager, 6, 6);
  EXPECT_EQ(CheckpointDirs(), (std::set<std::string>{Name(3), Name(5), Name(6)}));
  Commit(*manager, 7, 7);
  EXPECT_EQ(CheckpointDirs(), (std::set<std::string>{Name(5), Name(6), Name(7)}));
  EXPECT_THAT(ReadState().all_model_checkpoint_paths, ElementsAre(Name(5), Name(6), Name(7)));
}

TEST_F(StartupPassTest, StartRewritesNothingWhenNothingChanged) {
  {
    auto first = NewManager(3);
    Commit(*first, 1, 1);
    Commit(*first, 2, 2);
  }
  const std::string before = ReadText("checkpoint");
  const int renames = faulty_->count("rename");
  auto manager = NewManager(3);
  ASSERT_TRUE(manager->Start().ok());
  EXPECT_EQ(faulty_->count("rename"), renames);
  EXPECT_EQ(ReadText("checkpoint"), before);
  EXPECT_THAT(manager->retained(), ElementsAre(Name(1), Name(2)));
}

TEST_F(StartupPassTest, StartWithoutStateFileStartsEmpty) {
  auto manager = NewManager(3);
  ASSERT_TRUE(manager->Start().ok());
  EXPECT_TRUE(manager->retained().empty());
  EXPECT_TRUE(Entries().empty());
}

TEST_F(StartupPassTest, StartKeepsLastPreservedTimestamp) {
  CheckpointState state = ExampleState();
  MakeCheckpointDir("model.ckpt-1000");
  MakeCheckpointDir("model.ckpt-2000");
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());
  auto manager = NewManager(5);
  ASSERT_TRUE(manager->Start().ok());
  ExpectSameState(manager->state(), state);
  Commit(*manager, 3000, 1763870100);
  EXPECT_EQ(ReadState().last_preserved_timestamp, 1763869000);
}

// Finding 6a: a corrupt state file used to stop the saver (Corruption), and a resume beside it
// started afresh. Now the list is rebuilt from the complete checkpoints on disk, loudly.
TEST_F(StartupPassTest, StartRebuildsACorruptStateFileFromTheDirectory) {
  MakeCheckpointDir(Name(1));
  MakeCheckpointDir(Name(2));
  MakeCheckpointDir(Name(3));
  const std::string corrupt = "model_checkpoint_path: \"" + Name(3) + "\"\ngarbage\n";
  WriteText("checkpoint", corrupt);
  auto manager = NewManager(2);
  std::vector<std::string> logged;
  auto previous = SetLogSink([&](LogLevel level, std::string_view line) {
    logged.push_back(std::string(LogLevelName(level)) + ": " + std::string(line));
  });
  Result<StartupReport> report = manager->Start();
  SetLogSink(std::move(previous));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_THAT(report->rebuilt_because, HasSubstr(Path("checkpoint") + ":2:"));
  EXPECT_THAT(manager->retained(), ElementsAre(Name(2), Name(3)));
  EXPECT_THAT(ReadState().all_model_checkpoint_paths, ElementsAre(Name(2), Name(3)));
  // Older than the rebuilt window, complete, unlisted: removed as retention would have.
  EXPECT_THAT(report->removed, ElementsAre(Name(1)));
  EXPECT_EQ(CheckpointDirs(), (std::set<std::string>{Name(2), Name(3)}));
  const bool warned = std::any_of(logged.begin(), logged.end(), [&](const std::string& line) {
    return line.find("WARNING") != std::string::npos &&
           line.find("rebuilt the list") != std::string::npos;
  });
  EXPECT_TRUE(warned);
}

// ---- stale temporaries --------------------------------------------------------------------------

TEST_F(StartupPassTest, StartRemovesOnlyOurTemporariesAndDeletions) {
  const std::vector<std::string> stale = {
      "checkpoint.tmp-00ff", "model.ckpt-3.deleting-0123456789abcdef",
      "model.ckpt-5.tmp-0123456789abcdef", "model.ckpt-7.tmp-AB"};
  MakeCheckpointDir(stale[1]);
  MakeCheckpointDir(stale[2]);
  MakeCheckpointDir(stale[3]);
  WriteText(stale[0], "partial");
  const std::set<std::string> kept = {"checkpoint",
                                      "model.ckpt-5",
                                      "other.ckpt-5.tmp-0123",
                                      "model.ckpt-x.tmp-01",
                                      "model.ckpt-5.tmp-xyz",
                                      "model.ckpt-5.tmp-",
                                      "model.ckpt.tmp-01",
                                      "model.ckpt-.tmp-01",
                                      "model.ckpt-5.tmp-01.bak",
                                      "notes.txt",
                                      "checkpoint.tmp-",
                                      "checkpoint.tmp-zz",
                                      "xmodel.ckpt-5.tmp-01",
                                      "model.ckpt-5.tmp-01-2",
                                      "model.ckpt-3.deleting-zz",
                                      "other.ckpt-3.deleting-01",
                                      "model.ckpt-3.deleting-01"};
  for (const std::string& name : kept) WriteText(name, "keep");
  fs::remove(Path("model.ckpt-5"));
  MakeCheckpointDir("model.ckpt-5");
  fs::remove(Path("other.ckpt-5.tmp-0123"));
  MakeCheckpointDir("other.ckpt-5.tmp-0123");
  auto manager = NewManager(3);
  Result<StartupReport> report = manager->Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->removed, stale);
  // "model.ckpt-3.deleting-01" is a file: this library only ever renames directories so.
  EXPECT_EQ(Entries(), kept);
  // The garbage state file ("keep") gave way to the one complete checkpoint on disk.
  EXPECT_THAT(manager->retained(), ElementsAre("model.ckpt-5"));
}

TEST_F(StartupPassTest, StartLogsAndReportsAFailedRemovalButDoesNotFail) {
  MakeCheckpointDir("model.ckpt-5.tmp-01");
  faulty_->set_fault(
      [](const std::string& op, const std::string&) { return op == "remove_tree" ? EACCES : 0; });
  auto manager = NewManager(3);
  Result<StartupReport> report = manager->Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->failures.size(), 1u);
  EXPECT_THAT(report->failures[0], HasSubstr(Path("model.ckpt-5.tmp-01")));
  EXPECT_TRUE(report->removed.empty());
}

// ---- start-up recovery --------------------------------------------------------------------------

TEST_F(StartupPassTest, FreshDirectoryStartsEmptyAndSilently) {
  std::vector<std::string> logged;
  auto previous = SetLogSink([&](LogLevel, std::string_view line) { logged.emplace_back(line); });
  Result<StartupReport> report = NewManager(3)->Start();
  SetLogSink(std::move(previous));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(logged.empty()) << logged.front();
  EXPECT_TRUE(Entries().empty());
  EXPECT_TRUE(report->rebuilt_because.empty());
}

// Finding 6a: an empty state file, or one naming only missing checkpoints, made a resume start
// afresh beside intact checkpoints (which retention then deleted).
TEST_F(StartupPassTest, EmptyStateFileIsRebuiltFromTheDirectory) {
  for (int step = 4; step <= 7; ++step) MakeCheckpointDir(Name(step));
  WriteText("checkpoint", "");
  auto manager = NewManager(3);
  Result<StartupReport> report = manager->Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_THAT(report->rebuilt_because, HasSubstr("names no checkpoint"));
  EXPECT_THAT(manager->retained(), ElementsAre(Name(5), Name(6), Name(7)));
  EXPECT_EQ(ReadState().model_checkpoint_path, Name(7));
  EXPECT_THAT(report->removed, ElementsAre(Name(4)));
}

TEST_F(StartupPassTest, StateFileNamingOnlyMissingCheckpointsIsRebuiltFromTheDirectory) {
  for (int step = 4; step <= 7; ++step) MakeCheckpointDir(Name(step));
  CheckpointState state;
  state.all_model_checkpoint_paths = {Name(999)};
  state.model_checkpoint_path = Name(999);
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());
  auto manager = NewManager(5);
  Result<StartupReport> report = manager->Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_THAT(report->dropped, ElementsAre(Name(999)));
  EXPECT_THAT(report->rebuilt_because, HasSubstr("names no complete checkpoint"));
  EXPECT_THAT(manager->retained(), ElementsAre(Name(4), Name(5), Name(6), Name(7)));
  EXPECT_TRUE(report->removed.empty());
}

TEST_F(StartupPassTest, DeletedLatestIsDroppedAndTheRestKept) {
  for (int step = 4; step <= 7; ++step) MakeCheckpointDir(Name(step));
  CheckpointState state;
  for (int step = 4; step <= 8; ++step) {
    state.all_model_checkpoint_paths.push_back(Name(step));
    state.all_model_checkpoint_timestamps.push_back(step);
  }
  state.model_checkpoint_path = Name(8);
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());
  auto manager = NewManager(5);
  Result<StartupReport> report = manager->Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_THAT(report->dropped, ElementsAre(Name(8)));
  EXPECT_THAT(manager->retained(), ElementsAre(Name(4), Name(5), Name(6), Name(7)));
  EXPECT_EQ(LatestCheckpoint(dir_).value(), Path(Name(7)));
}

// Finding 7: a directory committed while the state-file update hit ENOSPC was never listed and
// never removed.
TEST_F(StartupPassTest, CommittedButUnlistedCheckpointIsListedAgainAtStart) {
  auto manager = NewManager(3);
  for (int step = 1; step <= 2; ++step) {
    MakeCheckpointDir(Name(step), "complete " + std::to_string(step));
    ASSERT_TRUE(manager->RecordCommitted(Name(step), step).ok());
  }
  MakeCheckpointDir(Name(3), "complete 33.5");
  faulty_->set_fault(
      [](const std::string& op, const std::string&) { return op == "rename" ? ENOSPC : 0; });
  EXPECT_FALSE(manager->RecordCommitted(Name(3), 3).ok());
  faulty_->set_fault(nullptr);
  CheckpointManager restarted(faulty_.get(),
                              CheckpointManagerOptions{.checkpoint_dir = dir_,
                                                       .basename = kBasename,
                                                       .max_to_keep = 3,
                                                       .validator = ContentValidator()},
                              [] { return 0.0; });
  Result<StartupReport> report = restarted.Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_THAT(report->relisted, ElementsAre(Name(3)));
  EXPECT_THAT(restarted.retained(), ElementsAre(Name(1), Name(2), Name(3)));
  EXPECT_THAT(ReadState().all_model_checkpoint_timestamps, ElementsAre(1.0, 2.0, 33.5));
}

TEST_F(StartupPassTest, UnlistedDirectoriesFollowTheStartupRule) {
  // Listed: 5 and 6 (max_to_keep 3). Unlisted: 1 incomplete, 2 and 3 complete and old, 4
  // complete and old, 7 incomplete, 8 complete and new.
  for (int step : {5, 6}) MakeCheckpointDir(Name(step), "complete " + std::to_string(step));
  for (int step : {2, 3, 4, 8}) MakeCheckpointDir(Name(step), "complete " + std::to_string(step));
  MakeCheckpointDir(Name(1), "torn");
  fs::create_directory(Path(Name(7)));
  CheckpointState state;
  state.all_model_checkpoint_paths = {Name(5), Name(6)};
  state.all_model_checkpoint_timestamps = {5, 6};
  state.model_checkpoint_path = Name(6);
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());
  for (double hours : {0.0, 1.0}) {
    SCOPED_TRACE("keep_checkpoint_every_n_hours " + std::to_string(hours));
    CheckpointManager manager(faulty_.get(),
                              CheckpointManagerOptions{.checkpoint_dir = dir_,
                                                       .basename = kBasename,
                                                       .max_to_keep = 3,
                                                       .keep_checkpoint_every_n_hours = hours,
                                                       .validator = ContentValidator()},
                              [] { return 0.0; });
    Result<StartupReport> report = manager.Start();
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    // 8 is newer than the oldest listed; 4 is not, and the list (5, 6, 8) is full.
    EXPECT_THAT(manager.retained(), ElementsAre(Name(5), Name(6), Name(8)));
    if (hours == 0) {
      // 1 and 7 are damaged: quarantined, never removed.
      EXPECT_EQ(report->removed, (std::vector<std::string>{Name(2), Name(3), Name(4)}));
      EXPECT_EQ(Quarantined(), (std::vector<std::string>{Name(1), Name(7)}));
      EXPECT_EQ(report->quarantined.size(), 2u);
      EXPECT_EQ(CommittedLooking(), (std::set<std::string>{Name(5), Name(6), Name(8)}));
      for (int step : {2, 3, 4}) MakeCheckpointDir(Name(step), "complete 0");  // again
    } else {
      EXPECT_TRUE(report->removed.empty());
      EXPECT_THAT(report->kept_unlisted, ElementsAre(Name(4), Name(3), Name(2)));
      EXPECT_EQ(Quarantined(), (std::vector<std::string>{Name(1), Name(7)})) << "still there";
    }
  }
}

TEST_F(StartupPassTest, StartFillsAShortListWithTheNewestUnlistedCheckpoints) {
  for (int step = 1; step <= 6; ++step) MakeCheckpointDir(Name(step));
  CheckpointState state;
  state.all_model_checkpoint_paths = {Name(5)};
  state.all_model_checkpoint_timestamps = {5};
  state.model_checkpoint_path = Name(5);
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());
  auto manager = NewManager(3);
  ASSERT_TRUE(manager->Start().ok());
  EXPECT_THAT(manager->retained(), ElementsAre(Name(4), Name(5), Name(6)));
  EXPECT_EQ(CommittedLooking(), (std::set<std::string>{Name(4), Name(5), Name(6)}));
}

TEST_F(StartupPassTest, DamagedListedCheckpointIsQuarantinedEvenWhenTheRewriteFails) {
  MakeCheckpointDir(Name(1), "complete 1");
  MakeCheckpointDir(Name(2), "torn");
  CheckpointState state;
  state.all_model_checkpoint_paths = {Name(1), Name(2)};
  state.all_model_checkpoint_timestamps = {1, 2};
  state.model_checkpoint_path = Name(2);
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());
  const CheckpointManagerOptions options{.checkpoint_dir = dir_,
                                         .basename = kBasename,
                                         .max_to_keep = 3,
                                         .validator = ContentValidator()};
  faulty_->set_fault([](const std::string& op, const std::string& path) {
    return op == "rename" && path.find("checkpoint.tmp-") != std::string::npos ? ENOSPC : 0;
  });
  {
    CheckpointManager manager(faulty_.get(), options, [] { return 0.0; });
    Result<StartupReport> report = manager.Start();
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->failures.size(), 1u);
    EXPECT_FALSE(fs::exists(Path(Name(2))));
    EXPECT_EQ(Quarantined(), std::vector<std::string>{Name(2)}) << "renamed, every byte kept";
    EXPECT_EQ(report->quarantined.size(), 1u);
  }
  faulty_->set_fault(nullptr);
  CheckpointManager manager(faulty_.get(), options, [] { return 0.0; });
  Result<StartupReport> report = manager.Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->removed.empty());
  EXPECT_EQ(report->quarantined.size(), 1u) << "an earlier quarantine is reported again";
  EXPECT_THAT(ReadState().all_model_checkpoint_paths, ElementsAre(Name(1)));
}

TEST_F(StartupPassTest, TruncatedOnlyCheckpointIsQuarantinedNotRemoved) {
  MakeCheckpointDir(Name(10), "complete 10");
  CheckpointState state;
  state.all_model_checkpoint_paths = {Name(10)};
  state.all_model_checkpoint_timestamps = {10};
  state.model_checkpoint_path = Name(10);
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());
  std::ofstream(Path(Name(10) + "/index"), std::ios::trunc) << "compl";
  CapturedLog log;
  auto manager =
      std::make_unique<CheckpointManager>(faulty_.get(),
                                          CheckpointManagerOptions{.checkpoint_dir = dir_,
                                                                   .basename = kBasename,
                                                                   .max_to_keep = 1,
                                                                   .validator = ContentValidator()},
                                          [] { return 0.0; });
  Result<StartupReport> report = manager->Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->removed.empty());
  ASSERT_EQ(report->quarantined.size(), 1u);
  EXPECT_TRUE(report->quarantined[0].starts_with(Name(10) + ".corrupt-"));
  EXPECT_EQ(ReadText(report->quarantined[0] + "/index"), "compl") << "the evidence is kept";
  EXPECT_THAT(log.text(), HasSubstr("ERROR: checkpoint " + Path(Name(10)) + " is damaged"));
  EXPECT_THAT(log.text(), HasSubstr(Path(report->quarantined[0])));
  EXPECT_TRUE(manager->retained().empty());
  // Retention and later starts leave it alone.
  MakeCheckpointDir(Name(11), "complete 11");
  ASSERT_TRUE(manager->RecordCommitted(Name(11), 11).ok());
  MakeCheckpointDir(Name(12), "complete 12");
  ASSERT_TRUE(manager->RecordCommitted(Name(12), 12).ok());
  ASSERT_TRUE(NewManager(1)->Start().ok());
  EXPECT_EQ(Quarantined(), std::vector<std::string>{Name(10)});
}

TEST_F(StartupPassTest, MisnamedCopyIsQuarantinedNotRelisted) {
  MakeCheckpointDir(Name(15), "complete 15");
  CapturedLog log;
  CheckpointManager manager(
      faulty_.get(),
      CheckpointManagerOptions{.checkpoint_dir = dir_,
                               .basename = kBasename,
                               .max_to_keep = 3,
                               .validator = [](const std::string& path) -> Result<ValidCheckpoint> {
                                 // Every directory holds step 15, whatever its name.
                                 if (!fs::exists(path + "/index")) return Status::NotFound(path);
                                 return ValidCheckpoint{.wall_time = 1, .step = 15};
                               }},
      [] { return 0.0; });
  fs::copy(Path(Name(15)), Path(Name(25)));
  Result<StartupReport> report = manager.Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_THAT(report->relisted, ElementsAre(Name(15)));
  EXPECT_THAT(manager.retained(), ElementsAre(Name(15)));
  EXPECT_EQ(Quarantined(), std::vector<std::string>{Name(25)});
  EXPECT_THAT(log.text(), HasSubstr("holds the state of step 15, not of step 25"));
  EXPECT_THAT(log.text(), HasSubstr("start-up listed " + Path(Name(15)) + " again"));
}

TEST_F(StartupPassTest, OtherBasenamesEntriesOfASharedStateFileAreKept) {
  MakeCheckpointDir(Name(1));
  MakeCheckpointDir("other.ckpt-7");
  CheckpointState state;
  state.all_model_checkpoint_paths = {"other.ckpt-7", Name(1)};
  state.all_model_checkpoint_timestamps = {7, 1};
  state.model_checkpoint_path = Name(1);
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());
  auto manager = NewManager(1);
  Result<StartupReport> report = manager->Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->dropped.empty());
  Commit(*manager, 2, 2);
  Commit(*manager, 3, 3);
  EXPECT_THAT(ReadState().all_model_checkpoint_paths, ElementsAre("other.ckpt-7", Name(3)));
  EXPECT_EQ(ReadState().model_checkpoint_path, Name(3));
  EXPECT_TRUE(fs::exists(Path("other.ckpt-7")));
}

// D8 of issue 31: quarantined checkpoints piled up, and later starts never mentioned them. Every
// start names them in a warning, with their count and bytes (`asyncckpt gc` removes them).
TEST_F(StartupPassTest, EveryStartWarnsOfTheQuarantinedCheckpointsWithTheirCountAndBytes) {
  MakeCheckpointDir("model.ckpt-3.corrupt-0123456789abcdef", std::string(1000, 'x'));
  MakeCheckpointDir("model.ckpt-4.corrupt-00000000000000ff", std::string(24, 'y'));
  MakeCheckpointDir("other.ckpt-4.corrupt-00000000000000ff", "not ours");
  for (int start = 0; start < 2; ++start) {
    SCOPED_TRACE(start);
    CapturedLog log;
    Result<StartupReport> report = NewManager(3)->Start();
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->quarantined_bytes, 1024u);
    EXPECT_THAT(log.text(), HasSubstr("WARNING: 2 quarantined model.ckpt checkpoints in " + dir_ +
                                      " hold 1024 bytes (1.0 KiB): "
                                      "model.ckpt-3.corrupt-0123456789abcdef, "
                                      "model.ckpt-4.corrupt-00000000000000ff"));
    EXPECT_THAT(log.text(), HasSubstr("asyncckpt gc " + dir_ + " --remove-quarantined"));
  }
}

// A newer release's checkpoint (the validator's FailedPrecondition) refuses the start before
// anything changes: no leftover removed, no damaged checkpoint quarantined, no rewrite.
TEST_F(StartupPassTest, ANewerReleasesCheckpointRefusesTheStartBeforeAnyChange) {
  MakeCheckpointDir(Name(1), "complete 1");
  MakeCheckpointDir(Name(2), "damaged");
  MakeCheckpointDir(Name(3), "newer");
  MakeCheckpointDir(Name(4) + ".tmp-0123456789abcdef");
  WriteText("checkpoint", "model_checkpoint_path: \"" + Name(3) + "\"\n");
  const std::set<std::string> before = Entries();
  CheckpointValidator validator = [inner = ContentValidator()](const std::string& path) {
    std::ifstream in(path + "/index");
    std::string word;
    in >> word;
    if (word == "newer") return Result<ValidCheckpoint>(Status::FailedPrecondition("flags 0x4"));
    return inner(path);
  };
  CheckpointManagerOptions options;
  options.checkpoint_dir = dir_;
  options.basename = kBasename;
  options.validator = validator;
  CheckpointManager manager(faulty_.get(), options, [] { return 0.0; });
  const Status started = manager.Start().status();
  EXPECT_EQ(started.code(), StatusCode::kFailedPrecondition) << started.ToString();
  EXPECT_THAT(started.message(), HasSubstr(Path(Name(3)) + " (flags 0x4)"));
  EXPECT_EQ(Entries(), before);
  EXPECT_EQ(faulty_->count("rename") + faulty_->count("remove_tree"), 0);
}

}  // namespace
}  // namespace asyncckpt
