#include "src/util/log.h"

#include <iostream>
#include <mutex>
#include <utility>

namespace asyncckpt {

namespace {
std::mutex& LogMutex() {
  static std::mutex mutex;
  return mutex;
}
std::function<void(std::string_view)>& LogSink() {
  static std::function<void(std::string_view)> sink;
  return sink;
}
}  // namespace

void LogLine(std::string_view message) {
  std::lock_guard lock(LogMutex());
  if (LogSink()) {
    LogSink()(message);
  } else {
    std::cerr << "asyncckpt: " << message << '\n';
  }
}

std::function<void(std::string_view)> SetLogSink(std::function<void(std::string_view)> sink) {
  std::lock_guard lock(LogMutex());
  return std::exchange(LogSink(), std::move(sink));
}

}  // namespace asyncckpt
