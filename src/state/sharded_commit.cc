#include "src/state/sharded_commit.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "src/util/elapsed.h"
#include "src/util/io_status.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

namespace {

constexpr char kClaimedPrefix[] = "index.claimed-";
// A failure text longer than this is cut when read back: it is a message, not data.
constexpr uint64_t kMaxTextBytes = 64 * 1024;
// The other ranks wait this many times timeout_seconds for rank 0's outcome.
constexpr double kFollowerWaits = 2;
// A part index larger than this is refused before it is read (format::kMaxIndexBytes).
constexpr uint64_t kMaxPartBytes = 1ull << 30;

std::string RankDigits(uint32_t rank) {
  char buffer[16];
  std::snprintf(buffer, sizeof(buffer), "%05u", rank);
  return buffer;
}

std::string ClaimedFileName(uint32_t rank) { return kClaimedPrefix + RankDigits(rank); }

std::string Seconds(double seconds) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", seconds);
  return buffer;
}

// The ranks a job (checkpoint_dir and job token), as one of its ranks sees it, knows dead: one that
// let a whole timeout pass without a part (or, for rank 0, without an outcome). Every save of that
// job still waiting, and every later one, fails at once instead of waiting out a timeout of its
// own.
class DeadRanks {
 public:
  static DeadRanks& Get() {
    static DeadRanks* ranks = new DeadRanks();  // never destroyed: engines may outlive statics
    return *ranks;
  }
  void Mark(const ShardCommitRequest& request, int rank, const std::string& why) {
    std::lock_guard lock(mutex_);
    dead_.try_emplace(Key(request), rank, why);
  }
  // The dead rank and why, or (-1, "").
  std::pair<int, std::string> Find(const ShardCommitRequest& request) const {
    std::lock_guard lock(mutex_);
    auto it = dead_.find(Key(request));
    return it == dead_.end() ? std::pair<int, std::string>(-1, "") : it->second;
  }

 private:
  static std::string Key(const ShardCommitRequest& request) {
    const size_t tmp = request.tmp_name.rfind(".tmp-");
    // Per observing rank too: the ranks of the tests share one process.
    return request.checkpoint_dir + "\n" +
           (tmp == std::string::npos ? request.tmp_name : request.tmp_name.substr(tmp + 5)) + "\n" +
           std::to_string(request.rank);
  }
  mutable std::mutex mutex_;
  std::map<std::string, std::pair<int, std::string>> dead_;
};

// The failure of a save of a job with a dead rank, blaming that rank.
Status KnownDead(const std::pair<int, std::string>& dead) {
  return Status::Aborted("rank " + std::to_string(dead.first) + " is known to be gone (" +
                         dead.second + "): no save of this job can commit without it");
}

// The step in "<basename>-<step>"; -1 when the name has none.
int64_t StepOf(const ShardCommitRequest& request) {
  const std::string& name = request.final_name;
  const size_t dash = name.rfind('-');
  int64_t step = -1;
  if (dash == std::string::npos ||
      std::from_chars(name.data() + dash + 1, name.data() + name.size(), step).ec != std::errc()) {
    return -1;
  }
  return step;
}

// The failure of a save that waited for a rank which ended its training before the save's step.
Status EndedEarly(const ShardCommitRequest& request, uint32_t rank, int64_t ended_at) {
  return Status::Aborted("rank " + std::to_string(rank) + " ended its training at step " +
                         std::to_string(ended_at) + ", before step " +
                         std::to_string(StepOf(request)) + ", and will send no part of " +
                         request.final_name + " (the ranks ran different numbers of steps)");
}

// The rank an abort's text blames for a timeout ("rank R sent no part within", or a rank known
// gone already), or -1.
int TimedOutRank(const std::string& why) {
  constexpr std::string_view kNoPart = " sent no part within ";
  constexpr std::string_view kGone = " is known to be gone";
  int rank = -1;
  if (!why.starts_with("rank ") ||
      (why.find(kNoPart) == std::string::npos && why.find(kGone) == std::string::npos)) {
    return -1;
  }
  const char* begin = why.data() + 5;
  if (std::from_chars(begin, why.data() + why.size(), rank).ec != std::errc()) return -1;
  return rank;
}

