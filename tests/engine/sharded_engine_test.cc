// The engine in a multi-process (sharded) job: every "rank" is its own Engine and
// CheckpointManager over the same checkpoint directory, in this process (one commit thread per
// engine) or, for the rank that is killed, in a child process.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/state.h"
#include "io/fault_injection_file_system.h"
#include "src/codec/codec.h"
#include "src/engine/engine.h"
#include "src/format/format.h"
#include "src/format/index_file.h"
#include "src/state/checkpoint_validator.h"
#include "src/state/sharded_commit.h"
#include "src/util/elapsed.h"
#include "tests/io/gated_file_system.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;

constexpr char kToken[] = "5eed0000cafe0011";
constexpr char kChildDirEnv[] = "ASYNCCKPT_SHARDED_CHILD_DIR";

// The job of these tests: a global f32 tensor "w" of 10 x 3 split unevenly along dim 0 over
// three ranks (4, 1 and 5 rows), a bf16 vector "b" of 7 split 3 / 4 over ranks 0 and 1 with
// rank 2 holding none of it, a whole "step" counter that rank 0 writes (replica filtering is
// the saver's job), and rank 2's own whole "input_worker_2" state.
constexpr int64_t kRows[] = {0, 4, 5, 10};
constexpr int64_t kCols = 3;
constexpr int64_t kBLen = 7;
constexpr int64_t kBSplit = 3;

float W(int64_t step, int64_t row, int64_t col) { return float(step * 1000 + row * kCols + col); }
uint16_t B(int64_t step, int64_t i) { return uint16_t(step * 100 + i); }

// One rank's tensors and their buffers.
struct RankState {
  uint32_t rank = 0;
  std::vector<float> w;
  std::vector<uint16_t> b;
  int64_t step_counter = 0;
  std::vector<uint8_t> input;
  TensorRegistry registry;

  RankState(uint32_t r, int64_t step) : rank(r) {
    const int64_t rows = kRows[r + 1] - kRows[r];
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t c = 0; c < kCols; ++c) w.push_back(W(step, kRows[r] + i, c));
    }
    EXPECT_TRUE(registry
                    .add({"w",
                          DType::kF32,
                          {rows, kCols},
                          w.data(),
                          w.size() * sizeof(float),
                          nullptr,
                          {10, kCols},
                          {kRows[r], 0}})
                    .ok());
    if (r < 2) {
      const int64_t begin = r == 0 ? 0 : kBSplit;
      const int64_t end = r == 0 ? kBSplit : kBLen;
      for (int64_t i = begin; i < end; ++i) b.push_back(B(step, i));
      EXPECT_TRUE(registry
                      .add({"b",
                            DType::kBF16,
                            {end - begin},
                            b.data(),
                            b.size() * 2,
                            nullptr,
                            {kBLen},
                            {begin}})
                      .ok());
    }
    if (r == 0) {
      step_counter = step;
      EXPECT_TRUE(registry.add({"step", DType::kI64, {}, &step_counter, 8, nullptr, {}, {}}).ok());
    }
    if (r == 2) {
      input.assign(11, uint8_t(step));
      EXPECT_TRUE(
          registry
              .add(
                  {"input_worker_2", DType::kU8, {11}, input.data(), input.size(), nullptr, {}, {}})
              .ok());
    }
  }
};

EngineOptions RankOptions(const std::string& dir, uint32_t rank, uint32_t world,
                          double timeout = 30) {
  EngineOptions options;
  options.saver.checkpoint_dir = dir;
  options.saver.chunk_bytes = 16;  // several chunks per slice
  options.saver.num_data_files = 2;
  options.saver.background_threads = 2;
  options.saver.compression.kind = CompressionKind::kNone;
  options.saver.coordination_timeout_secs = timeout;
  options.sharding = ShardingOptions{rank, world, kToken};
  return options;
}

// An engine with `options` over `registry`, planned as its owner plans it.
Result<std::unique_ptr<Engine>> CreateEngine(const EngineOptions& options, io::FileSystem* fs,
                                             CheckpointManager* manager,
                                             const TensorRegistry* registry,
                                             Engine::DoneFn on_done) {
  Result<SnapshotPlan> plan = PlanSnapshot(*registry, options, "test");
  if (!plan.ok()) return plan.status();
  return Engine::Create(options, *plan, fs, manager, registry, std::move(on_done));
}

