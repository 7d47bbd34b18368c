#pragma once

// Threads that help the training thread copy a snapshot into staging. oneTBB lends at most
// cores - 1 workers to all arenas together, and they are often busy elsewhere (the graph, the
// training step's own loops) at the moment of a save; a copy that runs on the training thread
// alone takes twice as long. The helpers sleep between saves and join every copy.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace asyncckpt {

/// A fixed crew of helper threads for parallel snapshot copies. Run is called from one thread
/// at a time (the training thread); the crew is idle between calls.
class CopyCrew {
 public:
  /// Starts `helpers` threads (0: Run works on the caller alone).
  explicit CopyCrew(unsigned helpers);
  /// Stops and joins the helpers; no Run may be in progress.
  ~CopyCrew();
  CopyCrew(const CopyCrew&) = delete;
  CopyCrew& operator=(const CopyCrew&) = delete;

  /// Runs body(i) for every i in [0, n) on the caller and every helper; returns when all ran.
  /// body must not throw.
  void Run(size_t n, const std::function<void(size_t)>& body);
  /// Helper threads (not counting the caller).
  size_t helpers() const { return threads_.size(); }

 private:
  void Work();
  void Loop();

  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> threads_;
  const std::function<void(size_t)>* body_ = nullptr;  // written under mu_ while helpers idle
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
  size_t finished_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace asyncckpt
