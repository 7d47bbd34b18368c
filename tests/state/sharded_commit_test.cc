#include "src/state/sharded_commit.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/state.h"
#include "io/fault_injection_file_system.h"
#include "src/util/elapsed.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;

constexpr char kToken[] = "00c0ffee12345678";

// The "merge" of these tests: the parts side by side, each prefixed by its length, so that a
// test can tell that every rank's part arrived, in rank order.
Result<std::vector<uint8_t>> Concatenate(const std::vector<std::vector<uint8_t>>& parts) {
  std::vector<uint8_t> out;
  for (const auto& part : parts) {
    out.push_back(static_cast<uint8_t>(part.size()));
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class ShardedCommitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/sharded_commit_test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    posix_ = io::NewPosixFileSystem();
    manager_ = std::make_unique<CheckpointManager>(posix_.get(), dir_, "model.ckpt", 0, 0,
                                                   SystemClockSeconds);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string tmp_name() const { return ShardedTempDirName("model.ckpt-7", kToken); }
  std::string tmp_path() const { return dir_ + "/" + tmp_name(); }

  // Rank `rank`'s share: one data file "data-<rank>" holding "rank<r>", and the part "p<r>".
  ShardCommitRequest Prepare(io::FileSystem& fs, uint32_t rank, uint32_t world, double timeout) {
    ShardCommitRequest request;
    request.checkpoint_dir = dir_;
    request.final_name = "model.ckpt-7";
    request.tmp_name = tmp_name();
    request.rank = rank;
    request.world_size = world;
    request.timeout_seconds = timeout;
    request.wall_time = 1.7e9;
    const io::IoStatus made = fs.create_dir(tmp_path());
    EXPECT_TRUE(made.ok() || made.error_number() == EEXIST) << made.message();
    std::unique_ptr<io::File> file;
    EXPECT_TRUE(fs.open(tmp_path() + "/data-" + std::to_string(rank),
                        io::OpenOptions{.write = true, .create = true, .truncate = true}, &file)
                    .ok());
    const std::string bytes = "rank" + std::to_string(rank);
    EXPECT_TRUE(file->write_at(0, bytes.data(), bytes.size()).ok());
    request.data_files.push_back({std::move(file), bytes.size(), bytes.size()});
    const std::string part = "p" + std::to_string(rank);
    request.part.assign(part.begin(), part.end());
    return request;
  }

  // Runs each rank's body on its own thread; returns their results in rank order.
  std::vector<ShardCommitResult> RunRanks(
      const std::vector<std::function<ShardCommitResult()>>& ranks) {
    std::vector<ShardCommitResult> results(ranks.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < ranks.size(); ++r) {
      threads.emplace_back([&, r] { results[r] = ranks[r](); });
    }
    for (auto& t : threads) t.join();
    return results;
  }

  std::function<ShardCommitResult()> Committer(uint32_t rank, uint32_t world, double timeout,
                                               MergeShardPartsFn merge = Concatenate) {
    return [this, rank, world, timeout, merge] {
      return CommitShard(*posix_, *manager_, Prepare(*posix_, rank, world, timeout), merge);
    };
  }

  std::string dir_;
  std::unique_ptr<io::FileSystem> posix_;
  std::unique_ptr<CheckpointManager> manager_;
};

TEST_F(ShardedCommitTest, EveryRankCommitsWhenEveryPartArrives) {
  auto results = RunRanks({Committer(0, 3, 30), Committer(1, 3, 30), Committer(2, 3, 30)});
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].status.ok()) << r << ": " << results[r].status.ToString();
    EXPECT_TRUE(results[r].committed) << r;
    EXPECT_EQ(results[r].failed_rank, -1) << r;
  }
  const std::string final_dir = dir_ + "/model.ckpt-7";
  EXPECT_EQ(ReadFile(final_dir + "/index"), std::string("\x02p0\x02p1\x02p2"));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(ReadFile(final_dir + "/data-" + std::to_string(r)), "rank" + std::to_string(r));
  }
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(final_dir)) {
    names.push_back(entry.path().filename());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"data-0", "data-1", "data-2", "index"}))
      << "parts, claims or markers left in the committed checkpoint";
  EXPECT_FALSE(fs::exists(tmp_path()));
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(*latest, final_dir);
}

TEST_F(ShardedCommitTest, OneWorldRankCommitsAlone) {
  auto results = RunRanks({Committer(0, 1, 30)});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status.ToString();
  EXPECT_EQ(ReadFile(dir_ + "/model.ckpt-7/index"), std::string("\x02p0"));
}

