// SaverStorage::Start (start-up recovery and garbage collection with the real validator) and
// NewestCompleteStep, on real checkpoints written by the format's writer.

#include "src/saver/saver_storage.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/session.h"
#include "asyncckpt/state.h"
#include "io/fault_injection_file_system.h"
#include "src/codec/codec.h"
#include "src/format/format.h"
#include "src/format/writer.h"
#include "src/state/checkpoint_validator.h"
#include "tests/support/checkpoint_dir_test.h"
#include "tests/support/checkpoint_files.h"
#include "tests/support/files.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_support::ReadFileBytes;
using testing_support::WriteFile;

constexpr char kModel[] = "model.ckpt";
constexpr char kInput[] = "input.ckpt";

std::string Name(const std::string& basename, int step) {
  return basename + "-" + std::to_string(step);
}
std::string Name(int step) { return Name(kModel, step); }

class SaverStorageTest : public testing_support::CheckpointDirTest {
 protected:
  SaverOptions Options(int max_to_keep, io::FileSystem* file_system = nullptr) {
    SaverOptions options;
    options.checkpoint_dir = dir_;
    options.save_steps = 1;
    options.max_to_keep = max_to_keep;
    options.chunk_bytes = 4096;
    options.file_system = file_system != nullptr ? file_system : posix_.get();
    return options;
  }

  // Quarantined checkpoints "<name>.corrupt-<hex>" of kModel, by their names.
  std::set<std::string> Quarantined() const {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      const std::string name = entry.path().filename();
      if (IsQuarantinedCheckpoint(name, kModel))
        names.insert(name.substr(0, name.find(".corrupt-")));
    }
    return names;
  }

  // Entries named exactly like a checkpoint of `basename`.
  std::set<std::string> CommittedLooking(const std::string& basename = kModel) const {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      const std::string name = entry.path().filename();
      if (CheckpointStep(name, basename)) names.insert(name);
    }
    return names;
  }
};

// ---- the validator at start-up
// --------------------------------------------------------------------

// The entries of the directory, names only, recursively: what a refused start must not change.
// Lock files are left out: asking for a lock creates one, which stays empty once released and
// holds nothing of a checkpoint.
std::set<std::string> Tree(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.path().extension() == ".lock") continue;
    names.insert(fs::relative(entry.path(), dir).string());
  }
  return names;
}

// Rewrites the index of checkpoint `path` with `flags` in its header, the checksum made right:
// what a newer release that adds a flag within format version 1 writes.
void SetIndexFlags(const std::string& path, uint32_t flags) {
  std::vector<uint8_t> index = ReadFileBytes(path + "/index");
  ASSERT_GT(index.size(), 40u);
  std::memcpy(index.data() + 12, &flags, sizeof(flags));
  const size_t checksum_at = index.size() - 16;
  const uint64_t checksum = codec::Checksum({index.data(), checksum_at});
  std::memcpy(index.data() + checksum_at, &checksum, sizeof(checksum));
  WriteFile(path + "/index", index);
}

// D1 of issue 31: an intact index with a flag this build does not know was taken for damage,
// quarantined, and the job retrained from the step before. A newer release's checkpoint is not
// damage: start-up refuses to run, naming it and what wrote it, and changes nothing.
TEST_F(SaverStorageTest, ANewerReleasesCheckpointRefusesTheStartAndChangesNothing) {
  WriteCheckpoint(5);
  WriteCheckpoint(6);
  WriteState({5, 6});
  SetIndexFlags(Path(Name(6)), 4);  // the latest, by a newer release
  WriteCheckpoint(2);
  fs::resize_file(Path(Name(2) + "/index"), 20);                  // damage, unlisted
  fs::create_directory(Path(Name(7) + ".tmp-0123456789abcdef"));  // a save in progress
  const std::set<std::string> before = Tree(dir_);
  const std::string state_before = testing_support::ReadFile(Path("checkpoint"));

  SaverStorage storage;
  const Status started = storage.Start(Options(2)).status();
  EXPECT_EQ(started.code(), StatusCode::kFailedPrecondition) << started.ToString();
  EXPECT_THAT(started.message(), HasSubstr(Path(Name(6))));
  EXPECT_THAT(started.message(), HasSubstr("newer release of asyncckpt"));
  EXPECT_THAT(started.message(), HasSubstr("flags 0x4"));
  EXPECT_EQ(Tree(dir_), before) << "nothing renamed, removed or quarantined";
  EXPECT_EQ(testing_support::ReadFile(Path("checkpoint")), state_before);
  EXPECT_EQ(storage.lock, nullptr) << "a refused start keeps no lock";

  // Another format version is refused the same way, listed or not.
  SetIndexFlags(Path(Name(6)), 0);
  WriteCheckpoint(1);
  std::vector<uint8_t> index = ReadFileBytes(Path(Name(1) + "/index"));
  index[8] = 2;  // version 2, checksum made right again
  const size_t checksum_at = index.size() - 16;
  const uint64_t checksum = codec::Checksum({index.data(), checksum_at});
  std::memcpy(index.data() + checksum_at, &checksum, sizeof(checksum));
  WriteFile(Path(Name(1) + "/index"), index);
  const Status again = storage.Start(Options(2)).status();
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition) << again.ToString();
  EXPECT_THAT(again.message(), HasSubstr(Path(Name(1)) + " (index"));
  EXPECT_THAT(again.message(), HasSubstr("format version 2"));
  EXPECT_TRUE(fs::exists(Path(Name(1) + "/index")));
}

