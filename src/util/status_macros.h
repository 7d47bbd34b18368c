#pragma once

// Early-return helpers for Status / Result code paths. Internal: never in a public header.

#include "asyncckpt/status.h"

#define ASYNCCKPT_CONCAT_INNER(a, b) a##b
#define ASYNCCKPT_CONCAT(a, b) ASYNCCKPT_CONCAT_INNER(a, b)

/// Returns the Status of `expr` from the enclosing function when it is not OK.
#define RETURN_IF_ERROR(expr)              \
  do {                                     \
    ::asyncckpt::Status _status_ = (expr); \
    if (!_status_.ok()) return _status_;   \
  } while (false)

/// Evaluates a Result expression; returns its Status on failure, else moves the value into lhs.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(ASYNCCKPT_CONCAT(_result_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(result, lhs, expr) \
  auto result = (expr);                          \
  if (!result.ok()) return result.status();      \
  lhs = std::move(result).value()