// Rank 0 records the checkpoint with the score of its request, and under best-N retention
// keeps it until the next commit even when it ranks below max_to_keep others: the other ranks
// poll for its index to learn that it committed.
TEST_F(ShardedCommitTest, RankZeroRecordsTheCheckpointWithItsScore) {
  manager_ =
      std::make_unique<CheckpointManager>(posix_.get(),
                                          CheckpointManagerOptions{.checkpoint_dir = dir_,
                                                                   .basename = "model.ckpt",
                                                                   .max_to_keep = 1,
                                                                   .best_mode = BestMode::kMax},
                                          SystemClockSeconds);
  fs::create_directory(dir_ + "/model.ckpt-3");
  std::ofstream(dir_ + "/model.ckpt-3/index") << "index";
  ASSERT_TRUE(manager_->RecordCommitted("model.ckpt-3", 1.6e9, 0.9).ok());
  auto scored = [this](uint32_t rank) {
    return [this, rank] {
      ShardCommitRequest request = Prepare(*posix_, rank, 2, 30);
      request.score = 0.5;
      return CommitShard(*posix_, *manager_, std::move(request), Concatenate);
    };
  };
  auto results = RunRanks({scored(0), scored(1)});
  for (const ShardCommitResult& result : results) {
    EXPECT_TRUE(result.status.ok()) << result.status.ToString();
    EXPECT_TRUE(result.committed);
  }
  EXPECT_EQ(manager_->retained(), (std::vector<std::string>{"model.ckpt-3", "model.ckpt-7"}));
  // The next pass drops it, by its score: 0.5 is below 0.9 (unscored, it would stay).
  fs::create_directory(dir_ + "/model.ckpt-9");
  std::ofstream(dir_ + "/model.ckpt-9/index") << "index";
  ASSERT_TRUE(manager_->RecordCommitted("model.ckpt-9", 1.7e9, 0.95).ok());
  EXPECT_EQ(manager_->retained(), std::vector<std::string>{"model.ckpt-9"});
  EXPECT_FALSE(fs::exists(dir_ + "/model.ckpt-7"));
  EXPECT_FALSE(fs::exists(dir_ + "/model.ckpt-3"));
}

TEST_F(ShardedCommitTest, AFailedRankAbortsTheSaveAndEveryRankNamesIt) {
  ASSERT_TRUE(manager_->RecordCommitted("model.ckpt-3", 1.6e9).ok());
  fs::create_directory(dir_ + "/model.ckpt-3");
  std::ofstream(dir_ + "/model.ckpt-3/index") << "old";
  auto results = RunRanks({Committer(0, 3, 30), Committer(1, 3, 30), [&] {
                             return FailShard(*posix_, Prepare(*posix_, 2, 3, 30),
                                              Status::IOError("disk on fire"));
                           }});
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].committed) << r;
    EXPECT_EQ(results[r].failed_rank, 2) << r << ": " << results[r].status.ToString();
    EXPECT_NE(results[r].status.message().find("disk on fire"), std::string::npos)
        << r << ": " << results[r].status.ToString();
  }
  EXPECT_NE(results[0].status.message().find("rank 2 failed"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ + "/model.ckpt-7"));
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, dir_ + "/model.ckpt-3") << "the previous latest must stay";
  EXPECT_EQ(ReadFile(dir_ + "/model.ckpt-3/index"), "old");
}

TEST_F(ShardedCommitTest, ALeaderFailureReachesEveryRank) {
  auto results = RunRanks({[&] {
                             return FailShard(*posix_, Prepare(*posix_, 0, 2, 30),
                                              Status::IOError("rank zero's disk"));
                           },
                           Committer(1, 2, 30)});
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].committed) << r;
    EXPECT_EQ(results[r].failed_rank, 0) << r;
    EXPECT_NE(results[r].status.message().find("rank zero's disk"), std::string::npos)
        << results[r].status.ToString();
  }
  EXPECT_FALSE(fs::exists(dir_ + "/model.ckpt-7"));
}

