#pragma once

// The engine's own threads beside oneTBB's workers: the commit thread, where fsync and rename
// sleep in the kernel, and the arena pump, which works in the graph's arena while a save is in
// flight, so that encode and write never wait for a worker the training job's own oneTBB work
// holds (issue 17: on 2 cores oneTBB has one worker, and a training step's parallel_for kept it,
// so a save's first write started 0.47 s late).

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "src/engine/save_job.h"

namespace asyncckpt {

/// The name of every engine's commit thread (as pthread_getname_np reports it).
inline constexpr char kCommitThreadName[] = "ckpt-commit";
/// The name of the thread that works in the graph's arena (as pthread_getname_np reports it).
inline constexpr char kPumpThreadName[] = "ckpt-pump";
/// The name of the thread that removes what retention renamed out of the committed namespace.
inline constexpr char kRemoverThreadName[] = "ckpt-remove";

/// Runs commits on one thread, one at a time, in the order they were pushed.
class CommitThread {
 public:
  /// Starts the thread (named kCommitThreadName); `commit` runs there for every pushed save.
  explicit CommitThread(std::function<void(const SavePtr&)> commit);
  /// Runs what was pushed, then joins.
  ~CommitThread();
  CommitThread(const CommitThread&) = delete;
  CommitThread& operator=(const CommitThread&) = delete;
  /// Queues `save` for commit.
  void Push(SavePtr save);

 private:
  void Loop();

  const std::function<void(const SavePtr&)> commit_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<SavePtr> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

/// A thread that, after each Kick, runs `work` (the graph's wait_for_all inside its arena: a
/// waiting thread executes the arena's tasks) until the graph is idle again.
class ArenaPump {
 public:
  /// Starts the thread (named `name`). Also runs other work that a Kick asks for again and
  /// again (the retention remover).
  explicit ArenaPump(std::function<void()> work, const char* name = kPumpThreadName);
  /// Joins; call once the graph is idle.
  ~ArenaPump();
  ArenaPump(const ArenaPump&) = delete;
  ArenaPump& operator=(const ArenaPump&) = delete;
  /// New work entered the graph: run `work` (again) soon.
  void Kick();

 private:
  void Loop();

  const std::function<void()> work_;
  const char* const name_;
  std::mutex mu_;
  std::condition_variable wake_;
  uint64_t kicks_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

/// Runs retention's removals (CheckpointManager::RemoveRenamed) on a thread of its own, so that
/// neither a save's report nor the next commit waits for an older checkpoint's unlinks.
class RetentionRemover {
 public:
  /// Starts the thread (named kRemoverThreadName); `remove` runs there after each Ask.
  explicit RetentionRemover(std::function<void()> remove);
  /// Waits for what was asked, then joins.
  ~RetentionRemover();
  RetentionRemover(const RetentionRemover&) = delete;
  RetentionRemover& operator=(const RetentionRemover&) = delete;
  /// Something was renamed for removal: run `remove` soon.
  void Ask();
  /// Blocks until `remove` has run to its end after every Ask so far.
  void Wait();

 private:
  void Run();
  const std::function<void()> remove_;
  std::mutex mu_;
  std::condition_variable ran_;
  uint64_t asked_ = 0;  // guarded by mu_, as is done_
  uint64_t done_ = 0;
  ArenaPump thread_;  // last: starts once the rest is built
};

}  // namespace asyncckpt
