// Result: the bench's error value. Every failing step returns one with a message; nothing aborts.
#pragma once

#include <string>
#include <utility>

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

}  // namespace qkbench

// Returns the Result of expr from the enclosing function when it failed.
#define QKB_TRY(expr)                                   \
  do {                                                  \
    if (::qkbench::Result qkb_r_ = (expr); !qkb_r_.ok()) \
      return qkb_r_;                                    \
  } while (0)