// D4 of issue 31: a manager of basename "input.ckpt" over train-sim's directory adopted the
// input checkpoints checkpoint_input lists, and its retention deleted them. A state file claims
// the basenames it lists: another saver of that basename is refused, naming both.
TEST_F(SaverStorageTest, ABasenameAnotherStateFileListsIsRefusedAndNothingIsTaken) {
  for (int step = 1; step <= 4; ++step) WriteCheckpoint(step, step, kInput);
  WriteState({1, 2, 3, 4}, kInput, InputStateFileForBasename(kInput));
  const std::set<std::string> before = Tree(dir_);
  SaverOptions options = Options(1);
  options.basename = kInput;  // with the model's state file, "checkpoint"
  SaverStorage storage;
  const Status started = storage.Start(options).status();
  EXPECT_EQ(started.code(), StatusCode::kFailedPrecondition) << started.ToString();
  EXPECT_THAT(started.message(), HasSubstr(Path("checkpoint")));
  EXPECT_THAT(started.message(), HasSubstr(Path("checkpoint_input")));
  EXPECT_THAT(started.message(), HasSubstr(Name(kInput, 4)));
  EXPECT_EQ(Tree(dir_), before);
  // The state file that lists them is theirs: its own saver starts.
  SaverStorage owner;
  ASSERT_TRUE(
      owner.Start(Options(5), InputStateFileForBasename(kInput), {kModel, kCheckpointStateFileName})
          .ok());
}

// D7 of issue 31: a job refused by the input pipeline's lock had already run the model side's
// start-up (a temporary removed, a damaged checkpoint quarantined). Every lock comes first.
TEST_F(SaverStorageTest, AJobRefusedByItsInputLockChangesNothing) {
  WriteCheckpoint(3);
  WriteState({3});
  WriteCheckpoint(4);
  fs::resize_file(Path(Name(4) + "/index"), 20);                  // damaged
  fs::create_directory(Path(Name(5) + ".tmp-0123456789abcdef"));  // debris
  std::unique_ptr<io::FileLock> other_job;
  ASSERT_TRUE(posix_->lock_file(Path("checkpoint_input.lock"), &other_job).ok());
  const std::set<std::string> before = Tree(dir_);
  SaverOptions options = Options(2);
  options.paired_input_basename = kInput;
  SaverStorage model;
  const Status started = model.Start(options).status();
  EXPECT_EQ(started.code(), StatusCode::kFailedPrecondition) << started.ToString();
  EXPECT_THAT(started.message(), HasSubstr("checkpoint_input.lock"));
  EXPECT_EQ(Tree(dir_), before);
  EXPECT_EQ(model.lock, nullptr);

  // Once free, the model's start takes the input's lock too and hands it to the input's saver
  // of this process.
  other_job.reset();
  ASSERT_TRUE(model.Start(options).ok());
  EXPECT_EQ(Quarantined(), std::set<std::string>{Name(4)});
  std::unique_ptr<io::FileLock> probe;
  EXPECT_FALSE(posix_->lock_file(Path("checkpoint_input.lock"), &probe).ok())
      << "held for the input pipeline's saver";
  SaverOptions input_options = Options(2);
  input_options.basename = kInput;
  SaverStorage input;
  ASSERT_TRUE(input
                  .Start(input_options, InputStateFileForBasename(kInput),
                         {kModel, kCheckpointStateFileName})
                  .ok());
  input.ReleaseLock();
  EXPECT_TRUE(posix_->lock_file(Path("checkpoint_input.lock"), &probe).ok());
}

