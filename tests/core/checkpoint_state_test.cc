#include "src/state/checkpoint_state.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"
#include "io/fault_injection_file_system.h"
#include "src/util/log.h"
#include "tests/support/watchdog.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr char kBasename[] = "model.ckpt";

std::string Name(int step) { return std::string(kBasename) + "-" + std::to_string(step); }

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

class CheckpointStateTest : public ::testing::Test {
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

// ---- the text form ------------------------------------------------------------------------------

CheckpointState ExampleState() {
  CheckpointState state;
  state.model_checkpoint_path = "model.ckpt-2000";
  state.all_model_checkpoint_paths = {"model.ckpt-1000", "model.ckpt-2000"};
  state.all_model_checkpoint_timestamps = {1763870000.25, 1763870060.5};
  state.last_preserved_timestamp = 1763869000;
  return state;
}

void ExpectSameState(const CheckpointState& a, const CheckpointState& b) {
  EXPECT_EQ(a.model_checkpoint_path, b.model_checkpoint_path);
  EXPECT_EQ(a.all_model_checkpoint_paths, b.all_model_checkpoint_paths);
  EXPECT_EQ(a.all_model_checkpoint_timestamps, b.all_model_checkpoint_timestamps);
  EXPECT_EQ(a.last_preserved_timestamp, b.last_preserved_timestamp);
}

TEST(CheckpointStateTextTest, SerializesInTensorFlowTextProtoForm) {
  EXPECT_EQ(SerializeCheckpointState(ExampleState()),
            "model_checkpoint_path: \"model.ckpt-2000\"\n"
            "all_model_checkpoint_paths: \"model.ckpt-1000\"\n"
            "all_model_checkpoint_paths: \"model.ckpt-2000\"\n"
            "all_model_checkpoint_timestamps: 1763870000.25\n"
            "all_model_checkpoint_timestamps: 1763870060.5\n"
            "last_preserved_timestamp: 1763869000\n");
}

TEST(CheckpointStateTextTest, TimestampsRoundTripExactly) {
  CheckpointState state;
  state.model_checkpoint_path = "c";
  state.all_model_checkpoint_paths = {"a", "b", "c"};
  state.all_model_checkpoint_timestamps = {1763870060.123456789, 0.1, 1e-300};
  state.last_preserved_timestamp = 1763869999.9999998;
  Result<CheckpointState> parsed = ParseCheckpointState(SerializeCheckpointState(state), "mem");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ExpectSameState(*parsed, state);
}

TEST(CheckpointStateTextTest, ParsesAnyFieldOrderAndBlankLines) {
  const std::string text =
      "\n"
      "all_model_checkpoint_timestamps: 1763870000.25\n"
      "  last_preserved_timestamp:1763869000  \n"
      "all_model_checkpoint_paths: \"model.ckpt-1000\"\n"
      "\r\n"
      "all_model_checkpoint_timestamps: 1.7638700605e9\n"
      "\tmodel_checkpoint_path : \"model.ckpt-2000\"\n"
      "all_model_checkpoint_paths: \"model.ckpt-2000\"";  // no final newline
  Result<CheckpointState> parsed = ParseCheckpointState(text, "mem");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ExpectSameState(*parsed, ExampleState());
}

TEST(CheckpointStateTextTest, MissingTimestampsBecomeZero) {
  Result<CheckpointState> parsed = ParseCheckpointState(
      "model_checkpoint_path: \"b\"\nall_model_checkpoint_paths: \"a\"\n"
      "all_model_checkpoint_paths: \"b\"\n",
      "mem");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_THAT(parsed->all_model_checkpoint_timestamps, ElementsAre(0.0, 0.0));
  EXPECT_EQ(parsed->last_preserved_timestamp, 0);
}

TEST(CheckpointStateTextTest, ModelPathAloneBecomesTheList) {
  Result<CheckpointState> parsed = ParseCheckpointState("model_checkpoint_path: \"a\"\n", "mem");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_THAT(parsed->all_model_checkpoint_paths, ElementsAre("a"));
  EXPECT_THAT(parsed->all_model_checkpoint_timestamps, ElementsAre(0.0));
}

TEST(CheckpointStateTextTest, EmptyTextNamesNothing) {
  Result<CheckpointState> parsed = ParseCheckpointState("\n\n", "mem");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_TRUE(parsed->model_checkpoint_path.empty());
  EXPECT_TRUE(parsed->all_model_checkpoint_paths.empty());
}

struct MalformedCase {
  std::string text;
  int line;
  std::string what;
};

TEST(CheckpointStateTextTest, RejectsEachMalformedFormWithFileAndLine) {
  const std::string ok_model = "model_checkpoint_path: \"a\"\n";
  const std::vector<MalformedCase> cases = {
      {ok_model + "\nfoo: 1\n", 3, "unknown field 'foo'"},
      {ok_model + "all_model_checkpoint_paths \"a\"\n", 2, "expected '<field>: <value>'"},
      {"model_checkpoint_path: a\n", 1, "expected a quoted name"},
      {"model_checkpoint_path: \"a\n", 1, "expected a quoted name"},
      {"model_checkpoint_path: \"a\"b\"\n", 1, "bad quoting"},
      {"model_checkpoint_path: \"a\\\"b\"\n", 1, "bad quoting"},
      {"model_checkpoint_path: \"a\" \"b\"\n", 1, "bad quoting"},
      {"model_checkpoint_path: \"\"\n", 1, "empty checkpoint name"},
      {"model_checkpoint_path: \"sub/a\"\n", 1, "contains '/'"},
      {"model_checkpoint_path: \"/abs\"\n", 1, "contains '/'"},
      {"model_checkpoint_path: \"..\"\n", 1, "'..'"},
      {"model_checkpoint_path: \"a..b\"\n", 1, "'..'"},
      {ok_model + "all_model_checkpoint_paths: \"../a\"\n", 2, "contains '/'"},
      {ok_model + "all_model_checkpoint_timestamps: soon\n", 2, "bad timestamp 'soon'"},
      {ok_model + "all_model_checkpoint_timestamps: 12x\n", 2, "bad timestamp '12x'"},
      {ok_model + "all_model_checkpoint_timestamps: nan\n", 2, "bad timestamp 'nan'"},
      {ok_model + "all_model_checkpoint_timestamps: inf\n", 2, "bad timestamp 'inf'"},
      {ok_model + "last_preserved_timestamp: \n", 2, "bad timestamp ''"},
      {ok_model + "all_model_checkpoint_paths: \"a\"\nall_model_checkpoint_timestamps: 1\n"
                  "all_model_checkpoint_timestamps: 2\n",
       3, "2 all_model_checkpoint_timestamps for 1 all_model_checkpoint_paths"},
      {"all_model_checkpoint_paths: \"a\"\n\nmodel_checkpoint_path: \"b\"\n"
       "all_model_checkpoint_paths: \"b\"\nall_model_checkpoint_paths: \"c\"\n",
       3, "model_checkpoint_path 'b' is not the last"},
      {"all_model_checkpoint_paths: \"a\"\n", 1, "model_checkpoint_path '' is not the last"},
      {ok_model + ok_model, 2, "model_checkpoint_path repeated"},
      {ok_model + "last_preserved_timestamp: 1\nlast_preserved_timestamp: 2\n", 3,
       "last_preserved_timestamp repeated"},
      {ok_model + "all_model_checkpoint_paths: \"a\"\nall_model_checkpoint_paths: \"a\"\n", 3,
       "listed twice"},
  };
  for (const MalformedCase& c : cases) {
    SCOPED_TRACE(c.text);
    Result<CheckpointState> parsed = ParseCheckpointState(c.text, "/ckpt/checkpoint");
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), StatusCode::kCorruption);
    EXPECT_THAT(parsed.status().message(),
                HasSubstr("/ckpt/checkpoint:" + std::to_string(c.line) + ": "));
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.what));
  }
}