// Polls the file system at a pace that starts fast (a commit on a quiet disk takes
// milliseconds) and settles at 20 ms (a long wait must not spin).
class Poller {
 public:
  explicit Poller(double timeout_seconds) { Restart(timeout_seconds); }
  void Restart(double timeout_seconds) {
    deadline_ = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                         std::chrono::duration<double>(timeout_seconds));
  }
  bool Expired() const { return SteadyClock::now() >= deadline_; }
  void Sleep() {
    std::this_thread::sleep_for(pause_);
    pause_ = std::min(pause_ * 2, std::chrono::microseconds(20000));
  }

 private:
  SteadyClock::time_point deadline_;
  std::chrono::microseconds pause_{500};
};

Result<bool> Exists(io::FileSystem& fs, const std::string& path) {
  io::EntryType type = io::EntryType::kNone;
  RETURN_IF_ERROR(ToStatus(fs.entry_type(path, &type)));
  return type != io::EntryType::kNone;
}

// Writes `bytes` to dir/name so that a reader sees all of it or nothing: a temporary beside it,
// renamed into place. `durable` also syncs the file and the directory.
Status WriteWhole(io::FileSystem& fs, const std::string& dir, const std::string& name,
                  std::span<const uint8_t> bytes, bool durable) {
  const std::string path = JoinCheckpointPath(dir, name);
  const std::string writing = path + ".writing";
  {
    std::unique_ptr<io::File> file;
    RETURN_IF_ERROR(
        ToStatus(fs.open(writing, {.write = true, .create = true, .truncate = true}, &file)));
    RETURN_IF_ERROR(ToStatus(file->write_at(0, bytes.data(), bytes.size())));
    if (durable) RETURN_IF_ERROR(ToStatus(file->sync()));
  }
  RETURN_IF_ERROR(ToStatus(fs.rename(writing, path)));
  if (durable) RETURN_IF_ERROR(ToStatus(fs.sync_dir(dir)));
  return Status::OK();
}

Status WriteText(io::FileSystem& fs, const std::string& dir, const std::string& name,
                 const std::string& text) {
  return WriteWhole(fs, dir, name,
                    std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()), false);
}

// The first `limit` bytes of `path` at most; larger files are an error when `refuse_larger`.
Result<std::vector<uint8_t>> ReadWhole(io::FileSystem& fs, const std::string& path, uint64_t limit,
                                       bool refuse_larger) {
  std::unique_ptr<io::File> file;
  RETURN_IF_ERROR(ToStatus(fs.open(path, {}, &file)));
  uint64_t size = 0;
  RETURN_IF_ERROR(ToStatus(file->size(&size)));
  if (size > limit) {
    if (refuse_larger) {
      return Status::Corruption(path + " is " + std::to_string(size) + " bytes; at most " +
                                std::to_string(limit));
    }
    size = limit;
  }
  std::vector<uint8_t> bytes(size);
  RETURN_IF_ERROR(ToStatus(file->read_at(0, bytes.data(), bytes.size())));
  return bytes;
}

std::string ReadText(io::FileSystem& fs, const std::string& path) {
  Result<std::vector<uint8_t>> bytes = ReadWhole(fs, path, kMaxTextBytes, false);
  if (!bytes.ok()) return "(its error could not be read: " + bytes.status().message() + ")";
  return std::string(bytes->begin(), bytes->end());
}

// What one rank's share of the save is about.
class Share {
 public:
  Share(io::FileSystem& fs, ShardCommitRequest& request)
      : fs_(fs),
        request_(request),
        tmp_path_(JoinCheckpointPath(request.checkpoint_dir, request.tmp_name)) {}

  // Rank 0: decides that the save fails, because of `rank` for `why`, and says so in abort.
  ShardCommitResult Abort(int rank, const Status& why) {
    const std::string text = std::to_string(rank) + "\n" + why.message();
    const Status written = WriteText(fs_, tmp_path_, kShardAbortFileName, text);
    if (!written.ok()) {
      LogWarning("could not tell the other ranks that " + request_.final_name +
                 " failed (they will time out): " + written.message());
    }
    return {why.WithContext(request_.final_name), false, rank};
  }

  // Rank r != 0: says why its share failed, in failed-<r>.
  void PublishFailure(const Status& why) {
    const Status written =
        WriteText(fs_, tmp_path_, ShardFailedFileName(request_.rank), why.message());
    if (!written.ok()) {
      LogWarning("could not tell rank 0 that rank " + std::to_string(request_.rank) +
                 "'s share of " + request_.final_name +
                 " failed (it will time out): " + written.message());
    }
  }