// Item 2 of issue 31: a checkpoint a restore found damaged is quarantined as start-up does:
// through the manager of the saver that holds the directory, under the lock taken for the
// moment when none does, and not at all while another job holds it.
TEST_F(SaverStorageTest, DamageFoundAtRestoreIsQuarantinedByWhoeverHoldsTheDirectory) {
  for (int step = 1; step <= 3; ++step) WriteCheckpoint(step, step);
  WriteState({1, 2, 3});
  {
    SaverStorage storage;
    ASSERT_TRUE(storage.Start(Options(5)).ok());
    Result<std::string> moved =
        QuarantineFoundDamage(*posix_, dir_, kCheckpointStateFileName, Name(3), "bad chunk");
    ASSERT_TRUE(moved.ok()) << moved.status().ToString();
    EXPECT_THAT(storage.manager->retained(), ElementsAre(Name(1), Name(2)));
    EXPECT_EQ(GetCheckpointState(dir_)->model_checkpoint_path, Name(2));
  }
  // No saver holds it: the lock is taken for the moment.
  ASSERT_TRUE(QuarantineFoundDamage(*posix_, dir_, kCheckpointStateFileName, Name(2), "bad").ok());
  EXPECT_EQ(GetCheckpointState(dir_)->model_checkpoint_path, Name(1));
  EXPECT_EQ(Quarantined(), (std::set<std::string>{Name(2), Name(3)}));
  // Another job holds it: nothing changes.
  std::unique_ptr<io::FileLock> other_job;
  ASSERT_TRUE(posix_->lock_file(Path("checkpoint.lock"), &other_job).ok());
  const Status refused =
      QuarantineFoundDamage(*posix_, dir_, kCheckpointStateFileName, Name(1), "bad").status();
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_TRUE(fs::exists(Path(Name(1) + "/index")));
  EXPECT_EQ(GetCheckpointState(dir_)->model_checkpoint_path, Name(1));
}

// ---- start-up -----------------------------------------------------------------------------------

// Finding 1 and 7: debris under committed names (half-deleted checkpoints, a committed directory
// whose state-file update failed) was never cleaned up nor listed.
TEST_F(SaverStorageTest, StartRemovesEachKindOfDebrisAndRelistsACommittedNewerCheckpoint) {
  fs::create_directory(Path(Name(1)));  // empty
  WriteCheckpoint(2);
  fs::remove(Path(Name(2) + "/" + format::DataFileName(0, 2)));
  fs::remove(Path(Name(2) + "/" + format::DataFileName(1, 2)));  // index only
  WriteCheckpoint(3);
  fs::resize_file(Path(Name(3) + "/" + format::DataFileName(1, 2)), 10);  // partial data
  WriteCheckpoint(4, 4.0);  // complete, older than the listed ones
  WriteCheckpoint(6, 6.0);
  WriteCheckpoint(7, 7.0);
  WriteCheckpoint(8, 8.5);  // complete, newer: its state-file update failed
  WriteState({6, 7});
  fs::create_directory(Path(Name(5) + ".deleting-0123456789abcdef"));
  fs::create_directory(Path(Name(9) + ".tmp-0123456789abcdef"));

  SaverStorage storage;
  Result<std::vector<std::string>> removed = storage.Start(Options(2));
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_THAT(*removed, ElementsAre(Name(4), Name(5) + ".deleting-0123456789abcdef",
                                    Name(9) + ".tmp-0123456789abcdef"));
  // Damaged under committed names: quarantined, never removed.
  EXPECT_EQ(Quarantined(), (std::set<std::string>{Name(1), Name(2), Name(3)}));
  EXPECT_THAT(storage.manager->retained(), ElementsAre(Name(6), Name(7), Name(8)));
  EXPECT_EQ(CommittedLooking(), (std::set<std::string>{Name(6), Name(7), Name(8)}));
  Result<CheckpointState> state = GetCheckpointState(dir_);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_THAT(state->all_model_checkpoint_timestamps, ElementsAre(6.0, 7.0, 8.5));
}

