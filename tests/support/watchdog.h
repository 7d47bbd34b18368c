#pragma once

// Test support: runs a piece of a test in a forked child under a watchdog, for calls that
// might block forever (an open() of a FIFO). The test then asserts that the call ended on its
// own, never how fast: the limit only keeps a hang from stalling the suite.

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>

namespace asyncckpt::testing_support {

/// What a body run by RunInChild() did.
struct ChildOutcome {
  /// True when the child ended on its own; false when the watchdog killed it (or fork failed).
  bool ended_on_its_own = false;
  /// The body's return value (the child's exit code); -1 when it did not end on its own.
  int exit_code = -1;
  /// The text the body left in its `message` argument.
  std::string message;
};

/// Runs `body` in a forked child, which exits with body's return value (0..255) after passing
/// its message back; kills the child when it has not ended after `limit`. The body must not
/// use threads the parent started (oneTBB, a ring shared with them): after fork() only the
/// calling thread exists.
inline ChildOutcome RunInChild(const std::function<int(std::string* message)>& body,
                               std::chrono::milliseconds limit) {
  ChildOutcome outcome;
  int fds[2];
  if (::pipe(fds) != 0) {
    outcome.message = "pipe failed";
    return outcome;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    outcome.message = "fork failed";
    return outcome;
  }
  if (pid == 0) {
    ::close(fds[0]);
    std::string message;
    const int code = body(&message);
    size_t done = 0;
    while (done < message.size()) {
      const ssize_t n = ::write(fds[1], message.data() + done, message.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::_exit(code);  // no atexit handlers, no gtest tear-down in the child
  }
  ::close(fds[1]);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  // Reads the pipe until the child closes it (by exiting) or the deadline passes.
  bool closed = false;
  char buffer[4096];
  while (!closed) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd readable{fds[0], POLLIN, 0};
    const int ready = ::poll(&readable, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    const ssize_t n = ::read(fds[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      closed = true;
    } else {
      outcome.message.append(buffer, static_cast<size_t>(n));
    }
  }
  ::close(fds[0]);
  if (!closed) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (closed && WIFEXITED(status)) {
    outcome.ended_on_its_own = true;
    outcome.exit_code = WEXITSTATUS(status);
  }
  return outcome;
}

}  // namespace asyncckpt::testing_support