  Status Seal() {
    for (DataFileToSeal& data : request_.data_files) RETURN_IF_ERROR(SealDataFile(data));
    request_.data_files.clear();
    return Status::OK();
  }

  ShardCommitResult Lead(CheckpointManager& manager, const MergeShardPartsFn& merge);
  ShardCommitResult Follow();

 private:
  Status Own(const Status& why) const {
    return Status(why.code(),
                  "rank " + std::to_string(request_.rank) + " failed: " + why.message());
  }
  std::string Path(const std::string& name) const { return JoinCheckpointPath(tmp_path_, name); }
  std::string Waited() const { return Seconds(request_.timeout_seconds) + " s"; }
  std::optional<int64_t> EndedBefore(uint32_t rank) const;

  io::FileSystem& fs_;
  ShardCommitRequest& request_;
  const std::string tmp_path_;
};

// The step `rank` ended its training at, when that is before this save's step: it will never
// send a part. One small file read per call, made only for a rank being waited for.
std::optional<int64_t> Share::EndedBefore(uint32_t rank) const {
  const size_t dash = request_.final_name.rfind('-');
  const size_t tmp = request_.tmp_name.rfind(".tmp-");
  if (dash == std::string::npos || tmp == std::string::npos) return std::nullopt;
  const std::string marker = JoinCheckpointPath(
      request_.checkpoint_dir, ShardEndedFileName(request_.final_name.substr(0, dash), rank,
                                                  request_.tmp_name.substr(tmp + 5)));
  Result<bool> there = Exists(fs_, marker);
  if (!there.ok() || !*there) return std::nullopt;
  Result<std::vector<uint8_t>> text = ReadWhole(fs_, marker, 32, true);
  int64_t ended = 0;
  if (!text.ok() || text->empty()) return std::nullopt;
  const char* begin = reinterpret_cast<const char*>(text->data());
  if (std::from_chars(begin, begin + text->size(), ended).ec != std::errc()) return std::nullopt;
  if (ended >= StepOf(request_)) return std::nullopt;
  return ended;
}

