// A FIFO where a file belongs (the `checkpoint` state file, an index, a data file, the dataset)
// makes `latest`, `verify`, `inspect`, train-sim's resume and an in-process reader fail with a
// message naming it, instead of blocking forever on an open() no writer will ever answer.
// Every run is under a watchdog: the tests assert that the process ended on its own, never how
// fast it did.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/input_pipeline.h"
#include "asyncckpt/reader.h"
#include "tests/e2e/cli_support.h"
#include "tests/support/watchdog.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using testing_support::CliFixture;
using testing_support::CliRun;

// Longest one run may take before the watchdog calls it hung (not a timing assertion).
constexpr auto kHangLimit = std::chrono::seconds(90);

class SpecialFilesTest : public CliFixture {
 protected:
  SpecialFilesTest() : CliFixture("special_files_test.") {}

  void SetUp() override {
    CliFixture::SetUp();
    if (HasFatalFailure()) return;
    dir_ = Path("ckpt");
    dataset_ = Path("dataset.bin");
    ASSERT_TRUE(WriteRecordDataset(dataset_, 256, 32, /*seed=*/7).ok());
    // Model and input checkpoints of steps 0, 2 and 4.
    const CliRun run = Cli(TrainSim(4));
    ASSERT_EQ(run.exit_code, 0) << run.err;
  }

  std::vector<std::string> TrainSim(int steps, const std::string& dataset = "") const {
    return {"train-sim",        "--quiet",
            "--checkpoint_dir", dir_,
            "--dataset",        dataset.empty() ? dataset_ : dataset,
            "--model_bytes",    "64KiB",
            "--tensors",        "2",
            "--steps",          std::to_string(steps),
            "--save_steps",     "2",
            "--batch_size",     "4"};
  }

  CliRun Cli(const std::vector<std::string>& args) {
    const std::string tag = Path("run" + std::to_string(++runs_));
    CliRun run = testing_support::RunCli(args, tag + ".out", tag + ".err", kHangLimit);
    EXPECT_TRUE(run.started) << std::strerror(run.spawn_error);
    return run;
  }

  // Replaces `path` (a file) with a FIFO that no one ever writes.
  static void MakeFifo(const std::string& path) {
    std::error_code ec;
    fs::remove(path, ec);
    ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0) << path << ": " << std::strerror(errno);
  }

  // The run ended on its own, failed, and said which FIFO stopped it.
  void ExpectFailsNaming(const std::vector<std::string>& args, const std::string& fifo) {
    SCOPED_TRACE(::testing::PrintToString(args));
    const CliRun run = Cli(args);
    ASSERT_TRUE(run.exit_code.has_value()) << "blocked on " << fifo << "; the watchdog killed it";
    EXPECT_NE(*run.exit_code, 0) << run.err;
    EXPECT_NE(run.err.find(fifo + " is a FIFO, not a regular file"), std::string::npos) << run.err;
  }

  // A resume ended on its own and succeeded: start-up took the FIFO where its own file belongs
  // for damage, said so naming it, never opened it, and went on from the newest complete step
  // (docs/durability.md). `resumed_at` is that step.
  void ExpectResumeRecoversNaming(const std::string& fifo, int resumed_at) {
    const CliRun run = Cli(TrainSim(6));
    ASSERT_TRUE(run.exit_code.has_value()) << "blocked on " << fifo << "; the watchdog killed it";
    EXPECT_EQ(*run.exit_code, 0) << run.err;
    EXPECT_NE(run.err.find(fifo + " is a FIFO, not a regular file"), std::string::npos) << run.err;
    EXPECT_NE(run.err.find("resuming at step " + std::to_string(resumed_at) + " "),
              std::string::npos)
        << run.err;
  }

  // Opens `path` with a reader in a child under the watchdog: it must end, and fail naming
  // `fifo`.
  void ExpectReaderOpenFailsNaming(const std::string& path, const std::string& fifo) {
    const testing_support::ChildOutcome outcome = testing_support::RunInChild(
        [&](std::string* message) {
          auto posix = io::NewPosixFileSystem();
          auto reader = CheckpointReader::Open(path, ReaderOptions{.file_system = posix.get()});
          *message = reader.ok() ? "opened" : reader.status().ToString();
          return reader.ok() ? 1 : 0;
        },
        kHangLimit);
    ASSERT_TRUE(outcome.ended_on_its_own) << "CheckpointReader::Open blocked on " << fifo;
    EXPECT_EQ(outcome.exit_code, 0) << outcome.message;
    EXPECT_NE(outcome.message.find(fifo + " is a FIFO, not a regular file"), std::string::npos)
        << outcome.message;
  }

  std::string dir_;
  std::string dataset_;
  int runs_ = 0;
};