TEST_F(SaverStorageTest, KeepEveryNHoursLeavesOldCompleteCheckpointsOnDisk) {
  WriteCheckpoint(1);  // may have been preserved
  WriteCheckpoint(2);
  fs::resize_file(Path(Name(2) + "/index"), 20);  // but debris is debris
  WriteCheckpoint(6);
  WriteCheckpoint(7);
  WriteState({6, 7});
  SaverOptions options = Options(2);
  options.keep_checkpoint_every_n_hours = 1;
  SaverStorage storage;
  Result<std::vector<std::string>> removed = storage.Start(options);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_TRUE(removed->empty());
  EXPECT_EQ(Quarantined(), std::set<std::string>{Name(2)}) << "damage is quarantined";
  EXPECT_EQ(CommittedLooking(), (std::set<std::string>{Name(1), Name(6), Name(7)}));
  EXPECT_THAT(storage.manager->retained(), ElementsAre(Name(6), Name(7)));
}

TEST_F(SaverStorageTest, HostileIndexesAreQuarantinedWithoutBlocking) {
  fs::create_directory(Path(Name(1)));
  ASSERT_EQ(::mkfifo(Path(Name(1) + "/index").c_str(), 0600), 0);
  fs::create_directory(Path(Name(2)));
  WriteFile(Path(Name(2) + "/index"), "");
  fs::resize_file(Path(Name(2) + "/index"), format::kMaxIndexBytes + 1);
  WriteCheckpoint(3);
  WriteState({3});
  SaverStorage storage;
  Result<std::vector<std::string>> removed = storage.Start(Options(2));
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_TRUE(removed->empty());
  EXPECT_EQ(Quarantined(), (std::set<std::string>{Name(1), Name(2)}));
  EXPECT_EQ(CommittedLooking(), (std::set<std::string>{Name(3)}));
}

TEST_F(SaverStorageTest, OnlyDamagedCheckpointsRefuseAFreshStartUnlessAllowed) {
  WriteCheckpoint(10);
  WriteState({10});
  fs::resize_file(Path(Name(10) + "/" + format::DataFileName(0, 2)), 1);
  for (int attempt = 0; attempt < 2; ++attempt) {
    SCOPED_TRACE(attempt == 0 ? "quarantining it" : "quarantined earlier");
    SaverStorage storage;
    const Status started = storage.Start(Options(1)).status();
    EXPECT_EQ(started.code(), StatusCode::kFailedPrecondition) << started.ToString();
    EXPECT_NE(started.message().find(Path(Name(10)) + ".corrupt-"), std::string::npos)
        << started.ToString();
    EXPECT_NE(started.message().find("allow_fresh_start"), std::string::npos);
    EXPECT_EQ(storage.lock, nullptr) << "a refused start keeps no lock";
  }
  SaverOptions options = Options(1);
  options.allow_fresh_start = true;
  SaverStorage storage;
  ASSERT_TRUE(storage.Start(options).ok());
  EXPECT_EQ(Quarantined(), std::set<std::string>{Name(10)});
}

// Finding 6a: an empty, garbage or dangling state file made the resume start afresh.
TEST_F(SaverStorageTest, BrokenStateFilesRecoverFromTheCompleteCheckpointsOnDisk) {
  for (const std::string& text :
       {std::string(), std::string("garbage\n"), "model_checkpoint_path: \"" + Name(999) + "\"\n",
        "model_checkpoint_path: \"" + Name(8) + "\"\n"}) {
    SCOPED_TRACE(text);
    TearDown();
    SetUp();
    for (int step = 4; step <= 7; ++step) WriteCheckpoint(step, step);
    WriteCheckpoint(8);
    fs::remove(Path(Name(8) + "/" + format::DataFileName(0, 2)));  // the latest, incomplete
    WriteFile(Path("checkpoint"), text);
    SaverStorage storage;
    Result<std::vector<std::string>> removed = storage.Start(Options(3));
    ASSERT_TRUE(removed.ok()) << removed.status().ToString();
    EXPECT_THAT(storage.manager->retained(), ElementsAre(Name(5), Name(6), Name(7)));
    Result<std::string> latest = LatestCheckpoint(dir_);
    ASSERT_TRUE(latest.ok()) << latest.status().ToString();
    EXPECT_EQ(*latest, Path(Name(7)));
    EXPECT_EQ(CommittedLooking(), (std::set<std::string>{Name(5), Name(6), Name(7)}));
  }
}

TEST_F(SaverStorageTest, StartPairsWithTheInputCheckpointsWhenAsked) {
  SaverOptions options = Options(1);
  options.paired_input_basename = kInput;
  SaverStorage storage;
  ASSERT_TRUE(storage.Start(options).ok());
  WriteState({1}, kInput, InputStateFileForBasename(kInput));  // only step 1 has its input
  for (int step = 1; step <= 3; ++step) {
    WriteCheckpoint(step);
    ASSERT_TRUE(storage.manager->RecordCommitted(Name(step), step).ok());
  }
  EXPECT_THAT(storage.manager->retained(), ElementsAre(Name(1), Name(3)));
  EXPECT_EQ(CommittedLooking(), (std::set<std::string>{Name(1), Name(3)}));
}