ShardCommitResult Share::Lead(CheckpointManager& manager, const MergeShardPartsFn& merge) {
  const uint32_t world = request_.world_size;
  // 1. Wait until every other rank's part is durable, or one of them failed, or time is up.
  Poller poller(request_.timeout_seconds);
  for (;;) {
    std::vector<std::string> listed;
    const io::IoStatus status = fs_.list_dir(tmp_path_, &listed);
    if (!status.ok()) return Abort(0, Own(ToStatus(status)));
    const std::set<std::string> names(listed.begin(), listed.end());
    int missing = -1;
    for (uint32_t r = 1; r < world; ++r) {
      if (names.count(ShardFailedFileName(r)) != 0) {
        return Abort(static_cast<int>(r),
                     Status::Aborted("rank " + std::to_string(r) +
                                     " failed: " + ReadText(fs_, Path(ShardFailedFileName(r)))));
      }
      if (missing < 0 && names.count(ShardPartFileName(r)) == 0) missing = static_cast<int>(r);
    }
    if (missing < 0) break;
    if (const auto ended = EndedBefore(static_cast<uint32_t>(missing))) {
      return Abort(missing, EndedEarly(request_, static_cast<uint32_t>(missing), *ended));
    }
    if (const auto dead = DeadRanks::Get().Find(request_); dead.first >= 0) {
      return Abort(dead.first, KnownDead(dead));
    }
    if (poller.Expired()) {
      const std::string why = "rank " + std::to_string(missing) + " sent no part within " +
                              Waited() + " (it died, hangs, or is slower than the timeout)";
      DeadRanks::Get().Mark(request_, missing,
                            "it sent no part of " + request_.final_name + " within " + Waited());
      return Abort(missing, Status::Aborted(why));
    }
    poller.Sleep();
  }
  // 2. Claim every part: from here no rank can withdraw, so the outcome is rank 0's alone.
  std::vector<std::vector<uint8_t>> parts(world);
  parts[0] = std::move(request_.part);
  for (uint32_t r = 1; r < world; ++r) {
    const io::IoStatus claimed = fs_.rename(Path(ShardPartFileName(r)), Path(ClaimedFileName(r)));
    if (claimed.error_number() == ENOENT) {
      // A rank withdraws its part before it writes why (failed-<r>): wait a moment for the
      // reason, so that every rank reports the failing rank's own error.
      Poller reason(std::min(1.0, request_.timeout_seconds));
      const std::string failed = Path(ShardFailedFileName(r));
      for (Result<bool> told = Exists(fs_, failed); !(told.ok() && *told) && !reason.Expired();
           told = Exists(fs_, failed)) {
        reason.Sleep();
      }
      Result<bool> told = Exists(fs_, failed);
      if (told.ok() && *told) {
        return Abort(static_cast<int>(r), Status::Aborted("rank " + std::to_string(r) +
                                                          " failed: " + ReadText(fs_, failed)));
      }
      return Abort(static_cast<int>(r),
                   Status::Aborted("rank " + std::to_string(r) +
                                   " withdrew its part (it gave up waiting for rank 0)"));
    }
    if (!claimed.ok()) return Abort(0, Own(ToStatus(claimed)));
    Result<std::vector<uint8_t>> bytes =
        ReadWhole(fs_, Path(ClaimedFileName(r)), kMaxPartBytes, true);
    if (!bytes.ok()) return Abort(0, Own(bytes.status()));
    parts[r] = std::move(bytes).value();
  }
  // 3. The global index, in place of the parts.
  Result<std::vector<uint8_t>> index = merge(parts);
  if (!index.ok()) return Abort(0, Own(index.status().WithContext("merging the ranks' parts")));
  for (uint32_t r = 1; r < world; ++r) {
    const Status removed = ToStatus(fs_.remove_file(Path(ClaimedFileName(r))));
    if (!removed.ok()) return Abort(0, Own(removed));
  }
  const Status written = WriteWhole(fs_, tmp_path_, "index", *index, true);
  if (!written.ok()) return Abort(0, Own(written));
  // 4. The usual commit: the directory, then the state file and retention (rank 0 alone).
  const Status moved =
      CommitDirectory(fs_, request_.checkpoint_dir, request_.tmp_name, request_.final_name);
  if (!moved.ok()) {
    // A failure after the rename (syncing the parent) leaves the checkpoint in place, and the
    // other ranks see it committed: say so too, unrecorded (the next start lists it again).
    Result<bool> pending = Exists(fs_, tmp_path_);
    Result<bool> visible =
        Exists(fs_, JoinCheckpointPath(
                        JoinCheckpointPath(request_.checkpoint_dir, request_.final_name), "index"));
    if (pending.ok() && !*pending && visible.ok() && *visible) {
      return {Own(moved).WithContext(request_.final_name), true, -1};
    }
    return Abort(0, Own(moved));
  }
  ShardCommitResult result;
  result.committed = true;
  // The other ranks learn of the commit by finding <final>/index: a best-N retention must not
  // delete it in this pass (the next commit's pass, which needs every rank's part, may).
  result.status = manager
                      .RecordCommitted(request_.final_name, request_.wall_time, request_.score,
                                       OwnDrop::kAtNextCommit)
                      .WithContext(request_.final_name);
  return result;
}