TEST_F(ShardedCommitTest, AMissingRankMakesEveryOtherRankFailWithinTheTimeout) {
  const double timeout = 0.3;
  const auto start = SteadyClock::now();
  // Rank 1 would wait longer: rank 0's abort, not its own timeout, must end its wait.
  auto results = RunRanks({Committer(0, 3, timeout), Committer(1, 3, 30)});
  const double took = SecondsSince(start);
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].committed) << r;
    EXPECT_EQ(results[r].failed_rank, 2) << r << ": " << results[r].status.ToString();
    EXPECT_NE(results[r].status.message().find("rank 2 sent no part within 0.3 s"),
              std::string::npos)
        << results[r].status.ToString();
  }
  EXPECT_LT(took, timeout + 5) << "the ranks must give up near the timeout";
  EXPECT_FALSE(fs::exists(dir_ + "/model.ckpt-7"));
}

TEST_F(ShardedCommitTest, ARankKnownGoneFailsEveryLaterSaveAtOnce) {
  auto first = RunRanks({Committer(0, 3, 0.3), Committer(1, 3, 30)});
  ASSERT_EQ(first[0].failed_rank, 2) << first[0].status.ToString();
  ASSERT_EQ(first[1].failed_rank, 2) << first[1].status.ToString();
  // The next save of the same job: rank 0 knows from its own wait, rank 1 from rank 0's abort.
  auto next = [this](uint32_t rank) {
    return [this, rank] {
      ShardCommitRequest request = Prepare(*posix_, rank, 3, 30);
      request.final_name = "model.ckpt-8";
      request.tmp_name = ShardedTempDirName("model.ckpt-8", kToken);
      const io::IoStatus made = posix_->create_dir(dir_ + "/" + request.tmp_name);
      EXPECT_TRUE(made.ok() || made.error_number() == EEXIST) << made.message();
      return CommitShard(*posix_, *manager_, std::move(request), Concatenate);
    };
  };
  const auto start = SteadyClock::now();
  auto results = RunRanks({next(0), next(1)});
  EXPECT_LT(SecondsSince(start), 5) << "a known-gone rank must not cost another 30 s timeout";
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].committed) << r;
    EXPECT_EQ(results[r].failed_rank, 2) << r << ": " << results[r].status.ToString();
    EXPECT_NE(results[r].status.message().find("rank 2 is known to be gone"), std::string::npos)
        << results[r].status.ToString();
  }
  EXPECT_FALSE(fs::exists(dir_ + "/model.ckpt-8"));
}

TEST_F(ShardedCommitTest, WithoutRankZeroTheOthersTimeOutWithAClearError) {
  const double timeout = 0.3;
  const auto start = SteadyClock::now();
  auto results = RunRanks({Committer(1, 3, timeout), Committer(2, 3, timeout)});
  const double took = SecondsSince(start);
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].committed);
    EXPECT_EQ(results[r].failed_rank, 0);
    EXPECT_NE(results[r].status.message().find("no commit from rank 0 within 0.6 s"),
              std::string::npos)
        << results[r].status.ToString();
  }
  EXPECT_GE(took, 2 * timeout);
  EXPECT_LT(took, 2 * timeout + 5);
  // Their parts are withdrawn, so a late rank 0 cannot commit without them.
  EXPECT_FALSE(fs::exists(tmp_path() + "/" + ShardPartFileName(1)));
  EXPECT_TRUE(fs::exists(tmp_path() + "/" + ShardFailedFileName(1)));
  auto late = RunRanks({Committer(0, 3, 30)});
  EXPECT_FALSE(late[0].committed);
  EXPECT_EQ(late[0].failed_rank, 1) << late[0].status.ToString();
  EXPECT_NE(late[0].status.message().find("gave up waiting"), std::string::npos)
      << late[0].status.ToString();
}