TEST(CheckpointStateTextTest, ValidateRejectsWhatCannotBeReadBack) {
  CheckpointState state = ExampleState();
  state.model_checkpoint_path = "model.ckpt-1000";
  EXPECT_EQ(ValidateCheckpointState(state).code(), StatusCode::kInvalidArgument);
  state = ExampleState();
  state.all_model_checkpoint_timestamps.pop_back();
  EXPECT_EQ(ValidateCheckpointState(state).code(), StatusCode::kInvalidArgument);
  state = ExampleState();
  state.all_model_checkpoint_paths.front() = "x/y";
  EXPECT_EQ(ValidateCheckpointState(state).code(), StatusCode::kInvalidArgument);
  state = ExampleState();
  state.all_model_checkpoint_paths.front() = "model.ckpt-2000";
  EXPECT_EQ(ValidateCheckpointState(state).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateCheckpointState(ExampleState()).ok());
  EXPECT_TRUE(ValidateCheckpointState(CheckpointState{}).ok());
}

// A state file of the largest size a reader accepts holds some 350000 names. Parsing and
// validating it must end: a duplicate check that searched the list per name took most of an hour
// (found while writing the parser's fuzz target, issue 8). The watchdog keeps that from stalling
// the suite; it measures nothing.
TEST(CheckpointStateTextTest, StateFileOfTheLargestAcceptedSizeParsesAndValidates) {
  std::string text;
  size_t count = 0;
  for (;;) {
    const std::string line =
        "all_model_checkpoint_paths: \"" + Name(static_cast<int>(count)) + "\"\n";
    if (text.size() + line.size() + 64 > kMaxCheckpointStateFileBytes) break;
    text += line;
    ++count;
  }
  text += "model_checkpoint_path: \"" + Name(static_cast<int>(count - 1)) + "\"\n";
  const testing_support::ChildOutcome outcome = testing_support::RunInChild(
      [&](std::string* message) {
        Result<CheckpointState> parsed = ParseCheckpointState(text, "big");
        if (!parsed.ok()) {
          *message = parsed.status().ToString();
          return 1;
        }
        if (parsed->all_model_checkpoint_paths.size() != count) {
          *message = std::to_string(parsed->all_model_checkpoint_paths.size()) + " names parsed";
          return 2;
        }
        const Status valid = ValidateCheckpointState(*parsed);
        *message = valid.ToString();
        return valid.ok() ? 0 : 3;
      },
      std::chrono::minutes(5));
  ASSERT_TRUE(outcome.ended_on_its_own)
      << "parsing " << text.size() << " bytes (" << count << " names) did not end in 5 minutes";
  EXPECT_EQ(outcome.exit_code, 0) << outcome.message;
}

// ---- reading and writing the file ---------------------------------------------------------------

TEST_F(CheckpointStateTest, StateFileRoundTrips) {
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, ExampleState()).ok());
  ExpectSameState(ReadState(), ExampleState());
  EXPECT_EQ(ReadText("checkpoint"), SerializeCheckpointState(ExampleState()));
}

TEST_F(CheckpointStateTest, WriteLeavesNoTemporaryOnSuccess) {
  ASSERT_TRUE(WriteCheckpointState(*faulty_, dir_, ExampleState()).ok());
  EXPECT_THAT(Entries(), UnorderedElementsAre("checkpoint"));
  EXPECT_EQ(faulty_->count("sync_dir"), 1);
}

TEST_F(CheckpointStateTest, WriteUsesTheGivenStateFileName) {
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, ExampleState(), "latest").ok());
  EXPECT_THAT(Entries(), UnorderedElementsAre("latest"));
  Result<CheckpointState> read = ReadCheckpointState(*posix_, dir_, "latest");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ExpectSameState(*read, ExampleState());
}

TEST_F(CheckpointStateTest, FailedRenameLeavesOldFileIntactAndNoTemporary) {
  WriteText("checkpoint", "model_checkpoint_path: \"old\"\n");
  faulty_->set_fault(
      [](const std::string& op, const std::string&) { return op == "rename" ? EIO : 0; });
  const Status status = WriteCheckpointState(*faulty_, dir_, ExampleState());
  EXPECT_EQ(status.code(), StatusCode::kIOError);
  EXPECT_EQ(ReadText("checkpoint"), "model_checkpoint_path: \"old\"\n");
  EXPECT_THAT(Entries(), UnorderedElementsAre("checkpoint"));
}

TEST_F(CheckpointStateTest, FailedOpenLeavesOldFileIntact) {
  WriteText("checkpoint", "model_checkpoint_path: \"old\"\n");
  faulty_->set_fault(
      [](const std::string& op, const std::string&) { return op == "open" ? ENOSPC : 0; });
  EXPECT_FALSE(WriteCheckpointState(*faulty_, dir_, ExampleState()).ok());
  EXPECT_EQ(ReadText("checkpoint"), "model_checkpoint_path: \"old\"\n");
  EXPECT_THAT(Entries(), UnorderedElementsAre("checkpoint"));
}

TEST_F(CheckpointStateTest, FailedSyncOfTheTemporaryLeavesOldFileIntact) {
  WriteText("checkpoint", "model_checkpoint_path: \"old\"\n");
  io::FaultInjectionFileSystem injected(posix_.get());
  injected.fail_ops_matching("checkpoint.tmp-", EIO, io::FaultOp::kSync);
  EXPECT_EQ(WriteCheckpointState(injected, dir_, ExampleState()).code(), StatusCode::kIOError);
  EXPECT_EQ(ReadText("checkpoint"), "model_checkpoint_path: \"old\"\n");
  EXPECT_THAT(Entries(), UnorderedElementsAre("checkpoint"));
}

TEST_F(CheckpointStateTest, CrashAtAnyPointOfAWriteLeavesOldOrNewState) {
  const std::string old_text = "model_checkpoint_path: \"old\"\n";
  const std::string new_text = SerializeCheckpointState(ExampleState());
  for (uint64_t n = 1;; ++n) {
    SCOPED_TRACE("crash at operation " + std::to_string(n));
    WriteText("checkpoint", old_text);
    io::FaultInjectionFileSystem injected(posix_.get());
    injected.fail_after(n, EIO);
    const bool finished = WriteCheckpointState(injected, dir_, ExampleState()).ok();
    ASSERT_TRUE(injected.drop_unsynced_data().ok());
    const std::string text = ReadText("checkpoint");
    EXPECT_TRUE(text == old_text || text == new_text) << text;
    if (finished) {
      EXPECT_EQ(text, new_text);
      break;
    }
    for (const std::string& name : Entries()) {  // a leftover may only be our temporary
      EXPECT_TRUE(name == "checkpoint" || name.rfind("checkpoint.tmp-", 0) == 0) << name;
    }
    ASSERT_LT(n, 20u) << "the write never finished";
  }
}

TEST_F(CheckpointStateTest, WriteRefusesAnInvalidState) {
  CheckpointState state = ExampleState();
  state.model_checkpoint_path = "model.ckpt-1000";
  EXPECT_EQ(WriteCheckpointState(*posix_, dir_, state).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Entries().empty());
}

