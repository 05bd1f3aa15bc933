#pragma once
// What ProcessGroup holds (remat/distributed/process_group.h): c10d's store and process group.
#include "c10d_headers.h"
#include "remat/distributed/process_group.h"

namespace remat::distributed {

struct ProcessGroup::Impl {
  LaunchEnvironment env;
  Backend backend = Backend::gloo;
  c10::intrusive_ptr<c10d::Store> store;
  /// What the Reducer and every collective use (on PyTorch 2.x, a ProcessGroup holding the backend).
  c10::intrusive_ptr<c10d::ProcessGroup> group;
};

/// The message of a failed collective: this rank, what it was doing, the timeout, c10d's words.
std::string collective_failure_message(const LaunchEnvironment& env, const std::string& why, const std::string& c10d);

struct ProcessGroup::PendingSum::State {
  LaunchEnvironment env;
  std::string why;
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor sum;  ///< the flat tensor the collective sums into
};

}  // namespace remat::distributed