// One rank: its state, manager and engine, and the stats its engine reported.
class Rank {
 public:
  Rank(const std::string& dir, uint32_t rank, uint32_t world, int64_t step, io::FileSystem* fs,
       double timeout = 30)
      : state_(rank, step), manager_(fs, dir, "model.ckpt", 0, 0, SystemClockSeconds) {
    auto engine = CreateEngine(RankOptions(dir, rank, world, timeout), fs, &manager_,
                               &state_.registry, [this](const SaveStats& stats) {
                                 std::lock_guard lock(mu_);
                                 done_.push_back(stats);
                               });
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    if (engine.ok()) engine_ = std::move(engine).value();
  }

  void Submit(int64_t step) {
    SubmitRequest request;
    request.metadata.step = step;
    request.metadata.wall_time = 1.7e9 + double(step);
    auto result = engine_->Submit(request);
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    EXPECT_EQ(result->outcome, SubmitOutcome::kSubmitted);
  }
  void Wait() { engine_->WaitAll(); }
  std::vector<SaveStats> done() {
    std::lock_guard lock(mu_);
    return done_;
  }

 private:
  RankState state_;
  CheckpointManager manager_;
  std::unique_ptr<Engine> engine_;
  std::mutex mu_;
  std::vector<SaveStats> done_;
};

// The slices of a committed checkpoint, decoded and verified: (name, first global index of the
// box) -> raw bytes, with the writer rank of each.
struct Slices {
  using Key = std::pair<std::string, std::vector<int64_t>>;
  std::map<Key, std::vector<uint8_t>> bytes;
  std::map<Key, uint32_t> writer;

  std::vector<uint8_t> at(const std::string& name, std::vector<int64_t> offset) const {
    auto it = bytes.find(Key{name, std::move(offset)});
    return it == bytes.end() ? std::vector<uint8_t>{} : it->second;
  }
  int writer_of(const std::string& name, std::vector<int64_t> offset) const {
    auto it = writer.find(Key{name, std::move(offset)});
    return it == writer.end() ? -1 : static_cast<int>(it->second);
  }
};

Result<Slices> ReadSlices(const std::string& checkpoint) {
  std::ifstream in(checkpoint + "/index", std::ios::binary);
  std::vector<uint8_t> index_bytes((std::istreambuf_iterator<char>(in)), {});
  auto parsed = format::ParseIndex(index_bytes, checkpoint + "/index");
  if (!parsed.ok()) return parsed.status();
  const format::Index& index = *parsed;
  if (!index.sharded) return Status::Corruption("the index is not sharded");
  std::vector<std::string> files;
  std::vector<uint64_t> sizes;
  for (uint32_t i = 0; i < index.num_data_files; ++i) {
    files.push_back(checkpoint + "/" + format::DataFileName(i, index.num_data_files));
    sizes.push_back(fs::exists(files.back()) ? fs::file_size(files.back()) : 0);
  }
  Status located = format::CheckChunkLocations(index, checkpoint, sizes);
  if (!located.ok()) return located;
  Slices slices;
  codec::Scratch scratch;
  for (const format::TensorEntry& t : index.tensors) {
    std::vector<uint8_t> raw(t.bytes);
    for (const format::ChunkEntry& c : t.chunks) {
      std::ifstream data(files[c.file_index], std::ios::binary);
      std::vector<uint8_t> stored(c.stored_bytes);
      data.seekg(static_cast<std::streamoff>(c.file_offset));
      data.read(reinterpret_cast<char*>(stored.data()),
                static_cast<std::streamsize>(stored.size()));
      Status decoded =
          codec::Decode(c.codec, stored, DTypeSize(t.dtype), c.xxh3,
                        std::span<uint8_t>(raw.data() + c.tensor_offset, c.raw_bytes), scratch);
      if (!decoded.ok()) return decoded.WithContext(t.name);
    }
    slices.bytes[{t.name, t.box_offset}] = raw;
    slices.writer[{t.name, t.box_offset}] = t.writer_rank;
  }
  return slices;
}

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

class ShardedEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/sharded_engine_test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    posix_ = io::NewPosixFileSystem();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Saves `step` on every rank of `ranks` and waits for all of them.
  static void SaveAll(std::vector<std::unique_ptr<Rank>>& ranks, int64_t step) {
    for (auto& rank : ranks) rank->Submit(step);
    for (auto& rank : ranks) rank->Wait();
  }

  // Three ranks over the plain file system, saving `step`; returns them.
  std::vector<std::unique_ptr<Rank>> ThreeRanks(int64_t step, double timeout = 30) {
    std::vector<std::unique_ptr<Rank>> ranks;
    for (uint32_t r = 0; r < 3; ++r) {
      ranks.push_back(std::make_unique<Rank>(dir_, r, 3, step, posix_.get(), timeout));
    }
    return ranks;
  }

  std::vector<std::string> Entries() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string dir_;
  std::unique_ptr<io::FileSystem> posix_;
};