TEST_F(CheckpointStateTest, MissingStateFileIsNotFound) {
  Result<CheckpointState> read = ReadCheckpointState(*posix_, dir_, "checkpoint");
  EXPECT_EQ(read.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(GetCheckpointState(dir_).status().code(), StatusCode::kNotFound);
}

TEST_F(CheckpointStateTest, OversizedStateFileIsCorruption) {
  WriteText("checkpoint", "");
  fs::resize_file(Path("checkpoint"), kMaxCheckpointStateFileBytes + 1);
  Result<CheckpointState> read = GetCheckpointState(dir_);
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(read.status().message(), HasSubstr(Path("checkpoint")));
}

TEST_F(CheckpointStateTest, CorruptStateFileNamesFileAndLine) {
  WriteText("checkpoint", "model_checkpoint_path: \"a\"\nbogus: 1\n");
  Result<CheckpointState> read = GetCheckpointState(dir_);
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(read.status().message(), HasSubstr(Path("checkpoint") + ":2: unknown field"));
}

// ---- LatestCheckpoint ---------------------------------------------------------------------------

TEST_F(CheckpointStateTest, LatestCheckpointIsTheModelPathInTheDirectory) {
  MakeCheckpointDir("model.ckpt-1000");
  MakeCheckpointDir("model.ckpt-2000");
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, ExampleState()).ok());
  Result<std::string> latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(*latest, dir_ + "/model.ckpt-2000");
}

TEST_F(CheckpointStateTest, LatestCheckpointNotFoundCases) {
  Result<std::string> missing_dir = LatestCheckpoint(dir_ + "/nope");
  EXPECT_EQ(missing_dir.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing_dir.status().message(), HasSubstr(dir_ + "/nope does not exist"));

  EXPECT_EQ(LatestCheckpoint(dir_).status().code(), StatusCode::kNotFound);

  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, CheckpointState{}).ok());
  Result<std::string> names_nothing = LatestCheckpoint(dir_);
  EXPECT_EQ(names_nothing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(names_nothing.status().message(), HasSubstr("names no checkpoint"));

  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, ExampleState()).ok());
  Result<std::string> gone = LatestCheckpoint(dir_);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(gone.status().message(), HasSubstr("model.ckpt-2000"));
}

TEST_F(CheckpointStateTest, LatestCheckpointCorruptStateIsCorruption) {
  WriteText("checkpoint", "model_checkpoint_path: \"../escape\"\n");
  EXPECT_EQ(LatestCheckpoint(dir_).status().code(), StatusCode::kCorruption);
}

// ---- commit helpers -----------------------------------------------------------------------------

TEST(TempDirNameTest, AppendsSixteenRandomHexDigits) {
  const std::string a = TempDirName("model.ckpt-10");
  const std::string b = TempDirName("model.ckpt-10");
  const std::string prefix = "model.ckpt-10.tmp-";
  for (const std::string& name : {a, b}) {
    ASSERT_EQ(name.size(), prefix.size() + 16) << name;
    EXPECT_EQ(name.substr(0, prefix.size()), prefix);
    EXPECT_EQ(name.find_first_not_of("0123456789abcdef", prefix.size()), std::string::npos) << name;
  }
  EXPECT_NE(a, b);
}

TEST_F(CheckpointStateTest, CommitDirectoryRenamesIntoPlace) {
  const std::string tmp = TempDirName("model.ckpt-1");
  MakeCheckpointDir(tmp, "new");
  ASSERT_TRUE(CommitDirectory(*faulty_, dir_, tmp, "model.ckpt-1").ok());
  EXPECT_THAT(Entries(), UnorderedElementsAre("model.ckpt-1"));
  EXPECT_EQ(ReadText("model.ckpt-1/index"), "new");
  EXPECT_THAT(faulty_->ops(),
              ElementsAre("sync_dir " + Path(tmp), "rename " + Path(tmp), "sync_dir " + dir_));
}

TEST_F(CheckpointStateTest, CommitDirectoryReplacesExistingFinalAtomically) {
  MakeCheckpointDir("model.ckpt-1", "old");
  const std::string tmp = TempDirName("model.ckpt-1");
  MakeCheckpointDir(tmp, "new");
  ASSERT_TRUE(CommitDirectory(*faulty_, dir_, tmp, "model.ckpt-1").ok());
  EXPECT_THAT(Entries(), UnorderedElementsAre("model.ckpt-1"));
  EXPECT_EQ(ReadText("model.ckpt-1/index"), "new");
  // The old copy leaves for a ".deleting-" name, and the swap and that rename are made durable
  // before it is removed.
  const std::vector<std::string> ops = faulty_->ops();
  ASSERT_EQ(ops.size(), 5u);
  EXPECT_EQ(ops[0], "sync_dir " + Path(tmp));
  EXPECT_EQ(ops[1], "exchange " + Path(tmp));
  EXPECT_EQ(ops[2], "rename " + Path(tmp));
  EXPECT_EQ(ops[3], "sync_dir " + dir_);
  EXPECT_THAT(ops[4], HasSubstr("remove_tree " + Path("model.ckpt-1.deleting-")));
}

TEST_F(CheckpointStateTest, CommitDirectoryFallsBackWhenExchangeIsUnsupported) {
  MakeCheckpointDir("model.ckpt-1", "old");
  const std::string tmp = TempDirName("model.ckpt-1");
  MakeCheckpointDir(tmp, "new");
  faulty_->set_fault(
      [](const std::string& op, const std::string&) { return op == "exchange" ? ENOSYS : 0; });
  ASSERT_TRUE(CommitDirectory(*faulty_, dir_, tmp, "model.ckpt-1").ok());
  EXPECT_THAT(Entries(), UnorderedElementsAre("model.ckpt-1"));
  EXPECT_EQ(ReadText("model.ckpt-1/index"), "new");
  const std::vector<std::string> ops = faulty_->ops();
  ASSERT_EQ(ops.size(), 6u);
  EXPECT_EQ(ops[2], "rename " + Path("model.ckpt-1"));
  EXPECT_EQ(ops[3], "rename " + Path(tmp));
  EXPECT_EQ(ops[4], "sync_dir " + dir_);
  EXPECT_THAT(ops[5], HasSubstr("remove_tree " + Path("model.ckpt-1.deleting-")));
}

TEST_F(CheckpointStateTest, CommitDirectoryFallbackRestoresOldCopyWhenSecondRenameFails) {
  MakeCheckpointDir("model.ckpt-1", "old");
  const std::string tmp = TempDirName("model.ckpt-1");
  MakeCheckpointDir(tmp, "new");
  const std::string tmp_path = Path(tmp);
  faulty_->set_fault([tmp_path](const std::string& op, const std::string& path) {
    if (op == "exchange") return EINVAL;
    return op == "rename" && path == tmp_path ? EIO : 0;
  });
  EXPECT_EQ(CommitDirectory(*faulty_, dir_, tmp, "model.ckpt-1").code(), StatusCode::kIOError);
  EXPECT_EQ(ReadText("model.ckpt-1/index"), "old");
  EXPECT_THAT(Entries(), UnorderedElementsAre("model.ckpt-1", tmp));
}

TEST_F(CheckpointStateTest, CommitDirectoryReportsAFailedSwap) {
  MakeCheckpointDir("model.ckpt-1", "old");
  const std::string tmp = TempDirName("model.ckpt-1");
  MakeCheckpointDir(tmp, "new");
  faulty_->set_fault(
      [](const std::string& op, const std::string&) { return op == "exchange" ? EIO : 0; });
  EXPECT_EQ(CommitDirectory(*faulty_, dir_, tmp, "model.ckpt-1").code(), StatusCode::kIOError);
  EXPECT_EQ(ReadText("model.ckpt-1/index"), "old");
}

TEST_F(CheckpointStateTest, CommitDirectoryRefusesNamesThatArePaths) {
  EXPECT_EQ(CommitDirectory(*posix_, dir_, "../x", "y").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CommitDirectory(*posix_, dir_, "x", "a/y").code(), StatusCode::kInvalidArgument);
}

// ---- retention ----------------------------------------------------------------------------------

