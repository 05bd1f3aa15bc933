#pragma once
// The message of the c10::ValueError (remat's bad-input error) that `fn` throws; a test failure
// when it throws none.

#include <string>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

namespace remat::testing {

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const c10::ValueError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a c10::ValueError";
  return "";
}

}  // namespace remat::testing