TEST_F(ShardedEngineTest, EveryRankCommitsAndTheGlobalIndexHoldsEveryShard) {
  auto ranks = ThreeRanks(5);
  SaveAll(ranks, 5);
  const std::string checkpoint = dir_ + "/model.ckpt-5";
  for (uint32_t r = 0; r < 3; ++r) {
    auto done = ranks[r]->done();
    ASSERT_EQ(done.size(), 1u);
    EXPECT_TRUE(done[0].status.ok()) << r << ": " << done[0].status.ToString();
    EXPECT_EQ(done[0].path, checkpoint) << r;
    EXPECT_EQ(done[0].failed_rank, -1) << r;
  }
  // Rank r wrote data files 2r and 2r + 1 of 6; no part, claim or marker is left.
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(checkpoint)) {
    files.push_back(entry.path().filename());
  }
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files,
            (std::vector<std::string>{"data-00000-of-00006", "data-00001-of-00006",
                                      "data-00002-of-00006", "data-00003-of-00006",
                                      "data-00004-of-00006", "data-00005-of-00006", "index"}));
  EXPECT_EQ(Entries(), (std::vector<std::string>{"checkpoint", "model.ckpt-5"}));
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, checkpoint);

  // The savers' start-up check finds it complete (else a restart would delete it).
  auto valid = ValidateCheckpointDirectory(*posix_, checkpoint);
  EXPECT_TRUE(valid.ok()) << valid.status().ToString();
  auto slices = ReadSlices(checkpoint);
  ASSERT_TRUE(slices.ok()) << slices.status().ToString();
  EXPECT_EQ(slices->bytes.size(), 3u + 2u + 1u + 1u);
  for (uint32_t r = 0; r < 3; ++r) {
    RankState expected(r, 5);
    EXPECT_EQ(slices->at("w", {kRows[r], 0}), Bytes(expected.w)) << "w of rank " << r;
    EXPECT_EQ(slices->writer_of("w", {kRows[r], 0}), static_cast<int>(r));
  }
  EXPECT_EQ(slices->at("b", {0}), Bytes(RankState(0, 5).b));
  EXPECT_EQ(slices->at("b", {kBSplit}), Bytes(RankState(1, 5).b));
  EXPECT_EQ(slices->at("step", {}), Bytes(std::vector<int64_t>{5}));
  EXPECT_EQ(slices->writer_of("step", {}), 0);
  EXPECT_EQ(slices->at("input_worker_2", {0}), std::vector<uint8_t>(11, 5));
  EXPECT_EQ(slices->writer_of("input_worker_2", {0}), 2);

  // The reader assembles global tensors and boxes across the ranks' slices.
  auto reader = CheckpointReader::Open(checkpoint);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_TRUE((*reader)->sharded());
  EXPECT_EQ((*reader)->world_size(), 3u);
  std::vector<float> w(10 * kCols);
  ASSERT_TRUE((*reader)->read("w", w.data(), w.size() * sizeof(float)).ok());
  for (int64_t row = 0; row < 10; ++row) {
    for (int64_t c = 0; c < kCols; ++c) EXPECT_EQ(w[size_t(row * kCols + c)], W(5, row, c));
  }
  std::vector<float> box(3 * 2);  // rows 3..5, columns 1..2: the slices of all three ranks
  Status boxed = (*reader)->read_box("w", {3, 1}, {3, 2}, box.data(), box.size() * sizeof(float));
  ASSERT_TRUE(boxed.ok()) << boxed.ToString();
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t c = 0; c < 2; ++c) EXPECT_EQ(box[size_t(i * 2 + c)], W(5, 3 + i, 1 + c));
  }
  std::vector<uint16_t> b(kBLen);
  ASSERT_TRUE((*reader)->read("b", b.data(), b.size() * 2).ok());
  for (int64_t i = 0; i < kBLen; ++i) EXPECT_EQ(b[size_t(i)], B(5, i));
  const VerifyReport report = (*reader)->verify();
  EXPECT_TRUE(report.problems.empty()) << report.problems.front();
  EXPECT_GT(report.chunks_checked, 0u);
}