// A one-shot event between the ranks' threads. Waits are bounded, so that a broken protocol
// fails the test instead of hanging it.
class Event {
 public:
  void Set() {
    std::lock_guard lock(mu_);
    set_ = true;
    changed_.notify_all();
  }
  // True when set within a minute.
  [[nodiscard]] bool Wait() {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(60), [&] { return set_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool set_ = false;
};

// Rank 1's file system: its attempt to withdraw its part waits until rank 0 has claimed the
// parts (rank 0 is merging), is noted, and returns only once rank 0's share has ended, so the
// test decides the order of claim, give-up and commit instead of timing them.
class WithdrawalGate final : public io::FileSystemWrapper {
 public:
  WithdrawalGate(io::FileSystem* target, Event* merging, Event* withdrawal_tried, Event* rank0_done)
      : FileSystemWrapper(target),
        merging_(merging),
        withdrawal_tried_(withdrawal_tried),
        rank0_done_(rank0_done) {}
  io::IoStatus remove_file(const std::string& path) override {
    if (!path.ends_with("/" + ShardPartFileName(1))) return target()->remove_file(path);
    claimed_first = merging_->Wait();
    withdrawal = target()->remove_file(path);
    withdrawal_tried_->Set();
    rank0_ended_first = rank0_done_->Wait();
    return withdrawal;
  }

  bool claimed_first = false;      // rank 0 was merging when rank 1 tried to withdraw
  bool rank0_ended_first = false;  // rank 0's share ended before the withdrawal returned
  io::IoStatus withdrawal;         // what the withdrawal found

 private:
  Event* merging_;
  Event* withdrawal_tried_;
  Event* rank0_done_;
};

TEST_F(ShardedCommitTest, ARankThatTimesOutAfterTheClaimWaitsForTheCommit) {
  // Rank 0 claims the parts and then merges until rank 1 has reached its deadline (twice its
  // timeout) and tried to withdraw its part: rank 1 finds it claimed, cannot withdraw it, and
  // must wait for and report the commit that rank 0 then makes.
  Event merging, withdrawal_tried, rank0_done;
  bool withdrawal_came_first = false;
  auto slow_merge = [&](const std::vector<std::vector<uint8_t>>& parts) {
    merging.Set();
    withdrawal_came_first = withdrawal_tried.Wait();
    return Concatenate(parts);
  };
  WithdrawalGate rank1_fs(posix_.get(), &merging, &withdrawal_tried, &rank0_done);
  auto rank0 = [&] {
    ShardCommitResult result = Committer(0, 2, 30, slow_merge)();
    rank0_done.Set();
    return result;
  };
  auto rank1 = [&] {
    return CommitShard(rank1_fs, *manager_, Prepare(rank1_fs, 1, 2, 1.0), Concatenate);
  };
  auto results = RunRanks({rank0, rank1});
  ASSERT_TRUE(rank1_fs.claimed_first) << "rank 1 never tried to withdraw its part";
  ASSERT_TRUE(withdrawal_came_first) << "rank 0 merged before rank 1 gave up";
  ASSERT_TRUE(rank1_fs.rank0_ended_first);
  EXPECT_EQ(rank1_fs.withdrawal.error_number(), ENOENT) << rank1_fs.withdrawal.message();
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].status.ok()) << r << ": " << results[r].status.ToString();
    EXPECT_TRUE(results[r].committed) << r;
  }
  EXPECT_EQ(ReadFile(dir_ + "/model.ckpt-7/index"), std::string("\x02p0\x02p1"));
}

TEST_F(ShardedCommitTest, PartsThatDoNotMergeAbortEveryRank) {
  auto refuse = [](const std::vector<std::vector<uint8_t>>&) -> Result<std::vector<uint8_t>> {
    return Status::Corruption("boxes of 'w' overlap");
  };
  auto results = RunRanks({Committer(0, 2, 30, refuse), Committer(1, 2, 30)});
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].committed);
    EXPECT_EQ(results[r].failed_rank, 0);
    EXPECT_NE(results[r].status.message().find("boxes of 'w' overlap"), std::string::npos)
        << results[r].status.ToString();
  }
  EXPECT_FALSE(fs::exists(dir_ + "/model.ckpt-7"));
}

TEST_F(ShardedCommitTest, AFailedSyncOfOneRanksDataAbortsTheSave) {
  io::FaultInjectionFileSystem faulty(posix_.get());
  faulty.fail_ops_matching("data-1", EIO, io::FaultOp::kSync);
  auto results =
      RunRanks({Committer(0, 2, 30), [&] {
                  return CommitShard(faulty, *manager_, Prepare(faulty, 1, 2, 30), Concatenate);
                }});
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].committed);
    EXPECT_EQ(results[r].failed_rank, 1) << results[r].status.ToString();
    EXPECT_NE(results[r].status.message().find("data-1"), std::string::npos)
        << results[r].status.ToString();
  }
}

TEST_F(ShardedCommitTest, AFailedIndexWriteOnRankZeroReachesTheOthers) {
  io::FaultInjectionFileSystem faulty(posix_.get());
  faulty.fail_ops_matching("/index.writing", ENOSPC, io::FaultOp::kWrite);
  CheckpointManager manager(&faulty, dir_, "model.ckpt", 0, 0, SystemClockSeconds);
  auto results = RunRanks(
      {[&] { return CommitShard(faulty, manager, Prepare(faulty, 0, 2, 30), Concatenate); },
       Committer(1, 2, 30)});
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].committed);
    EXPECT_EQ(results[r].failed_rank, 0) << results[r].status.ToString();
    EXPECT_NE(results[r].status.message().find("No space left"), std::string::npos)
        << results[r].status.ToString();
  }
  EXPECT_FALSE(fs::exists(dir_ + "/model.ckpt-7"));
}