TEST_F(CheckpointStateTest, MaxToKeepThreeKeepsNewestThree) {
  auto manager = NewManager(3);
  for (int step = 1; step <= 10; ++step) Commit(*manager, step, 100.0 * step);
  const std::vector<std::string> newest = {Name(8), Name(9), Name(10)};
  EXPECT_EQ(manager->retained(), newest);
  EXPECT_EQ(CheckpointDirs(), std::set<std::string>(newest.begin(), newest.end()));
  const CheckpointState state = ReadState();
  EXPECT_EQ(state.model_checkpoint_path, Name(10));
  EXPECT_EQ(state.all_model_checkpoint_paths, newest);
  EXPECT_THAT(state.all_model_checkpoint_timestamps, ElementsAre(800.0, 900.0, 1000.0));
  ExpectSameState(manager->state(), state);
  EXPECT_THAT(Entries(), UnorderedElementsAre("checkpoint", Name(8), Name(9), Name(10)));
}

TEST_F(CheckpointStateTest, MaxToKeepZeroKeepsAll) {
  auto manager = NewManager(0);
  std::vector<std::string> all;
  for (int step = 1; step <= 10; ++step) {
    Commit(*manager, step, step);
    all.push_back(Name(step));
  }
  EXPECT_EQ(manager->retained(), all);
  EXPECT_EQ(ReadState().all_model_checkpoint_paths, all);
  EXPECT_EQ(CheckpointDirs().size(), 10u);
  EXPECT_EQ(faulty_->count("remove_tree"), 0);
}

TEST_F(CheckpointStateTest, StateIsWrittenBeforeAnythingIsDeleted) {
  auto manager = NewManager(1);
  Commit(*manager, 1, 1);
  Commit(*manager, 2, 2);
  const std::vector<std::string> ops = faulty_->ops();
  ASSERT_GE(ops.size(), 4u);
  // The state file's rename is synced; only then does the dropped checkpoint leave its name
  // (synced again) and get removed under the new one.
  EXPECT_EQ(ops[ops.size() - 4], "sync_dir " + dir_);
  EXPECT_EQ(ops[ops.size() - 3], "rename " + Path(Name(1)));
  EXPECT_EQ(ops[ops.size() - 2], "sync_dir " + dir_);
  EXPECT_THAT(ops.back(), HasSubstr("remove_tree " + Path(Name(1) + ".deleting-")));
}

TEST_F(CheckpointStateTest, KeepEveryNHoursPreservesWhatTensorFlowWould) {
  // One hour, commits every 1000 s from a clock that read 0 at construction: the first
  // checkpoint at or after 3600 s is preserved (4000), then at or after 7200 (8000), 10800
  // (11000), 14400 (15000), 18000 (18000, the boundary counts). 19 and 20 stay listed.
  now_ = 0;
  auto manager = NewManager(2, 1.0);
  for (int step = 1; step <= 20; ++step) Commit(*manager, step, 1000.0 * step);
  EXPECT_THAT(manager->retained(), ElementsAre(Name(19), Name(20)));
  EXPECT_EQ(CheckpointDirs(), (std::set<std::string>{Name(4), Name(8), Name(11), Name(15), Name(18),
                                                     Name(19), Name(20)}));
  const CheckpointState state = ReadState();
  EXPECT_THAT(state.all_model_checkpoint_paths, ElementsAre(Name(19), Name(20)));
  EXPECT_EQ(state.last_preserved_timestamp, 18000.0);
}

TEST_F(CheckpointStateTest, KeepEveryNHoursMatchesASimulationOfTheSaver) {
  // Irregular commit times; the expectation is computed by replaying TF Saver's rules on
  // plain containers: the checkpoint that falls out of a max_to_keep list is preserved when
  // its time reached the next preservation time, which then moves on by the period.
  const double hours = 0.5;
  const int max_to_keep = 3;
  now_ = 500;
  auto manager = NewManager(max_to_keep, hours);
  std::vector<double> times;
  double t = 1000;
  for (int step = 0; step < 40; ++step) {
    t += 100 + (step * 7919) % 900;  // 100..999 s apart
    times.push_back(t);
  }
  std::set<std::string> expected_on_disk;
  double next = 500 + hours * 3600;
  for (size_t i = 0; i + max_to_keep < times.size(); ++i) {
    if (times[i] >= next) {
      expected_on_disk.insert(Name(static_cast<int>(i)));
      next += hours * 3600;
    }
  }
  for (size_t i = times.size() - max_to_keep; i < times.size(); ++i) {
    expected_on_disk.insert(Name(static_cast<int>(i)));
  }
  for (size_t i = 0; i < times.size(); ++i) Commit(*manager, static_cast<int>(i), times[i]);
  EXPECT_EQ(CheckpointDirs(), expected_on_disk);
  EXPECT_GT(expected_on_disk.size(), static_cast<size_t>(max_to_keep) + 2);
}

TEST_F(CheckpointStateTest, RecommitOfTheSameNameMovesItToTheEnd) {
  auto manager = NewManager(3);
  Commit(*manager, 1, 1);
  Commit(*manager, 2, 2);
  Commit(*manager, 3, 3);
  Commit(*manager, 1, 4);
  EXPECT_THAT(manager->retained(), ElementsAre(Name(2), Name(3), Name(1)));
  Commit(*manager, 4, 5);
  EXPECT_THAT(manager->retained(), ElementsAre(Name(3), Name(1), Name(4)));
  EXPECT_EQ(CheckpointDirs(), (std::set<std::string>{Name(1), Name(3), Name(4)}));
  const CheckpointState state = ReadState();
  EXPECT_THAT(state.all_model_checkpoint_timestamps, ElementsAre(3.0, 4.0, 5.0));
}

TEST_F(CheckpointStateTest, RecordCommittedRefusesABadName) {
  auto manager = NewManager(3);
  EXPECT_EQ(manager->RecordCommitted("../x", 1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(manager->retained().empty());
  EXPECT_TRUE(Entries().empty());
}

TEST_F(CheckpointStateTest, FailedStateWriteDeletesNothingAndNextWriteCatchesUp) {
  auto manager = NewManager(1);
  Commit(*manager, 1, 1);
  MakeCheckpointDir(Name(2));
  faulty_->set_fault(
      [](const std::string& op, const std::string&) { return op == "rename" ? EIO : 0; });
  EXPECT_FALSE(manager->RecordCommitted(Name(2), 2).ok());
  EXPECT_EQ(ReadState().model_checkpoint_path, Name(1));
  EXPECT_EQ(CheckpointDirs(), (std::set<std::string>{Name(1), Name(2)}));
  faulty_->set_fault(nullptr);
  Commit(*manager, 3, 3);
  EXPECT_THAT(ReadState().all_model_checkpoint_paths, ElementsAre(Name(3)));
  EXPECT_EQ(CheckpointDirs(), (std::set<std::string>{Name(3)}));
}

TEST_F(CheckpointStateTest, RecommitAfterAFailedStateWriteKeepsTheCheckpoint) {
  auto manager = NewManager(1);
  Commit(*manager, 1, 1);
  MakeCheckpointDir(Name(2));
  faulty_->set_fault(
      [](const std::string& op, const std::string&) { return op == "rename" ? EIO : 0; });
  EXPECT_FALSE(manager->RecordCommitted(Name(2), 2).ok());  // 1 dropped, not yet deleted
  faulty_->set_fault(nullptr);
  Commit(*manager, 1, 3);  // 1 saved again: 2 falls out instead
  EXPECT_THAT(ReadState().all_model_checkpoint_paths, ElementsAre(Name(1)));
  EXPECT_EQ(CheckpointDirs(), (std::set<std::string>{Name(1)}));
}

// Finding 7: a committed save whose retention cannot delete an old checkpoint is a committed
// save. Before, RecordCommitted returned the EACCES and the save was reported failed.
TEST_F(CheckpointStateTest, RetentionFailureIsLoggedAndCountedNotReturned) {
  auto manager = NewManager(1);
  Commit(*manager, 1, 1);
  MakeCheckpointDir(Name(2));
  faulty_->set_fault(
      [](const std::string& op, const std::string&) { return op == "remove_tree" ? EACCES : 0; });
  std::vector<std::string> logged;
  auto previous = SetLogSink([&](std::string_view line) { logged.emplace_back(line); });
  const Status status = manager->RecordCommitted(Name(2), 2);
  SetLogSink(std::move(previous));
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(manager->retention_failures(), 1);
  EXPECT_THAT(ReadState().all_model_checkpoint_paths, ElementsAre(Name(2)));
  ASSERT_FALSE(logged.empty());
  EXPECT_THAT(logged.back(), HasSubstr("could not remove " + Path(Name(1))));
  EXPECT_THAT(logged.back(), HasSubstr(std::strerror(EACCES)));
  // Nothing half-deleted is left under the committed name; the leftover goes at the next start,
  // which does not fail while it still cannot remove it.
  EXPECT_EQ(CommittedLooking(), (std::set<std::string>{Name(2)}));
  auto restarted = NewManager(1);
  Result<StartupReport> report = restarted->Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->failures.size(), 1u);
  faulty_->set_fault(nullptr);
  report = NewManager(1)->Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->failures.empty());
  EXPECT_THAT(Entries(), UnorderedElementsAre("checkpoint", Name(2)));
}