TEST_F(ShardedEngineTest, ARankThatWritesNothingStillTakesPart) {
  // Rank 1 holds only replicas, which the saver filtered out: its registry is empty.
  std::vector<float> whole(12, 2.5f);
  TensorRegistry registry;
  ASSERT_TRUE(registry.add({"whole", DType::kF32, {12}, whole.data(), 48, nullptr, {}, {}}).ok());
  TensorRegistry empty;
  CheckpointManager manager0(posix_.get(), dir_, "model.ckpt", 0, 0, SystemClockSeconds);
  CheckpointManager manager1(posix_.get(), dir_, "model.ckpt", 0, 0, SystemClockSeconds);
  std::vector<SaveStats> done;
  std::mutex mu;
  auto record = [&](const SaveStats& stats) {
    std::lock_guard lock(mu);
    done.push_back(stats);
  };
  auto e0 = CreateEngine(RankOptions(dir_, 0, 2), posix_.get(), &manager0, &registry, record);
  auto e1 = CreateEngine(RankOptions(dir_, 1, 2), posix_.get(), &manager1, &empty, record);
  ASSERT_TRUE(e0.ok()) << e0.status().ToString();
  ASSERT_TRUE(e1.ok()) << e1.status().ToString();
  SubmitRequest request;
  request.metadata.step = 9;
  ASSERT_TRUE((*e0)->Submit(request).ok());
  auto submitted = (*e1)->Submit(request);
  ASSERT_TRUE(submitted.ok()) << submitted.status().ToString();
  (*e0)->WaitAll();
  (*e1)->WaitAll();
  ASSERT_EQ(done.size(), 2u);
  for (const SaveStats& stats : done) EXPECT_TRUE(stats.status.ok()) << stats.status.ToString();
  auto reader = CheckpointReader::Open(dir_ + "/model.ckpt-9");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<float> back(12);
  ASSERT_TRUE((*reader)->read("whole", back.data(), 48).ok());
  EXPECT_EQ(back, whole);
}

TEST_F(ShardedEngineTest, OneRankFailingItsWritesCommitsNothingAndEveryRankNamesIt) {
  {
    auto ranks = ThreeRanks(1);
    SaveAll(ranks, 1);
    ASSERT_TRUE(ranks[0]->done()[0].status.ok()) << ranks[0]->done()[0].status.ToString();
  }
  io::FaultInjectionFileSystem faulty(posix_.get());
  faulty.fail_ops_matching("data-00003-of-00006", ENOSPC, io::FaultOp::kWrite);
  std::vector<std::unique_ptr<Rank>> ranks;
  ranks.push_back(std::make_unique<Rank>(dir_, 0, 3, 2, posix_.get()));
  ranks.push_back(std::make_unique<Rank>(dir_, 1, 3, 2, &faulty));
  ranks.push_back(std::make_unique<Rank>(dir_, 2, 3, 2, posix_.get()));
  SaveAll(ranks, 2);
  EXPECT_GT(faulty.injected_count(), 0u);
  for (uint32_t r = 0; r < 3; ++r) {
    auto done = ranks[r]->done();
    ASSERT_EQ(done.size(), 1u);
    EXPECT_FALSE(done[0].status.ok()) << r;
    EXPECT_TRUE(done[0].path.empty()) << r;
    EXPECT_EQ(done[0].failed_rank, 1) << r << ": " << done[0].status.ToString();
    EXPECT_NE(done[0].status.message().find("No space left on device"), std::string::npos)
        << r << ": " << done[0].status.ToString();
  }
  EXPECT_NE(ranks[0]->done()[0].status.message().find("rank 1 failed"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ + "/model.ckpt-2"));
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, dir_ + "/model.ckpt-1") << "the previous latest must stay";
  auto slices = ReadSlices(dir_ + "/model.ckpt-1");
  ASSERT_TRUE(slices.ok()) << slices.status().ToString();
  EXPECT_EQ(slices->at("step", {}), Bytes(std::vector<int64_t>{1}));

  // The next start removes the failed save's shared temporary directory.
  const std::string tmp = ShardedTempDirName("model.ckpt-2", kToken);
  ASSERT_TRUE(fs::exists(dir_ + "/" + tmp));
  ranks.clear();
  CheckpointManager next(posix_.get(), dir_, "model.ckpt", 0, 0, SystemClockSeconds);
  auto report = next.Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->removed, std::vector<std::string>{tmp});
  EXPECT_EQ(Entries(), (std::vector<std::string>{"checkpoint", "model.ckpt-1"}));
}