TEST_F(SaverStorageTest, InputStateFilesAreNamedAfterTheInputBasename) {
  EXPECT_EQ(InputStateFileForBasename(kInput), "checkpoint_input");
  EXPECT_EQ(InputStateFileForBasename("input_worker_1.ckpt"), "checkpoint_input_worker_1");
}

// ---- through a hook -----------------------------------------------------------------------------

// Finding 7: a save whose retention could not delete an old checkpoint (EACCES) was reported as
// failed, and the next start refused to run.
TEST_F(SaverStorageTest, RetentionFailureIsNotASaveFailureAndTheNextStartRuns) {
  io::FaultInjectionFileSystem injected(posix_.get());
  injected.fail_ops_matching(kModel, EACCES, io::FaultOp::kRemove);
  TensorRegistry registry;
  ASSERT_TRUE(registry
                  .add({"w",
                        DType::kF32,
                        {4096},
                        values_.data(),
                        values_.size() * sizeof(float),
                        nullptr,
                        {},
                        {}})
                  .ok());
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    auto hook = CheckpointSaverHook::Create(Options(1, &injected), &registry);
    ASSERT_TRUE(hook.ok()) << hook.status().ToString();
    auto session = SingularMonitoredSession::Create({hook->get()});
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    const int64_t last = 3 * (run + 1);
    const Status status = (*session)->run_until(last, [](StepContext&) { return Status::OK(); });
    ASSERT_TRUE(status.ok()) << status.ToString();
    const SaverTotals totals = (*hook)->totals();
    EXPECT_EQ(totals.saves_failed, 0);
    EXPECT_GT(totals.saves_committed, 0);
    EXPECT_GT(totals.retention_failures, 0);
    EXPECT_EQ(CommittedLooking(), (std::set<std::string>{Name(static_cast<int>(last))}));
  }
}

// ---- committed steps for readers ----------------------------------------------------------------

// Finding 6a: NewestCompleteStep read the state files only, so an empty model state file made
// a resume start afresh beside complete pairs.
TEST_F(SaverStorageTest, NewestCompleteStepScansWhenAStateFileIsBroken) {
  for (int step = 4; step <= 7; ++step) WriteCheckpoint(step);
  for (int step = 4; step <= 6; ++step) WriteCheckpoint(step, 0, kInput);
  WriteState({4, 5, 6}, kInput, kInputStateFileName);
  for (const std::string& text : {std::string(), std::string("garbage\n"),
                                  "model_checkpoint_path: \"" + Name(999) + "\"\n"}) {
    SCOPED_TRACE(text);
    WriteFile(Path("checkpoint"), text);
    Result<std::optional<int64_t>> step = NewestCompleteStep(dir_, kModel, kInput);
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_EQ(*step, std::optional<int64_t>(6));
  }
  fs::remove(Path(kInputStateFileName));
  Result<std::optional<int64_t>> step = NewestCompleteStep(dir_, kModel, kInput);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(*step, std::optional<int64_t>(6));
}

TEST_F(SaverStorageTest, NewestCompleteStepIsNoneInAFreshDirectory) {
  Result<std::optional<int64_t>> step = NewestCompleteStep(dir_, kModel, kInput);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_FALSE(step->has_value());
}

TEST_F(SaverStorageTest, InputHookRefusesToPairWithItself) {
  class NoIterator : public SaveableIterator {
    Status save(IteratorState*) override { return Status::OK(); }
    Status restore(const IteratorState&) override { return Status::OK(); }
  } iterator;
  InputPipelineOptions options;
  options.saver.checkpoint_dir = dir_;
  options.saver.save_steps = 1;
  ASSERT_EQ(options.model_basename, kModel);  // paired with the model by default
  EXPECT_TRUE(CheckpointInputPipelineHook::Create(options, &iterator).ok());
  options.model_basename = kInput;
  EXPECT_THAT(CheckpointInputPipelineHook::Create(options, &iterator).status().message(),
              HasSubstr("model_basename 'input.ckpt' must differ"));
  options.model_basename = "";
  EXPECT_TRUE(CheckpointInputPipelineHook::Create(options, &iterator).ok());
}

}  // namespace
}  // namespace asyncckpt