// `latest` names what a resume would use (issue 31): the list rebuilt from the directory, with
// the FIFO named on stderr as the reason.
TEST_F(SpecialFilesTest, StateFileThatIsAFifoLatestAndResumeRebuildTheList) {
  const std::string fifo = dir_ + "/checkpoint";
  MakeFifo(fifo);
  const CliRun latest = Cli({"latest", dir_});
  ASSERT_TRUE(latest.exit_code.has_value()) << "latest blocked";
  EXPECT_EQ(*latest.exit_code, 0) << latest.err;
  EXPECT_EQ(latest.out, dir_ + "/model.ckpt-4\n");
  EXPECT_NE(latest.err.find(fifo + " is a FIFO, not a regular file"), std::string::npos)
      << latest.err;
  ExpectResumeRecoversNaming(fifo, 4);  // the list is rebuilt from model.ckpt-{0,2,4} on disk
}

TEST_F(SpecialFilesTest, InputStateFileThatIsAFifoResumeRebuildsTheList) {
  const std::string fifo = dir_ + "/checkpoint_input";
  MakeFifo(fifo);
  ExpectResumeRecoversNaming(fifo, 4);
}

TEST_F(SpecialFilesTest, IndexThatIsAFifoFailsVerifyInspectReaderAndResumeSkipsIt) {
  const std::string fifo = dir_ + "/model.ckpt-4/index";
  MakeFifo(fifo);
  ExpectFailsNaming({"verify", dir_ + "/model.ckpt-4"}, fifo);
  ExpectFailsNaming({"inspect", dir_ + "/model.ckpt-4"}, fifo);
  ExpectReaderOpenFailsNaming(dir_ + "/model.ckpt-4", fifo);
  // `latest` names what a resume would use: past model.ckpt-4, never opening the FIFO.
  const CliRun latest = Cli({"latest", dir_});
  ASSERT_TRUE(latest.exit_code.has_value()) << "latest blocked";
  EXPECT_EQ(*latest.exit_code, 0) << latest.err;
  EXPECT_EQ(latest.out, dir_ + "/model.ckpt-2\n");
  ExpectResumeRecoversNaming(fifo, 2);  // model.ckpt-4 is incomplete: the newest pair is 2
}

TEST_F(SpecialFilesTest, DataFileThatIsAFifoFailsVerifyInspectReaderAndResumeSkipsIt) {
  const std::string fifo = dir_ + "/model.ckpt-4/data-00000-of-00002";
  MakeFifo(fifo);
  ExpectFailsNaming({"verify", dir_ + "/model.ckpt-4"}, fifo);
  ExpectFailsNaming({"inspect", dir_ + "/model.ckpt-4"}, fifo);
  ExpectReaderOpenFailsNaming(dir_ + "/model.ckpt-4", fifo);
  ExpectResumeRecoversNaming(fifo, 2);
}

TEST_F(SpecialFilesTest, InputCheckpointFileThatIsAFifoResumeSkipsIt) {
  const std::string fifo = dir_ + "/input.ckpt-4/index";
  MakeFifo(fifo);
  ExpectResumeRecoversNaming(fifo, 2);
}

TEST_F(SpecialFilesTest, DatasetThatIsAFifoFailsAFreshRunAndAResume) {
  const std::string fifo = Path("dataset.fifo");
  MakeFifo(fifo);
  ExpectFailsNaming(TrainSim(6, fifo), fifo);
  fs::remove_all(dir_);
  ExpectFailsNaming(TrainSim(6, fifo), fifo);
}

TEST_F(SpecialFilesTest, CheckpointPathThatIsAFifoIsNotACheckpointDirectory) {
  const std::string fifo = Path("not-a-checkpoint");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  for (const char* command : {"verify", "inspect"}) {
    const CliRun run = Cli({command, fifo});
    ASSERT_TRUE(run.exit_code.has_value()) << command << " blocked";
    EXPECT_NE(*run.exit_code, 0);
    EXPECT_NE(run.err.find(fifo), std::string::npos) << run.err;
  }
  const CliRun run = Cli({"latest", fifo});
  ASSERT_TRUE(run.exit_code.has_value()) << "latest blocked";
  EXPECT_NE(*run.exit_code, 0);
  EXPECT_NE(run.err.find(fifo), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("not a directory"), std::string::npos) << run.err;
}

}  // namespace
}  // namespace asyncckpt