// One fault at every counted operation of one rank's share in turn (rank 0's, then rank 1's):
// the ranks always agree on the outcome, a failure commits nothing and blames the faulted rank,
// and no rank waits out its timeout (the failure is always published).
TEST_F(ShardedCommitTest, AFaultAtAnyOperationOfEitherRankLeavesTheRanksAgreeing) {
  for (uint32_t faulted = 0; faulted < 2; ++faulted) {
    for (uint64_t n = 1;; ++n) {
      SCOPED_TRACE("fault at operation " + std::to_string(n) + " of rank " +
                   std::to_string(faulted));
      fs::remove_all(dir_);
      fs::create_directory(dir_);
      io::FaultInjectionFileSystem faulty(posix_.get());
      CheckpointManager manager(faulted == 0 ? static_cast<io::FileSystem*>(&faulty) : posix_.get(),
                                dir_, "model.ckpt", 0, 0, SystemClockSeconds);
      std::vector<std::function<ShardCommitResult()>> ranks;
      for (uint32_t r = 0; r < 2; ++r) {
        io::FileSystem* fs = r == faulted ? &faulty : posix_.get();
        ranks.push_back([&, fs, r, n] {
          ShardCommitRequest request = Prepare(*fs, r, 2, 20);
          if (r == faulted) faulty.fail_at(n, EIO);
          return CommitShard(*fs, manager, std::move(request), Concatenate);
        });
      }
      const auto start = SteadyClock::now();
      auto results = RunRanks(ranks);
      EXPECT_LT(SecondsSince(start), 10) << "a rank waited for a failure nobody published";
      const bool injected = faulty.injected_count() > 0;
      EXPECT_EQ(results[0].committed, results[1].committed)
          << results[0].status.ToString() << " / " << results[1].status.ToString();
      EXPECT_EQ(fs::exists(dir_ + "/model.ckpt-7/index"), results[1].committed);
      if (!results[1].committed) {
        for (const auto& result : results) {
          EXPECT_FALSE(result.status.ok());
          EXPECT_EQ(result.failed_rank, static_cast<int>(faulted)) << result.status.ToString();
          EXPECT_NE(result.status.message().find("injected fault"), std::string::npos)
              << result.status.ToString();
        }
      }
      if (!injected) break;
    }
  }
}

TEST_F(ShardedCommitTest, TheNextStartRemovesAFailedSavesTemporaryDirectory) {
  RunRanks(
      {[&] { return FailShard(*posix_, Prepare(*posix_, 0, 2, 30), Status::IOError("gone")); }});
  ASSERT_TRUE(fs::exists(tmp_path() + "/" + kShardAbortFileName));
  CheckpointManager next(posix_.get(), dir_, "model.ckpt", 0, 0, SystemClockSeconds);
  auto report = next.Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(fs::exists(tmp_path()));
  EXPECT_EQ(report->removed, std::vector<std::string>{tmp_name()});
}

TEST_F(ShardedCommitTest, ARankThatEndedBeforeTheStepFailsTheSaveAtOnceNamingIt) {
  ASSERT_TRUE(PublishShardEnded(*posix_, dir_, "model.ckpt", kToken, 2, 5).ok());
  const auto start = SteadyClock::now();
  auto results = RunRanks({Committer(0, 3, 30), Committer(1, 3, 30)});
  EXPECT_LT(SecondsSince(start), 5) << "an ended rank must not cost the 30 s timeout";
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].committed) << r;
    EXPECT_EQ(results[r].failed_rank, 2) << r << ": " << results[r].status.ToString();
    EXPECT_NE(results[r].status.message().find(
                  "rank 2 ended its training at step 5, before step 7, and will send no part"),
              std::string::npos)
        << results[r].status.ToString();
  }
  EXPECT_FALSE(fs::exists(dir_ + "/model.ckpt-7"));
}

