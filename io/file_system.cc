#include "asyncckpt/file_system.h"

#include <cstring>
#include <string>

namespace asyncckpt::io {
namespace {

// strerror() may share a buffer between threads; strerror_r comes in a GNU flavour (returns
// the text) and an XSI one (fills the buffer), and the overloads below accept either.
[[maybe_unused]] const char* StrerrorResult(const char* text, const char* /*buffer*/) {
  return text;
}
[[maybe_unused]] const char* StrerrorResult(int rc, const char* buffer) {
  return rc == 0 ? buffer : "Unknown error";
}

std::string ErrnoText(int error_number) {
  char buffer[256] = {};
  return StrerrorResult(strerror_r(error_number, buffer, sizeof(buffer)), buffer);
}

}  // namespace

IoStatus IoStatus::FromErrno(int error_number, std::string_view op, std::string_view path) {
  if (error_number == 0) return IoStatus();
  std::string message;
  message.reserve(op.size() + path.size() + 48);
  message.append(op).append(" ").append(path).append(": ").append(ErrnoText(error_number));
  return IoStatus(error_number, std::move(message));
}

std::unique_ptr<FileSystem> NewDefaultFileSystem(const IoOptions& options,
                                                 std::string* fallback_reason) {
  std::string reason;
  std::unique_ptr<FileSystem> fs;
  if (!options.force_posix_io) {
    std::string why;
    fs = NewUringFileSystem(options, &why);
    if (fs == nullptr) reason = "io_uring unavailable (" + why + "); using POSIX I/O";
  }
  if (fs == nullptr) fs = NewPosixFileSystem();
  if (fallback_reason != nullptr) *fallback_reason = std::move(reason);
  return fs;
}

}  // namespace asyncckpt::io
