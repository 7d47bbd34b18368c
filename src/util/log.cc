// The logger behind LogLine and SetLogSink: stderr, or the sink set last.

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
LogSinkFunction& LogSink() {
  static LogSinkFunction sink;
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

LogSinkFunction SetLogSink(LogSinkFunction sink) {
  std::lock_guard lock(LogMutex());
  return std::exchange(LogSink(), std::move(sink));
}

}  // namespace asyncckpt