TEST_F(ShardedCommitTest, ARankZeroThatEndedBeforeTheStepFailsTheOthersAtOnce) {
  ASSERT_TRUE(PublishShardEnded(*posix_, dir_, "model.ckpt", kToken, 0, 6).ok());
  const auto start = SteadyClock::now();
  auto results = RunRanks({Committer(1, 3, 30), Committer(2, 3, 30)});
  EXPECT_LT(SecondsSince(start), 5) << "an ended rank 0 must not cost twice the 30 s timeout";
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].committed) << r;
    EXPECT_EQ(results[r].failed_rank, 0) << r << ": " << results[r].status.ToString();
    EXPECT_NE(results[r].status.message().find("rank 0 ended its training at step 6"),
              std::string::npos)
        << results[r].status.ToString();
  }
  // Withdrawn, so that rank 0 could not commit without them.
  EXPECT_FALSE(fs::exists(tmp_path() + "/" + ShardPartFileName(1)));
}

TEST_F(ShardedCommitTest, AnEndAtOrAfterTheStepIsNoReasonToStopWaiting) {
  // Every rank announces its end before its final save, and a slower rank's part of an earlier
  // save may still be on its way: only an end before the step fails it.
  ASSERT_TRUE(PublishShardEnded(*posix_, dir_, "model.ckpt", kToken, 1, 7).ok());
  ASSERT_TRUE(PublishShardEnded(*posix_, dir_, "model.ckpt", kToken, 2, 9).ok());
  auto results = RunRanks({Committer(0, 3, 30), Committer(1, 3, 30), Committer(2, 3, 30)});
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].committed) << r << ": " << results[r].status.ToString();
  }
}

TEST_F(ShardedCommitTest, EndMarkersAreNamedPerRankAndJobAndTheNextStartRemovesThem) {
  const std::string name = ShardEndedFileName("model.ckpt", 3, kToken);
  EXPECT_EQ(name, std::string("model.ckpt.ended-00003.tmp-") + kToken);
  EXPECT_TRUE(IsShardEndedFileName(name, "model.ckpt"));
  EXPECT_TRUE(IsShardEndedFileName(name + ".writing", "model.ckpt"));
  EXPECT_FALSE(IsShardEndedFileName(name, "other"));
  EXPECT_FALSE(IsShardEndedFileName("model.ckpt.ended-x.tmp-ab", "model.ckpt"));
  EXPECT_FALSE(IsShardEndedFileName("model.ckpt.ended-00001.tmp-zz", "model.ckpt"));
  EXPECT_FALSE(IsShardEndedFileName("model.ckpt-7", "model.ckpt"));
  ASSERT_TRUE(PublishShardEnded(*posix_, dir_, "model.ckpt", kToken, 3, 40).ok());
  EXPECT_EQ(ReadFile(dir_ + "/" + name), "40");
  CheckpointManager next(posix_.get(), dir_, "model.ckpt", 0, 0, SystemClockSeconds);
  auto report = next.Start();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(fs::exists(dir_ + "/" + name));
  EXPECT_EQ(report->removed, std::vector<std::string>{name});
}

TEST_F(ShardedCommitTest, RankZeroRemovesEveryRanksEndMarkerOfItsJob) {
  for (uint32_t rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(PublishShardEnded(*posix_, dir_, "model.ckpt", kToken, rank, 40).ok());
  }
  ASSERT_TRUE(PublishShardEnded(*posix_, dir_, "model.ckpt", "beef", 1, 40).ok());
  RemoveShardEnded(*posix_, dir_, "model.ckpt", kToken, 4);  // rank 3 never wrote one
  for (uint32_t rank = 0; rank < 3; ++rank) {
    EXPECT_FALSE(fs::exists(dir_ + "/" + ShardEndedFileName("model.ckpt", rank, kToken)));
  }
  EXPECT_TRUE(fs::exists(dir_ + "/" + ShardEndedFileName("model.ckpt", 1, "beef")))
      << "another job's marker is not this job's to remove";
}

TEST_F(ShardedCommitTest, JobTokensAreHexOnly) {
  EXPECT_TRUE(ValidateJobToken(kToken).ok());
  EXPECT_FALSE(ValidateJobToken("").ok());
  EXPECT_FALSE(ValidateJobToken("job-1").ok());
  EXPECT_FALSE(ValidateJobToken("../x").ok());
  EXPECT_FALSE(ValidateJobToken(std::string(33, 'a')).ok());
  EXPECT_NE(ValidateJobToken("job-1").message().find("job_token"), std::string::npos);
}

}  // namespace
}  // namespace asyncckpt