TEST_F(ShardedEngineTest, ASecondSaveOfAFailedStepUsesAFreshDirectoryAndCommits) {
  io::FaultInjectionFileSystem faulty(posix_.get());
  faulty.fail_ops_matching("data-00004-of-00006", EIO, io::FaultOp::kWrite);
  std::vector<std::unique_ptr<Rank>> ranks;
  ranks.push_back(std::make_unique<Rank>(dir_, 0, 3, 4, posix_.get()));
  ranks.push_back(std::make_unique<Rank>(dir_, 1, 3, 4, posix_.get()));
  ranks.push_back(std::make_unique<Rank>(dir_, 2, 3, 4, &faulty));
  SaveAll(ranks, 4);
  ASSERT_EQ(ranks[1]->done()[0].failed_rank, 2) << ranks[1]->done()[0].status.ToString();
  faulty.clear_faults();
  SaveAll(ranks, 4);
  for (uint32_t r = 0; r < 3; ++r) {
    auto done = ranks[r]->done();
    ASSERT_EQ(done.size(), 2u);
    EXPECT_TRUE(done[1].status.ok()) << r << ": " << done[1].status.ToString();
  }
  EXPECT_TRUE(ReadSlices(dir_ + "/model.ckpt-4").ok());
}

TEST_F(ShardedEngineTest, WithoutRankZeroTheOthersFailWithinTheTimeout) {
  const double timeout = 0.5;
  std::vector<std::unique_ptr<Rank>> ranks;
  ranks.push_back(std::make_unique<Rank>(dir_, 1, 3, 3, posix_.get(), timeout));
  ranks.push_back(std::make_unique<Rank>(dir_, 2, 3, 3, posix_.get(), timeout));
  const auto start = SteadyClock::now();
  SaveAll(ranks, 3);
  const double took = SecondsSince(start);
  for (auto& rank : ranks) {
    auto done = rank->done();
    ASSERT_EQ(done.size(), 1u);
    EXPECT_FALSE(done[0].status.ok());
    EXPECT_EQ(done[0].failed_rank, 0);
    EXPECT_NE(done[0].status.message().find("no commit from rank 0 within 1 s"), std::string::npos)
        << done[0].status.ToString();
  }
  EXPECT_GE(took, 2 * timeout);
  EXPECT_LT(took, 2 * timeout + 10) << "bounded by the timeout, not hung";
  EXPECT_FALSE(fs::exists(dir_ + "/model.ckpt-3"));
}

// Rank 2 of the killed-rank test, in a child process started by it: it writes into the shared
// directory through a file system that holds every write, so that it is killed mid-save.
TEST(ShardedEngineChild, HoldsItsWritesUntilKilled) {
  const char* dir = std::getenv(kChildDirEnv);
  if (dir == nullptr)
    GTEST_SKIP() << "run by ARankKilledMidSaveFailsTheOthersWithinTheTimeout as its rank 2";
  auto posix = io::NewPosixFileSystem();
  testing_support::GatedFileSystem gated(posix.get());
  Rank rank(dir, 2, 3, 6, &gated);
  rank.Submit(6);
  gated.WaitForWaiting(1);
  std::ofstream(std::string(dir) + "/child-writing") << "mid-save";
  for (;;) pause();
}

