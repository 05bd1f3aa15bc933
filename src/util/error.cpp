#include "remat/util/error.h"

#include <c10/util/Exception.h>

#include "remat/compat.h"

namespace remat {

void throw_value_error(const std::string& message) {
  throw c10::ValueError(message, compat::no_backtrace());
}

}  // namespace remat