TEST_F(CheckpointStateTest, CrashAtAnyPointOfACommitNeverNamesADeletedCheckpoint) {
  for (uint64_t n = 1;; ++n) {
    SCOPED_TRACE("crash at operation " + std::to_string(n));
    TearDown();
    SetUp();
    io::FaultInjectionFileSystem injected(posix_.get());
    {
      CheckpointManager manager(&injected, dir_, kBasename, 2, 0, [] { return 0.0; });
      for (int step = 1; step <= 3; ++step) {
        MakeCheckpointDir(Name(step));
        if (step == 3) injected.fail_after(n, EIO);
        if (!manager.RecordCommitted(Name(step), step).ok()) break;
      }
    }
    ASSERT_TRUE(injected.drop_unsynced_data().ok());
    const CheckpointState state = ReadState();
    for (const std::string& name : state.all_model_checkpoint_paths) {
      EXPECT_TRUE(fs::is_directory(Path(name))) << name << " is named but gone";
    }
    if (injected.operation_count() < n) {  // the commit of step 3 ran to the end
      EXPECT_THAT(state.all_model_checkpoint_paths, ElementsAre(Name(2), Name(3)));
      EXPECT_EQ(CheckpointDirs(), (std::set<std::string>{Name(2), Name(3)}));
      break;
    }
    ASSERT_LT(n, 20u) << "the commit never finished";
  }
}

// ---- recovery -----------------------------------------------------------------------------------

