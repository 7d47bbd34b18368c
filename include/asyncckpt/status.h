#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace asyncckpt {

/// What kind of failure a Status reports.
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kIOError,
  kCorruption,
  kCancelled,
  kOutOfRange,
  kFailedPrecondition,
  kUnavailable,
  kInternal,
  kAborted,
  kResourceExhausted,
};

/// The outcome of an operation: OK, or a code and a message naming what went wrong.
class [[nodiscard]] Status {
 public:
  /// Success.
  Status() = default;
  /// A failure (or success when code is kOk) with a message.
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  /// Success.
  static Status OK() { return Status(); }
  /// A caller passed something that is not acceptable (bad option, bad name, bad shape).
  static Status InvalidArgument(std::string msg) {
    return {StatusCode::kInvalidArgument, std::move(msg)};
  }
  /// A file, checkpoint or tensor does not exist.
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  /// Something that must be unique exists already.
  static Status AlreadyExists(std::string msg) {
    return {StatusCode::kAlreadyExists, std::move(msg)};
  }
  /// The operating system reported an I/O failure.
  static Status IOError(std::string msg) { return {StatusCode::kIOError, std::move(msg)}; }
  /// Data on disk is damaged or hostile.
  static Status Corruption(std::string msg) { return {StatusCode::kCorruption, std::move(msg)}; }
  /// The operation was cancelled, e.g. a save cancelled after an earlier stage failed.
  static Status Cancelled(std::string msg) { return {StatusCode::kCancelled, std::move(msg)}; }
  /// The end of the data was reached (the input pipeline's end-of-data signal).
  static Status OutOfRange(std::string msg) { return {StatusCode::kOutOfRange, std::move(msg)}; }
  /// The call is not valid in the current state.
  static Status FailedPrecondition(std::string msg) {
    return {StatusCode::kFailedPrecondition, std::move(msg)};
  }
  /// A facility (GPU, io_uring, a pre-empted worker) is not available now.
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  /// A bug or an unexpected exception.
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  /// The operation was aborted by a conflict or a pre-emption and may succeed when retried
  /// from a recreated session (TensorFlow's AbortedError).
  static Status Aborted(std::string msg) { return {StatusCode::kAborted, std::move(msg)}; }
  /// Memory or another resource ran out (an allocation failed, a bound was reached).
  static Status ResourceExhausted(std::string msg) {
    return {StatusCode::kResourceExhausted, std::move(msg)};
  }

  /// True on success.
  bool ok() const { return code_ == StatusCode::kOk; }
  /// The failure kind.
  StatusCode code() const { return code_; }
  /// The message alone.
  const std::string& message() const { return message_; }
  /// "OK" or "<code name>: <message>".
  std::string ToString() const;
  /// A copy whose message is prefixed with context ("saving model.ckpt-10: ...").
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

/// The name of a status code, e.g. "Corruption".
std::string_view StatusCodeName(StatusCode code);

/// A value of type T, or the Status that says why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  /// Holds a value.
  Result(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  /// Holds a failure; status must not be OK.
  Result(Status status) : value_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(value_).ok()) value_ = Status::Internal("Result built from an OK status");
  }

  /// True when a value is held.
  bool ok() const { return std::holds_alternative<T>(value_); }
  /// OK when a value is held, else the failure.
  Status status() const { return ok() ? Status::OK() : std::get<Status>(value_); }
  /// The value; only valid when ok().
  T& value() & { return std::get<T>(value_); }
  /// The value; only valid when ok().
  const T& value() const& { return std::get<T>(value_); }
  /// The value, moved out; only valid when ok().
  T&& value() && { return std::get<T>(std::move(value_)); }
  /// The value; only valid when ok().
  T& operator*() & { return value(); }
  /// The value; only valid when ok().
  const T& operator*() const& { return value(); }
  /// Member access to the value; only valid when ok().
  T* operator->() { return &value(); }
  /// Member access to the value; only valid when ok().
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> value_;
};

}  // namespace asyncckpt
