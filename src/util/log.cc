// The logger behind Log and SetLogSink: stderr, or the sink set last.

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

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
  }
  return "INFO";
}

void Log(LogLevel level, std::string_view message) {
  std::lock_guard lock(LogMutex());
  if (LogSink()) {
    LogSink()(level, message);
  } else if (level == LogLevel::kInfo) {
    std::cerr << "asyncckpt: " << message << '\n';
  } else {
    std::cerr << "asyncckpt: " << LogLevelName(level) << ": " << message << '\n';
  }
}

LogSinkFunction SetLogSink(LogSinkFunction sink) {
  std::lock_guard lock(LogMutex());
  return std::exchange(LogSink(), std::move(sink));
}

}  // namespace asyncckpt
