#pragma once
// The message of the c10::ValueError (remat's bad-input error) that `fn` throws; a test failure
// when it throws none.

#include <string>
#include <utility>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

namespace remat::testing {

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const c10::ValueError& e) {
    // The message with one line end, whatever the release: LibTorch 1.13's what() appends the (empty)
    // backtrace after a line end, 2.x's what() is the message alone.
    std::string message = e.what_without_backtrace();
    if (message.empty() || message.back() != '\n') message += '\n';
    return message;
  }
  ADD_FAILURE() << "expected a c10::ValueError";
  return "";
}

/// error_of's message without the line end c10 appends, for comparing whole sentences.
template <class Fn>
std::string error_text(Fn&& fn) {
  std::string message = error_of(std::forward<Fn>(fn));
  while (!message.empty() && message.back() == '\n') message.pop_back();
  return message;
}

}  // namespace remat::testing
