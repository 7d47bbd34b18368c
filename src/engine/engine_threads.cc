// The engine's commit thread, arena pump and retention remover (engine_threads.h).

#include "src/engine/engine_threads.h"

#include <pthread.h>

#include <algorithm>

namespace asyncckpt {

CommitThread::CommitThread(std::function<void(const SavePtr&)> commit)
    : commit_(std::move(commit)), thread_([this] { Loop(); }) {}

CommitThread::~CommitThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void CommitThread::Push(SavePtr save) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(save));
  }
  wake_.notify_one();
}

void CommitThread::Loop() {
  // Named, so that a profile (and a test) can tell commit work from the graph's workers.
  pthread_setname_np(pthread_self(), kCommitThreadName);
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and nothing left
    SavePtr save = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    commit_(save);
    save.reset();
    lock.lock();
  }
}

ArenaPump::ArenaPump(std::function<void()> work, const char* name)
    : work_(std::move(work)), name_(name), thread_([this] { Loop(); }) {}

ArenaPump::~ArenaPump() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void ArenaPump::Kick() {
  {
    std::lock_guard lock(mu_);
    ++kicks_;
  }
  wake_.notify_one();
}

void ArenaPump::Loop() {
  pthread_setname_np(pthread_self(), name_);
  uint64_t seen = 0;
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || kicks_ != seen; });
    if (stop_) return;
    seen = kicks_;
    lock.unlock();
    work_();  // returns once the graph is idle; a Kick meanwhile brings it back at once
    lock.lock();
  }
}

RetentionRemover::RetentionRemover(std::function<void()> remove)
    : remove_(std::move(remove)), thread_([this] { Run(); }, kRemoverThreadName) {}

RetentionRemover::~RetentionRemover() { Wait(); }

void RetentionRemover::Ask() {
  {
    std::lock_guard lock(mu_);
    ++asked_;
  }
  thread_.Kick();
}

// What was renamed by the time `asked` is read is removed when remove_ returns; an Ask after the
// read kicks the thread again.
void RetentionRemover::Run() {
  uint64_t asked = 0;
  {
    std::lock_guard lock(mu_);
    asked = asked_;
  }
  remove_();
  {
    std::lock_guard lock(mu_);
    done_ = std::max(done_, asked);
  }
  ran_.notify_all();
}

void RetentionRemover::Wait() {
  std::unique_lock lock(mu_);
  ran_.wait(lock, [&] { return done_ == asked_; });
}

}  // namespace asyncckpt