ShardCommitResult Share::Follow() {
  const std::string rank = std::to_string(request_.rank);
  const std::string part = Path(ShardPartFileName(request_.rank));
  // Twice rank 0's wait: a rank that is missing or failed must be found (and blamed) by rank 0
  // before another rank gives up and is blamed instead, even when rank 0 began waiting later.
  const double wait = kFollowerWaits * request_.timeout_seconds;
  Poller poller(wait);
  bool claimed = false;
  for (;;) {
    Result<bool> aborted = Exists(fs_, Path(kShardAbortFileName));
    if (aborted.ok() && *aborted) {
      const std::string text = ReadText(fs_, Path(kShardAbortFileName));
      const size_t newline = text.find('\n');
      int blamed = 0;
      const std::string head = text.substr(0, newline);
      if (std::from_chars(head.data(), head.data() + head.size(), blamed).ec != std::errc()) {
        blamed = 0;  // a damaged abort file still fails the save
      }
      const std::string why = newline == std::string::npos ? text : text.substr(newline + 1);
      if (const int gone = TimedOutRank(why); gone > 0) {
        DeadRanks::Get().Mark(
            request_, gone, "rank 0 found no part of " + request_.final_name + " from it in time");
      }
      return {Status::Aborted(why).WithContext(request_.final_name), false, blamed};
    }
    Result<bool> pending = Exists(fs_, tmp_path_);
    if (pending.ok() && !*pending) {
      // Renamed into place, or removed by a new start of the job.
      const std::string index = JoinCheckpointPath(
          JoinCheckpointPath(request_.checkpoint_dir, request_.final_name), "index");
      Result<bool> committed = Exists(fs_, index);
      if (committed.ok() && *committed) return {Status::OK(), true, -1};
      return {Status::Aborted("the temporary directory " + tmp_path_ +
                              " went away without a commit (a new start of the job removed it?)")
                  .WithContext(request_.final_name),
              false, 0};
    }
    if (const auto ended = claimed ? std::nullopt : EndedBefore(0)) {
      // Rank 0 commits nothing of a step after its end: withdraw, as for a dead rank.
      if (fs_.remove_file(part).ok()) {
        const Status why = EndedEarly(request_, 0, *ended);
        PublishFailure(why);
        return {why.WithContext(request_.final_name), false, 0};
      }
      claimed = true;
      poller.Restart(request_.timeout_seconds);
    }
    if (const auto dead = DeadRanks::Get().Find(request_); dead.first >= 0 && !claimed) {
      // Withdrawn first, so that rank 0 (if it lives) cannot commit without this rank.
      if (fs_.remove_file(part).ok()) {
        PublishFailure(KnownDead(dead));
        return {KnownDead(dead).WithContext(request_.final_name), false, dead.first};
      }
      claimed = true;
      poller.Restart(request_.timeout_seconds);
    }
    if (poller.Expired()) {
      if (claimed) {
        return {Status::Aborted("rank 0 took the parts but neither committed nor aborted within " +
                                Seconds(wait + request_.timeout_seconds) + " s")
                    .WithContext(request_.final_name),
                false, 0};
      }
      // Withdraw the part: once it is gone rank 0 cannot commit without this rank.
      const io::IoStatus withdrawn = fs_.remove_file(part);
      if (withdrawn.ok()) {
        DeadRanks::Get().Mark(request_, 0, "it committed no save within " + Seconds(wait) + " s");
        PublishFailure(Status::Aborted("rank " + rank + " gave up waiting for rank 0 after " +
                                       Seconds(wait) + " s"));
        return {Status::Aborted("no commit from rank 0 within " + Seconds(wait) + " s" +
                                " (it died, hangs, or is slower than the timeout)")
                    .WithContext(request_.final_name),
                false, 0};
      }
      // Gone already (rank 0 claimed it) or not removable: rank 0 decides; wait for it.
      claimed = true;
      poller.Restart(request_.timeout_seconds);
    }
    poller.Sleep();
  }
}

template <typename Body>
ShardCommitResult Guard(const std::string& final_name, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return {
        Status::Internal("sharded commit threw: " + std::string(e.what())).WithContext(final_name),
        false, -1};
  } catch (...) {
    return {
        Status::Internal("sharded commit threw a non-standard exception").WithContext(final_name),
        false, -1};
  }
}

}  // namespace

std::string ShardPartFileName(uint32_t rank) { return "index.part-" + RankDigits(rank); }

std::string ShardFailedFileName(uint32_t rank) { return "failed-" + RankDigits(rank); }

std::string ShardedTempDirName(const std::string& final_name, const std::string& job_token) {
  return final_name + ".tmp-" + job_token;
}

std::string ShardEndedFileName(const std::string& basename, uint32_t rank,
                               const std::string& job_token) {
  return basename + ".ended-" + RankDigits(rank) + ".tmp-" + job_token;
}