TEST_F(CheckpointStateTest, StartContinuesRetentionAndDropsMissingDirectories) {
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

TEST_F(CheckpointStateTest, StartRewritesNothingWhenNothingChanged) {
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

TEST_F(CheckpointStateTest, StartWithoutStateFileStartsEmpty) {
  auto manager = NewManager(3);
  ASSERT_TRUE(manager->Start().ok());
  EXPECT_TRUE(manager->retained().empty());
  EXPECT_TRUE(Entries().empty());
}

TEST_F(CheckpointStateTest, StartKeepsLastPreservedTimestamp) {
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
TEST_F(CheckpointStateTest, StartRebuildsACorruptStateFileFromTheDirectory) {
  MakeCheckpointDir(Name(1));
  MakeCheckpointDir(Name(2));
  MakeCheckpointDir(Name(3));
  const std::string corrupt = "model_checkpoint_path: \"" + Name(3) + "\"\ngarbage\n";
  WriteText("checkpoint", corrupt);
  auto manager = NewManager(2);
  std::vector<std::string> logged;
  auto previous = SetLogSink([&](std::string_view line) { logged.emplace_back(line); });
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

TEST_F(CheckpointStateTest, StartRemovesOnlyOurTemporariesAndDeletions) {
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

TEST_F(CheckpointStateTest, StartLogsAndReportsAFailedRemovalButDoesNotFail) {
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

// ---- pinning ------------------------------------------------------------------------------------

TEST_F(CheckpointStateTest, PinnedCheckpointIsDeletedOnlyWhenUnpinned) {
  auto manager = NewManager(1);
  Commit(*manager, 1, 1);
  manager->Pin(Name(1));
  manager->Pin(Name(1));
  Commit(*manager, 2, 2);
  EXPECT_THAT(ReadState().all_model_checkpoint_paths, ElementsAre(Name(2)));
  EXPECT_TRUE(fs::is_directory(Path(Name(1))));
  manager->Unpin(Name(1));
  EXPECT_TRUE(fs::is_directory(Path(Name(1))));
  manager->Unpin(Name(1));
  EXPECT_FALSE(fs::exists(Path(Name(1))));
  EXPECT_EQ(CheckpointDirs(), (std::set<std::string>{Name(2)}));
}

TEST_F(CheckpointStateTest, UnpinOfARetainedCheckpointDeletesNothing) {
  auto manager = NewManager(2);
  Commit(*manager, 1, 1);
  manager->Pin(Name(1));
  manager->Unpin(Name(1));
  std::vector<std::string> logged;
  auto previous = SetLogSink([&](std::string_view line) { logged.emplace_back(line); });
  manager->Unpin(Name(1));  // unbalanced: logged and ignored
  SetLogSink(std::move(previous));
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_THAT(logged[0], HasSubstr(Name(1) + " in " + dir_ + " that is not pinned"));
  EXPECT_TRUE(fs::is_directory(Path(Name(1))));
  EXPECT_EQ(faulty_->count("remove_tree"), 0);
}

TEST_F(CheckpointStateTest, RecommitCancelsADeferredDeletion) {
  auto manager = NewManager(1);
  Commit(*manager, 1, 1);
  manager->Pin(Name(1));
  Commit(*manager, 2, 2);  // drops 1, deferred by the pin
  Commit(*manager, 1, 3);  // 1 saved again: live, and 2 is deleted
  manager->Unpin(Name(1));
  EXPECT_TRUE(fs::is_directory(Path(Name(1))));
  EXPECT_THAT(ReadState().all_model_checkpoint_paths, ElementsAre(Name(1)));
  EXPECT_EQ(CheckpointDirs(), (std::set<std::string>{Name(1)}));
}

TEST_F(CheckpointStateTest, ConcurrentPinsAndCommitsNeverLoseAPinnedCheckpoint) {
  auto manager = NewManager(2);
  constexpr int kCommits = 150;
  std::atomic<bool> done{false};
  std::atomic<int> violations{0};
  std::atomic<int> checks{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&] {
      while (!done.load()) {
        const std::vector<std::string> retained = manager->retained();
        if (retained.empty()) continue;
        // The oldest is the next to fall out: hold it across commits.
        const std::string name = retained.front();
        manager->Pin(name);
        const std::vector<std::string> now = manager->retained();
        // Still listed after the pin: it must survive until the Unpin.
        if (std::find(now.begin(), now.end(), name) != now.end()) {
          std::this_thread::sleep_for(std::chrono::microseconds(500));
          if (!fs::exists(Path(name) + "/index")) violations.fetch_add(1);
          checks.fetch_add(1);
        }
        manager->Unpin(name);
      }
    });
  }
  for (int step = 1; step <= kCommits; ++step) {
    MakeCheckpointDir(Name(step));
    const Status status = manager->RecordCommitted(Name(step), step);
    EXPECT_TRUE(status.ok()) << status.ToString();
  }
  done.store(true);
  for (std::thread& reader : readers) reader.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_GT(checks.load(), 0);
  EXPECT_THAT(manager->retained(), ElementsAre(Name(kCommits - 1), Name(kCommits)));
  EXPECT_EQ(CheckpointDirs(), (std::set<std::string>{Name(kCommits - 1), Name(kCommits)}));
}

// ---- what an entry is ---------------------------------------------------------------------------

// The manager decides what it may touch by io::FileSystem::entry_type, which must not follow a
// symlink (lstat).
TEST_F(CheckpointStateTest, EntryTypeSeesSymlinksAndSpecialFilesAsThemselves) {
  MakeCheckpointDir("dir");
  fs::create_directory_symlink(Path("dir"), Path("link"));
  fs::create_symlink(Path("nowhere"), Path("dangling"));
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  const std::vector<std::pair<std::string, io::EntryType>> expected = {
      {"dir", io::EntryType::kDirectory},   {"dir/index", io::EntryType::kFile},
      {"link", io::EntryType::kSymlink},    {"dangling", io::EntryType::kSymlink},
      {"fifo", io::EntryType::kFifo},       {"missing", io::EntryType::kNone},
      {"dir/index/x", io::EntryType::kNone}};
  for (const auto& [name, type] : expected) {
    io::EntryType seen = io::EntryType::kFile;
    ASSERT_TRUE(faulty_->entry_type(Path(name), &seen).ok()) << name;
    EXPECT_EQ(seen, type) << name;
  }
}

// ---- names --------------------------------------------------------------------------------------

TEST(CheckpointStepTest, AcceptsExactlyWhatCheckpointDirNameWrites) {
  EXPECT_EQ(CheckpointStep("model.ckpt-0", "model.ckpt"), 0);
  EXPECT_EQ(CheckpointStep("model.ckpt-1200", "model.ckpt"), 1200);
  EXPECT_EQ(CheckpointStep("model.ckpt-9223372036854775807", "model.ckpt"), INT64_MAX);
  for (const char* name :
       {"model.ckpt-", "model.ckpt-01", "model.ckpt--1", "model.ckpt-+1", "model.ckpt-1a",
        "model.ckpt-1.tmp-01", "model.ckpt-1.deleting-01", "model.ckpt1", "xmodel.ckpt-1",
        "input.ckpt-1", "model.ckpt-9223372036854775808", "my-notes"}) {
    EXPECT_FALSE(CheckpointStep(name, "model.ckpt").has_value()) << name;
  }
}

TEST(DeletingDirNameTest, AppendsSixteenRandomHexDigits) {
  const std::string name = DeletingDirName("model.ckpt-10");
  const std::string prefix = "model.ckpt-10.deleting-";
  ASSERT_EQ(name.size(), prefix.size() + 16) << name;
  EXPECT_EQ(name.substr(0, prefix.size()), prefix);
  EXPECT_EQ(name.find_first_not_of("0123456789abcdef", prefix.size()), std::string::npos);
}

// ---- crash-safe retention -----------------------------------------------------------------------

// remove_tree removes one file of the tree and then "crashes" (EIO), as a kill in the middle of
// an rm -rf would.
class HalfRemovingFileSystem final : public io::FileSystemWrapper {
 public:
  using FileSystemWrapper::FileSystemWrapper;
  io::IoStatus remove_tree(const std::string& path) override {
    std::vector<std::string> names;
    if (target()->list_dir(path, &names).ok() && !names.empty()) {
      std::sort(names.begin(), names.end());
      (void)target()->remove_file(path + "/" + names.front());
    }
    return io::IoStatus(EIO, "remove tree " + path + ": interrupted (test)");
  }
};

// Finding 1: a retention deletion interrupted half way left a directory under the committed
// name, unlisted and incomplete, forever. Now it is renamed out of the namespace first, and the
// next start removes what is left.
TEST_F(CheckpointStateTest, RetentionInterruptedMidRemovalLeavesNoCommittedDebris) {
  HalfRemovingFileSystem half(posix_.get());
  {
    CheckpointManager manager(&half, dir_, kBasename, 1, 0, [] { return 0.0; });
    MakeFullCheckpointDir(Name(1));
    ASSERT_TRUE(manager.RecordCommitted(Name(1), 1).ok());
    MakeFullCheckpointDir(Name(2));
    ASSERT_TRUE(manager.RecordCommitted(Name(2), 2).ok());
    EXPECT_EQ(manager.retention_failures(), 1);
  }
  EXPECT_EQ(CommittedLooking(), (std::set<std::string>{Name(2)}));
  auto restarted = NewManager(1);
  ASSERT_TRUE(restarted->Start().ok());
  EXPECT_THAT(Entries(), UnorderedElementsAre("checkpoint", Name(2)));
}

TEST_F(CheckpointStateTest, CrashAtAnyPointOfRetentionLeavesNoDebrisAfterTheNextStart) {
  for (uint64_t n = 1;; ++n) {
    SCOPED_TRACE("crash at operation " + std::to_string(n));
    TearDown();
    SetUp();
    io::FaultInjectionFileSystem injected(posix_.get());
    uint64_t before = 0;
    {
      CheckpointManager manager(&injected, dir_, kBasename, 1, 0, [] { return 0.0; });
      for (int step = 1; step <= 3; ++step) {
        MakeFullCheckpointDir(Name(step));
        if (step == 3) {
          before = injected.operation_count();
          injected.fail_after(n, EIO);
        }
        (void)manager.RecordCommitted(Name(step), step);
      }
    }
    const bool finished = injected.operation_count() - before < n;
    ASSERT_TRUE(injected.drop_unsynced_data().ok());
    ASSERT_TRUE(NewManager(1)->Start().ok());
    const CheckpointState state = ReadState();
    const std::set<std::string> listed(state.all_model_checkpoint_paths.begin(),
                                       state.all_model_checkpoint_paths.end());
    EXPECT_EQ(CommittedLooking(), listed);
    EXPECT_TRUE(Leftovers().empty()) << *Leftovers().begin();
    EXPECT_TRUE(listed.contains(Name(3)) || listed.contains(Name(2)));
    if (finished) {
      EXPECT_EQ(listed, (std::set<std::string>{Name(3)}));
      break;
    }
    ASSERT_LT(n, 20u) << "the commit never finished";
  }
}

// Finding 4: a state file naming a user's directory got it deleted by retention.
TEST_F(CheckpointStateTest, StateFileNamingAUsersDirectoryNeverGetsItDeleted) {
  fs::create_directory(Path("my-notes"));
  std::ofstream(Path("my-notes/todo.txt")) << "mine";
  MakeCheckpointDir(Name(1));
  CheckpointState state;
  state.all_model_checkpoint_paths = {"my-notes", Name(1)};
  state.all_model_checkpoint_timestamps = {1, 2};
  state.model_checkpoint_path = Name(1);
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());
  auto manager = NewManager(1);
  Result<StartupReport> report = manager->Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_THAT(report->dropped, ElementsAre("my-notes"));
  Commit(*manager, 2, 3);
  Commit(*manager, 3, 4);
  EXPECT_EQ(ReadText("my-notes/todo.txt"), "mine");
  EXPECT_THAT(ReadState().all_model_checkpoint_paths, ElementsAre(Name(3)));
}

TEST_F(CheckpointStateTest, RetentionNeverDeletesADirectoryWithoutAnIndex) {
  auto manager = NewManager(1);
  Commit(*manager, 1, 1);
  fs::remove(Path(Name(1) + "/index"));  // not what this library wrote any more
  std::ofstream(Path(Name(1) + "/notes")) << "mine";
  Commit(*manager, 2, 2);
  EXPECT_EQ(ReadText(Name(1) + "/notes"), "mine");
  EXPECT_EQ(manager->retention_failures(), 0);
}

class CheckpointSymlinkTest : public CheckpointStateTest {
 protected:
  void SetUp() override {
    CheckpointStateTest::SetUp();
    std::string pattern = (fs::path(::testing::TempDir()) / "outside_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    outside_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(outside_, ignored);
    CheckpointStateTest::TearDown();
  }
  std::string outside_;
};

TEST_F(CheckpointSymlinkTest, SymlinkNamedLikeACheckpointIsNeverFollowedNorRemoved) {
  fs::create_directory(outside_ + "/complete");
  std::ofstream(outside_ + "/complete/index") << "index";
  std::ofstream(outside_ + "/complete/precious") << "mine";
  fs::create_directory(outside_ + "/incomplete");
  std::ofstream(outside_ + "/incomplete/precious") << "mine";
  fs::create_directory_symlink(outside_ + "/complete", Path(Name(1)));    // listed
  fs::create_directory_symlink(outside_ + "/incomplete", Path(Name(7)));  // unlisted
  fs::create_directory_symlink(outside_ + "/complete", Path(Name(9)));    // unlisted, "newer"
  MakeCheckpointDir(Name(2));
  CheckpointState state;
  state.all_model_checkpoint_paths = {Name(1), Name(2)};
  state.all_model_checkpoint_timestamps = {1, 2};
  state.model_checkpoint_path = Name(2);
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());

  auto manager = NewManager(1);
  Result<StartupReport> report = manager->Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_THAT(report->dropped, ElementsAre(Name(1)));
  EXPECT_THAT(manager->retained(), ElementsAre(Name(2)));
  Commit(*manager, 3, 3);
  Commit(*manager, 4, 4);
  for (int step : {1, 7, 9}) EXPECT_TRUE(fs::is_symlink(Path(Name(step)))) << step;
  EXPECT_EQ(ReadText(Name(1) + "/precious"), "mine");
  EXPECT_EQ(ReadText(Name(7) + "/precious"), "mine");
  EXPECT_THAT(ReadState().all_model_checkpoint_paths, ElementsAre(Name(4)));
  EXPECT_EQ(CheckpointDirs(), (std::set<std::string>{Name(1), Name(4), Name(7), Name(9)}));
}

TEST_F(CheckpointStateTest, StateFileThatIsNotARegularFileIsCorruptionNotABlockingRead) {
  ASSERT_EQ(::mkfifo(Path("checkpoint").c_str(), 0600), 0);
  Result<CheckpointState> read = GetCheckpointState(dir_);
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(read.status().message(), HasSubstr("not a regular file"));
  MakeCheckpointDir(Name(1));
  auto manager = NewManager(2);
  ASSERT_TRUE(manager->Start().ok());
  EXPECT_THAT(ReadState().all_model_checkpoint_paths, ElementsAre(Name(1)));
}

// ---- start-up recovery --------------------------------------------------------------------------

TEST_F(CheckpointStateTest, FreshDirectoryStartsEmptyAndSilently) {
  std::vector<std::string> logged;
  auto previous = SetLogSink([&](std::string_view line) { logged.emplace_back(line); });
  Result<StartupReport> report = NewManager(3)->Start();
  SetLogSink(std::move(previous));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(logged.empty()) << logged.front();
  EXPECT_TRUE(Entries().empty());
  EXPECT_TRUE(report->rebuilt_because.empty());
}

// Finding 6a: an empty state file, or one naming only missing checkpoints, made a resume start
// afresh beside intact checkpoints (which retention then deleted).
TEST_F(CheckpointStateTest, EmptyStateFileIsRebuiltFromTheDirectory) {
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

TEST_F(CheckpointStateTest, StateFileNamingOnlyMissingCheckpointsIsRebuiltFromTheDirectory) {
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

TEST_F(CheckpointStateTest, DeletedLatestIsDroppedAndTheRestKept) {
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

// A validator that finds a directory complete when its index reads "complete <wall time>".
CheckpointValidator ContentValidator() {
  return [](const std::string& path) -> Result<ValidCheckpoint> {
    std::ifstream in(path + "/index");
    std::string word;
    double wall_time = 0;
    if (!(in >> word >> wall_time) || word != "complete") {
      return Status::Corruption(path + "/index is not complete");
    }
    return ValidCheckpoint{wall_time};
  };
}

// Finding 7: a directory committed while the state-file update hit ENOSPC was never listed and
// never removed.
TEST_F(CheckpointStateTest, CommittedButUnlistedCheckpointIsListedAgainAtStart) {
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

TEST_F(CheckpointStateTest, UnlistedDirectoriesFollowTheStartupRule) {
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
      EXPECT_EQ(report->removed,
                (std::vector<std::string>{Name(1), Name(2), Name(3), Name(4), Name(7)}));
      EXPECT_EQ(CommittedLooking(), (std::set<std::string>{Name(5), Name(6), Name(8)}));
      for (int step : {2, 3, 4}) MakeCheckpointDir(Name(step), "complete 0");  // again
    } else {
      EXPECT_TRUE(report->removed.empty());
      EXPECT_THAT(report->kept_unlisted, ElementsAre(Name(4), Name(3), Name(2)));
    }
  }
}

TEST_F(CheckpointStateTest, StartFillsAShortListWithTheNewestUnlistedCheckpoints) {
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

TEST_F(CheckpointStateTest, IncompleteListedCheckpointIsRemovedOnlyAfterTheStateIsRewritten) {
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
    EXPECT_TRUE(fs::exists(Path(Name(2)))) << "still named by the state file on disk";
  }
  faulty_->set_fault(nullptr);
  CheckpointManager manager(faulty_.get(), options, [] { return 0.0; });
  Result<StartupReport> report = manager.Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_THAT(report->removed, ElementsAre(Name(2)));
  EXPECT_THAT(ReadState().all_model_checkpoint_paths, ElementsAre(Name(1)));
}

// ---- committed steps for readers ----------------------------------------------------------------

TEST_F(CheckpointStateTest, CommittedStepsComeFromAHealthyStateFile) {
  for (int step : {1, 2, 3}) MakeCheckpointDir(Name(step), "complete 0");
  CheckpointState state;
  state.all_model_checkpoint_paths = {Name(2), Name(3)};
  state.model_checkpoint_path = Name(3);
  ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state).ok());
  Result<std::vector<int64_t>> steps =
      ListCommittedSteps(*posix_, dir_, kBasename, "checkpoint", ContentValidator());
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  EXPECT_THAT(*steps, ElementsAre(2, 3));
}

TEST_F(CheckpointStateTest, CommittedStepsFallBackToTheDirectoryWhenTheStateFileIsBroken) {
  for (int step : {1, 2, 3}) MakeCheckpointDir(Name(step), "complete 0");
  MakeCheckpointDir(Name(4), "torn");
  for (const std::string& text : {std::string(), std::string("garbage\n"),
                                  "model_checkpoint_path: \"" + Name(4) + "\"\n",     // incomplete
                                  "model_checkpoint_path: \"" + Name(9) + "\"\n"}) {  // missing
    SCOPED_TRACE(text);
    WriteText("checkpoint", text);
    Result<std::vector<int64_t>> steps =
        ListCommittedSteps(*posix_, dir_, kBasename, "checkpoint", ContentValidator());
    ASSERT_TRUE(steps.ok()) << steps.status().ToString();
    EXPECT_THAT(*steps, ElementsAre(1, 2, 3));
  }
  fs::remove(Path("checkpoint"));
  EXPECT_THAT(
      ListCommittedSteps(*posix_, dir_, kBasename, "checkpoint", ContentValidator()).value(),
      ElementsAre(1, 2, 3));
  EXPECT_TRUE(
      ListCommittedSteps(*posix_, dir_ + "/none", kBasename, "checkpoint", {}).value().empty());
}

// ---- pairing ------------------------------------------------------------------------------------

constexpr char kInputBasename[] = "input.ckpt";

std::string InputName(int step) { return std::string(kInputBasename) + "-" + std::to_string(step); }

class PairedRetentionTest : public CheckpointStateTest {
 protected:
  void MakeManagers(int max_to_keep) {
    model_ = std::make_unique<CheckpointManager>(
        faulty_.get(),
        CheckpointManagerOptions{.checkpoint_dir = dir_,
                                 .basename = kBasename,
                                 .max_to_keep = max_to_keep,
                                 .partner = {kInputBasename, "checkpoint_input"}},
        [] { return 0.0; });
    input_ = std::make_unique<CheckpointManager>(
        faulty_.get(),
        CheckpointManagerOptions{.checkpoint_dir = dir_,
                                 .basename = kInputBasename,
                                 .state_file_name = "checkpoint_input",
                                 .max_to_keep = max_to_keep,
                                 .partner = {kBasename, "checkpoint"}},
        [] { return 0.0; });
  }
  void CommitModel(int step) { Commit(*model_, step, step); }
  void CommitInput(int step) {
    MakeCheckpointDir(InputName(step));
    const Status status = input_->RecordCommitted(InputName(step), step);
    ASSERT_TRUE(status.ok()) << status.ToString();
  }
  std::set<int> OnDisk(const std::string& basename) const {
    std::set<int> steps;
    for (const std::string& name : Entries()) {
      if (auto step = CheckpointStep(name, basename)) steps.insert(static_cast<int>(*step));
    }
    return steps;
  }
  std::set<int> Pairs() const {
    std::set<int> pairs;
    const std::set<int> input = OnDisk(kInputBasename);
    for (int step : OnDisk(kBasename)) {
      if (input.contains(step)) pairs.insert(step);
    }
    return pairs;
  }

  std::unique_ptr<CheckpointManager> model_;
  std::unique_ptr<CheckpointManager> input_;
};

// Finding 6b: with on_error=continue on a full disk the input checkpoints kept committing, and
// retention deleted the input partners of the only good model checkpoints.
TEST_F(PairedRetentionTest, KeepsInputPartnersWhileTheModelFails) {
  MakeManagers(2);
  for (int step = 1; step <= 3; ++step) {
    CommitModel(step);
    CommitInput(step);
  }
  // The model committed 3 before the input did, so it still holds 1 (its pass saw no input 3).
  ASSERT_EQ(OnDisk(kBasename), (std::set<int>{1, 2, 3}));
  for (int step = 4; step <= 12; ++step) CommitInput(step);  // the model's saves fail
  EXPECT_EQ(OnDisk(kInputBasename), (std::set<int>{2, 3, 11, 12}));
  EXPECT_EQ(input_->retained().size(), 4u);
  EXPECT_EQ(Pairs(), (std::set<int>{2, 3}));
  // Once the model saves again, the old pairs go.
  for (int step = 13; step <= 15; ++step) {
    CommitModel(step);
    CommitInput(step);
  }
  EXPECT_EQ(OnDisk(kBasename), (std::set<int>{13, 14, 15}));
  EXPECT_EQ(OnDisk(kInputBasename), (std::set<int>{14, 15}));
}

TEST_F(PairedRetentionTest, KeepsModelPartnersWhileTheInputFails) {
  MakeManagers(2);
  for (int step = 1; step <= 3; ++step) {
    CommitInput(step);
    CommitModel(step);
  }
  for (int step = 4; step <= 12; ++step) CommitModel(step);
  EXPECT_EQ(OnDisk(kBasename), (std::set<int>{2, 3, 11, 12}));
  EXPECT_EQ(OnDisk(kInputBasename), (std::set<int>{1, 2, 3}));
  EXPECT_EQ(Pairs(), (std::set<int>{2, 3}));
}

TEST_F(PairedRetentionTest, StaysAtMaxToKeepWhenBothSidesSaveTheSameSteps) {
  MakeManagers(3);
  for (int step = 1; step <= 20; ++step) {
    CommitModel(step);
    EXPECT_LE(model_->retained().size(), 4u) << step;
    CommitInput(step);
    EXPECT_LE(input_->retained().size(), 3u) << step;
  }
  EXPECT_EQ(OnDisk(kInputBasename), (std::set<int>{18, 19, 20}));
  EXPECT_EQ(OnDisk(kBasename), (std::set<int>{17, 18, 19, 20}));
}

TEST_F(PairedRetentionTest, NeverLosesTheNewestPairAndStaysBoundedUnderAnyFailurePattern) {
  constexpr int kKeep = 2;
  MakeManagers(kKeep);
  uint64_t seed = 12345;
  const auto next = [&seed] {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>(seed >> 33);
  };
  int newest_pair = -1;
  for (int step = 0; step < 300; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const uint32_t r = next();
    const bool model_ok = (r % 10) < 7;  // each side fails 30% of the time
    const bool input_ok = ((r >> 8) % 10) < 7;
    const bool model_first = (r >> 16) & 1;
    if (model_first && model_ok) CommitModel(step);
    if (input_ok) CommitInput(step);
    if (!model_first && model_ok) CommitModel(step);
    EXPECT_LE(model_->retained().size(), static_cast<size_t>(2 * kKeep));
    EXPECT_LE(input_->retained().size(), static_cast<size_t>(2 * kKeep));
    const std::set<int> pairs = Pairs();
    if (newest_pair >= 0) {
      ASSERT_FALSE(pairs.empty());
      EXPECT_GE(*pairs.rbegin(), newest_pair);
    }
    if (!pairs.empty()) newest_pair = *pairs.rbegin();
  }
  EXPECT_GT(newest_pair, 250);
}

// The input commits the step the model committed one save before, at the same moment as the
// model commits the next: each pass reads the other's state file just as the other rewrites
// it. Unserialized, the model could drop the step the input is pairing while the input drops
// the old pair the model keeps, leaving no complete pair at all.
TEST_F(PairedRetentionTest, ConcurrentPassesNeverLoseTheNewestPair) {
  MakeManagers(1);
  CommitModel(0);
  CommitInput(0);
  CommitModel(1);
  int newest_pair = 0;
  for (int round = 1; round <= 100; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    MakeCheckpointDir(Name(round + 1));
    MakeCheckpointDir(InputName(round));
    std::atomic<int> ready{0};
    auto commit = [&](CheckpointManager& manager, const std::string& name, int step) {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      EXPECT_TRUE(manager.RecordCommitted(name, step).ok());
    };
    std::thread model(commit, std::ref(*model_), Name(round + 1), round + 1);
    std::thread input(commit, std::ref(*input_), InputName(round), round);
    model.join();
    input.join();
    const std::set<int> pairs = Pairs();
    ASSERT_FALSE(pairs.empty());
    EXPECT_GE(*pairs.rbegin(), newest_pair);
    newest_pair = *pairs.rbegin();
  }
}

TEST_F(PairedRetentionTest, StartRelistsAnUnlistedPartnerInsteadOfRemovingIt) {
  MakeManagers(2);
  for (int step = 1; step <= 3; ++step) {
    CommitModel(step);
    CommitInput(step);
  }
  for (int step = 4; step <= 6; ++step) CommitInput(step);
  fs::remove(Path("checkpoint_input"));  // lost: the input side rebuilds from the directory
  ASSERT_EQ(OnDisk(kInputBasename), (std::set<int>{2, 3, 5, 6}));
  MakeManagers(2);
  Result<StartupReport> report = input_->Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_THAT(input_->retained(),
              ElementsAre(InputName(2), InputName(3), InputName(5), InputName(6)));
  EXPECT_TRUE(report->removed.empty());
}

}  // namespace
}  // namespace asyncckpt
