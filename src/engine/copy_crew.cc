#include "src/engine/copy_crew.h"

namespace asyncckpt {

CopyCrew::CopyCrew(unsigned helpers) {
  for (unsigned i = 0; i < helpers; ++i) threads_.emplace_back([this] { Loop(); });
}

CopyCrew::~CopyCrew() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& thread : threads_) thread.join();
}

void CopyCrew::Run(size_t n, const std::function<void(size_t)>& body) {
  // A wave of one chunk (streaming through a small budget) is not worth waking anyone for.
  if (n <= 1 || threads_.empty()) {
    for (size_t i = 0; i < n; ++i) body(i);
    return;
  }
  {
    std::lock_guard lock(mu_);
    body_ = &body;
    n_ = n;
    next_ = 0;
    finished_ = 0;
    ++generation_;
  }
  wake_.notify_all();
  Work();
  // Every helper takes part in every generation, so none can run a stale body later.
  std::unique_lock lock(mu_);
  done_.wait(lock, [&] { return finished_ == threads_.size(); });
}

void CopyCrew::Work() {
  for (size_t i = next_.fetch_add(1); i < n_; i = next_.fetch_add(1)) (*body_)(i);
}

void CopyCrew::Loop() {
  uint64_t seen = 0;
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    lock.unlock();
    Work();
    lock.lock();
    ++finished_;
    done_.notify_all();
  }
}

}  // namespace asyncckpt