bool IsShardEndedFileName(std::string_view name, std::string_view basename) {
  constexpr std::string_view kEnded = ".ended-";
  constexpr std::string_view kTmp = ".tmp-";
  if (!name.starts_with(basename)) return false;
  name.remove_prefix(basename.size());
  if (!name.starts_with(kEnded)) return false;
  name.remove_prefix(kEnded.size());
  if (name.ends_with(".writing")) name.remove_suffix(8);  // WriteText's, left by a crash
  const size_t tmp = name.find(kTmp);
  if (tmp == std::string_view::npos || tmp == 0) return false;
  const std::string_view rank = name.substr(0, tmp);
  if (!std::all_of(rank.begin(), rank.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  return ValidateJobToken(name.substr(tmp + kTmp.size())).ok();
}

Status PublishShardEnded(io::FileSystem& fs, const std::string& checkpoint_dir,
                         const std::string& basename, const std::string& job_token, uint32_t rank,
                         int64_t step) {
  return WriteText(fs, checkpoint_dir, ShardEndedFileName(basename, rank, job_token),
                   std::to_string(step));
}

void RemoveShardEnded(io::FileSystem& fs, const std::string& checkpoint_dir,
                      const std::string& basename, const std::string& job_token,
                      uint32_t world_size) {
  for (uint32_t rank = 0; rank < world_size; ++rank) {
    const std::string path =
        JoinCheckpointPath(checkpoint_dir, ShardEndedFileName(basename, rank, job_token));
    const io::IoStatus removed = fs.remove_file(path);
    if (!removed.ok() && removed.error_number() != ENOENT) {
      LogWarning("could not remove " + path + " (the next start will): " + removed.message());
    }
  }
}

Status ValidateJobToken(std::string_view token) {
  const bool hex = std::all_of(token.begin(), token.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  });
  if (token.empty() || token.size() > 32 || !hex) {
    return Status::InvalidArgument("sharding.job_token must be 1 to 32 hex digits, got \"" +
                                   std::string(token.substr(0, 64)) + "\"");
  }
  return Status::OK();
}

namespace {

// After a failed publish: whether rank 0 may already hold this rank's part. A part that became
// visible (the rename happened, the directory sync after it failed) is withdrawn if it is still
// there, so that rank 0 cannot commit it while this rank reports a failure; one rank 0 has
// claimed already (or a directory already committed) leaves the outcome to rank 0, as for every
// other rank, so that the ranks never disagree (found by the fault sweep under load).
bool PartMayBeRankZeros(io::FileSystem& fs, const std::string& tmp_path, uint32_t rank) {
  const std::string part = JoinCheckpointPath(tmp_path, ShardPartFileName(rank));
  Result<bool> visible = Exists(fs, part);
  if (visible.ok() && *visible) return !fs.remove_file(part).ok();
  Result<bool> claimed =
      Exists(fs, JoinCheckpointPath(tmp_path, kClaimedPrefix + RankDigits(rank)));
  if (claimed.ok() && *claimed) return true;
  Result<bool> pending = Exists(fs, tmp_path);
  return pending.ok() && !*pending;
}

}  // namespace

ShardCommitResult CommitShard(io::FileSystem& fs, CheckpointManager& manager,
                              ShardCommitRequest request, const MergeShardPartsFn& merge) {
  const std::string final_name = request.final_name;
  ShardCommitResult result = Guard(final_name, [&]() -> ShardCommitResult {
    if (const auto dead = DeadRanks::Get().Find(request); dead.first >= 0) {
      // Published like any failure, so that a live rank 0 or peer stops waiting too.
      if (request.rank == 0) {
        request.data_files.clear();
        return Share(fs, request).Abort(dead.first, KnownDead(dead));
      }
      ShardCommitResult failed =
          FailShard(fs, std::move(request), KnownDead(dead).WithContext(final_name));
      failed.failed_rank = dead.first;
      return failed;
    }
    Share share(fs, request);
    const Status sealed = share.Seal();
    if (!sealed.ok()) return FailShard(fs, std::move(request), sealed.WithContext(final_name));
    if (request.rank == 0) return share.Lead(manager, merge);
    const std::string tmp_path = JoinCheckpointPath(request.checkpoint_dir, request.tmp_name);
    const Status published =
        WriteWhole(fs, tmp_path, ShardPartFileName(request.rank), request.part, true);
    if (!published.ok() && !PartMayBeRankZeros(fs, tmp_path, request.rank)) {
      return FailShard(fs, std::move(request), published.WithContext(final_name));
    }
    // Published, or published but not synced (the directory sync after the rename failed) and
    // already claimed by rank 0, whose commit syncs the directory again: rank 0 decides.
    return share.Follow();
  });
  return result;
}

ShardCommitResult FailShard(io::FileSystem& fs, ShardCommitRequest request, const Status& why) {
  const std::string final_name = request.final_name;
  return Guard(final_name, [&]() -> ShardCommitResult {
    request.data_files.clear();
    Share share(fs, request);
    if (request.rank == 0) {
      share.Abort(0, Status(why.code(), "rank 0 failed: " + why.message()));
    } else {
      share.PublishFailure(why);
    }
    return {why, false, static_cast<int>(request.rank)};
  });
}

}  // namespace asyncckpt
