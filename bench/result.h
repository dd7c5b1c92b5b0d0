// Result: the bench's error value. Every failing step returns one with a message; nothing aborts.
#pragma once

#include <string>
#include <utility>

#include "qksoftmax/qksoftmax.h"

namespace qkbench {

class Result {
 public:
  Result() = default;
  explicit Result(std::string message) : message_(std::move(message)) {}

  bool ok() const { return message_.empty(); }
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

// The Result of a qksoftmax call: its Status's message after what.
inline Result library_result(const qksoftmax::Status& s, const char* what) {
  if (s.ok()) return {};
  return Result(std::string(what) + ": " + s.message());
}

}  // namespace qkbench

// Returns the Result of expr from the enclosing function when it failed.
#define QKB_TRY(expr)                                   \
  do {                                                  \
    if (::qkbench::Result qkb_r_ = (expr); !qkb_r_.ok()) \
      return qkb_r_;                                    \
  } while (0)