TEST_F(ShardedEngineTest, ARankKilledMidSaveFailsTheOthersWithinTheTimeout) {
  // Rank 0's own part must be durable well within the others' wait (2 x timeout) for it to be
  // the one that blames rank 2; at 1 s a loaded 2-core machine sometimes made rank 1 give up on
  // rank 0 first (then rank 1 blames rank 0: a correct outcome, but not the one asserted).
  const double timeout = 4.0;
  ASSERT_EQ(setenv(kChildDirEnv, dir_.c_str(), 1), 0);
  const pid_t child = fork();
  if (child == 0) {
    const int quiet = open("/dev/null", O_WRONLY);  // the child's gtest chatter
    if (quiet >= 0) dup2(quiet, STDOUT_FILENO);
    execl("/proc/self/exe", "/proc/self/exe",
          "--gtest_filter=ShardedEngineChild.HoldsItsWritesUntilKilled", nullptr);
    _exit(127);
  }
  unsetenv(kChildDirEnv);
  ASSERT_GT(child, 0);
  // Wait until rank 2 is mid-save (its data files open, its writes held), then kill it.
  const auto wait_start = SteadyClock::now();
  while (!fs::exists(dir_ + "/child-writing") && SecondsSince(wait_start) < 120) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const bool mid_save = fs::exists(dir_ + "/child-writing");
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(mid_save) << "the child rank never started its save";
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(fs::exists(dir_ + "/" + ShardedTempDirName("model.ckpt-6", kToken) + "/" +
                         format::DataFileName(4, 6)));

  std::vector<std::unique_ptr<Rank>> ranks;
  ranks.push_back(std::make_unique<Rank>(dir_, 0, 3, 6, posix_.get(), timeout));
  ranks.push_back(std::make_unique<Rank>(dir_, 1, 3, 6, posix_.get(), timeout));
  const auto start = SteadyClock::now();
  SaveAll(ranks, 6);
  const double took = SecondsSince(start);
  for (auto& rank : ranks) {
    auto done = rank->done();
    ASSERT_EQ(done.size(), 1u);
    EXPECT_FALSE(done[0].status.ok());
    EXPECT_EQ(done[0].failed_rank, 2) << done[0].status.ToString();
    EXPECT_NE(done[0].status.message().find("rank 2 sent no part within 4 s"), std::string::npos)
        << done[0].status.ToString();
  }
  EXPECT_LT(took, 2 * timeout + 10) << "the survivors must not hang";
  EXPECT_FALSE(fs::exists(dir_ + "/model.ckpt-6"));
  auto latest = LatestCheckpoint(dir_);
  EXPECT_FALSE(latest.ok()) << "nothing was ever committed";
}

TEST_F(ShardedEngineTest, BadShardingOptionsAreRefusedByName) {
  RankState state(0, 1);
  CheckpointManager manager(posix_.get(), dir_, "model.ckpt", 0, 0, SystemClockSeconds);
  auto create = [&](EngineOptions options) {
    return CreateEngine(options, posix_.get(), &manager, &state.registry, nullptr);
  };
  EngineOptions options = RankOptions(dir_, 3, 3);
  auto engine = create(options);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("sharding.rank 3"), std::string::npos);
  options = RankOptions(dir_, 0, 3);
  options.sharding.job_token = "../escape";
  engine = create(options);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("job_token"), std::string::npos);
  options = RankOptions(dir_, 0, 40000);
  engine = create(options);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("num_data_files"), std::string::npos);
}

TEST_F(ShardedEngineTest, WorldSizeOneWritesAnUnshardedCheckpointAsBefore) {
  std::vector<float> w(12, 1.5f);
  TensorRegistry registry;
  ASSERT_TRUE(registry.add({"w", DType::kF32, {4, 3}, w.data(), 48, nullptr, {}, {}}).ok());
  CheckpointManager manager(posix_.get(), dir_, "model.ckpt", 0, 0, SystemClockSeconds);
  EngineOptions options = RankOptions(dir_, 0, 1);  // a job token, but one process
  auto engine = CreateEngine(options, posix_.get(), &manager, &registry, nullptr);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  SubmitRequest request;
  request.metadata.step = 8;
  ASSERT_TRUE((*engine)->Submit(request).ok());
  (*engine)->WaitAll();
  std::ifstream in(dir_ + "/model.ckpt-8/index", std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  auto index = format::ParseIndex(bytes, "index");
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_FALSE(index->sharded);
  EXPECT_EQ(index->num_data_files, 2u);
  EXPECT_TRUE(fs::exists(dir_ + "/model.ckpt-8/data-00001-of-00002"));
  EXPECT_EQ(Entries(), (std::vector<std::string>{"checkpoint", "model.ckpt-8"}));
}

TEST_F(ShardedEngineTest, APartialShardInASingleProcessSaveIsRefusedByName) {
  RankState state(1, 1);  // holds rows 4..5 of w
  // Refused by the plan every engine is created from and every save is made from, before an
  // engine or a file exists.
  const Result<SnapshotPlan> plan =
      PlanSnapshot(state.registry, RankOptions(dir_, 0, 1), "model.ckpt-1");
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("model.ckpt-1: tensor 'b' is a shard"), std::string::npos)
      << plan.status().ToString();
  EXPECT_TRUE(fs::is_empty(dir_)) << "nothing written";
}

}  // namespace
}  // namespace asyncckpt
