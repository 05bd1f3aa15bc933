// The run's processes over c10d (remat/distributed/process_group.h).
#include "remat/distributed/process_group.h"

#include <cstdlib>

#include "process_group_impl.h"
#include "remat/util/error.h"

#ifdef REMAT_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace remat::distributed {
namespace {

std::string timeout_text(const LaunchEnvironment& env) {
  return std::to_string(env.timeout.count()) + " s (SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS)";
}

bool is_loopback(const std::string& address) {
  return address == "localhost" || address.rfind("127.", 0) == 0 || address == "::1";
}

// Gloo's network device: the interface GLOO_SOCKET_IFNAME names (as in PyTorch), loopback for a
// run on one machine addressed as such, else the interface this host's name resolves to.
std::shared_ptr<gloo::transport::Device> gloo_device(const LaunchEnvironment& env) {
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface && *interface) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  }
  if (is_loopback(env.master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

c10::intrusive_ptr<c10d::Store> open_store(const LaunchEnvironment& env) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = env.rank == 0;
  options.numWorkers = static_cast<std::size_t>(env.world_size);
  options.waitWorkers = true;
  options.timeout = env.timeout;
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  std::string reason;
  try {
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const c10::Error& e) {
    reason = e.what_without_backtrace();
  } catch (const std::exception& e) {  // c10d's socket errors are std::runtime_errors
    reason = e.what();
  }
  if (env.rank == 0) {
    throw_value_error("[distributed] rank 0 could not open the rendezvous store at " + where +
                        " (MASTER_ADDR:MASTER_PORT) or not every rank joined it within " + timeout_text(env) +
                        ": " + reason +
                        ". If the port is in use (another run?), choose another MASTER_PORT; if ranks are missing, "
                        "check that all WORLD_SIZE=" + std::to_string(env.world_size) + " processes were started");
  }
  throw_value_error("[distributed] " + env.describe() + " could not reach rank 0's rendezvous store at " + where +
                    " (MASTER_ADDR:MASTER_PORT) within " + timeout_text(env) + ": " + reason +
                    ". Check that rank 0 is running and that this machine can reach that address and port");
}

// The first line where two texts differ, quoted for a message.
std::string first_difference(const std::string& a, const std::string& b) {
  size_t line_start = 0;
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  for (; i < n && a[i] == b[i]; ++i) {
    if (a[i] == '\n') line_start = i + 1;
  }
  const auto line_of = [&](const std::string& s) {
    const size_t end = s.find('\n', line_start);
    std::string line = s.substr(line_start, end == std::string::npos ? std::string::npos : end - line_start);
    return line.size() > 200 ? line.substr(0, 200) + "..." : line;
  };
  return "'" + line_of(a) + "' vs '" + line_of(b) + "'";
}

}  // namespace

std::string to_string(Backend backend) { return backend == Backend::nccl ? "nccl" : "gloo"; }

Backend choose_backend(const std::string& requested, const c10::Device& device) {
  constexpr bool kWithCuda =
#ifdef REMAT_WITH_CUDA
      true;
#else
      false;
#endif
  if (requested != "" && requested != "auto" && requested != "gloo" && requested != "nccl") {
    throw_value_error(std::string("[distributed] ") + kBackendVariable + "='" + requested +
                      "' is not a backend; valid: auto (NCCL on CUDA, Gloo on CPU), gloo, nccl");
  }
  const Backend backend = requested == "nccl" || ((requested.empty() || requested == "auto") && device.is_cuda())
                              ? Backend::nccl
                              : Backend::gloo;
  if (backend == Backend::nccl && (!device.is_cuda() || !kWithCuda)) {
    throw_value_error(std::string("[distributed] the NCCL backend needs a CUDA device and a build with REMAT_WITH_CUDA; "
                                  "this run trains on ") +
                      device.str() + (kWithCuda ? "" : " in a build without CUDA") + ". Use " + kBackendVariable +
                      "=gloo");
  }
  if (backend == Backend::gloo && device.is_cuda() && !kWithCuda) {
    throw_value_error("[distributed] Gloo on " + device.str() + " needs a build with REMAT_WITH_CUDA");
  }
  return backend;
}

std::string collective_failure_message(const LaunchEnvironment& env, const std::string& why, const std::string& c10d) {
  return "[distributed] " + env.describe() + ": " + why +
         " failed: another rank stopped (it died, was killed, or failed) or did not answer within " + timeout_text(env) +
         ". c10d: " + c10d;
}

void with_collective_errors(const LaunchEnvironment& env, const std::string& why,
                            const std::function<void()>& operation) {
  try {
    operation();
  } catch (const c10::ValueError&) {
    throw;  // already ours
  } catch (const c10::Error& e) {
    throw_value_error(collective_failure_message(env, why, e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw_value_error(collective_failure_message(env, why, e.what()));
  }
}

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

const LaunchEnvironment& ProcessGroup::environment() const { return impl_->env; }
Backend ProcessGroup::backend() const { return impl_->backend; }

std::unique_ptr<ProcessGroup> ProcessGroup::connect(const LaunchEnvironment& env, Backend backend) {
  TORCH_CHECK_VALUE(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size, "[distributed] rank ",
                    env.rank, " of ", env.world_size, " is not a place in a run");
  auto impl = std::make_unique<Impl>();
  impl->env = env;
  impl->backend = backend;
  impl->store = open_store(env);
  with_collective_errors(env, "forming the process group", [&]() {
    if (backend == Backend::gloo) {
      auto options = c10d::ProcessGroupGloo::Options::create(env.timeout);
      options->devices.push_back(gloo_device(env));
      auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, env.rank, env.world_size, options);
      impl->group = compat::as_process_group(impl->store, env.rank, env.world_size, gloo, c10::DeviceType::CPU,
                                             "gloo", env.timeout);
    } else {
#ifdef REMAT_WITH_CUDA
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = env.timeout;
      auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl->store, env.rank, env.world_size, options);
      impl->group = compat::as_process_group(impl->store, env.rank, env.world_size, nccl, c10::DeviceType::CUDA,
                                             "nccl", env.timeout);
#else
      throw_value_error("[distributed] NCCL needs a build with REMAT_WITH_CUDA");
#endif
    }
  });
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

void ProcessGroup::barrier(const std::string& why) {
  with_collective_errors(impl_->env, "waiting for every rank (" + why + ")",
                         [&]() { impl_->group->barrier()->wait(); });
}

void ProcessGroup::broadcast(std::vector<at::Tensor>& tensors, int root, const std::string& why) {
  with_collective_errors(impl_->env, why, [&]() {
    c10d::BroadcastOptions options;
    options.rootRank = root;
    // One tensor per call: Gloo broadcasts a list only as one tensor per device.
    for (auto& t : tensors) {
      std::vector<at::Tensor> one{t};
      impl_->group->broadcast(one, options)->wait();
    }
  });
}

void ProcessGroup::all_reduce_sum(std::vector<at::Tensor>& tensors, const std::string& why) {
  with_collective_errors(impl_->env, why, [&]() {
    for (auto& t : tensors) {
      std::vector<at::Tensor> one{t};
      impl_->group->allreduce(one)->wait();
    }
  });
}

ProcessGroup::PendingSum::PendingSum() = default;
ProcessGroup::PendingSum::PendingSum(PendingSum&&) noexcept = default;
ProcessGroup::PendingSum& ProcessGroup::PendingSum::operator=(PendingSum&&) noexcept = default;
ProcessGroup::PendingSum::~PendingSum() = default;

at::Tensor ProcessGroup::PendingSum::wait() {
  TORCH_CHECK(state_, "[distributed] wait() on an empty PendingSum");
  if (state_->work) {
    with_collective_errors(state_->env, state_->why, [&]() { state_->work->wait(); });
    state_->work.reset();
  }
  return state_->sum;
}

ProcessGroup::PendingSum ProcessGroup::all_reduce_sum_async(std::vector<at::Tensor> tensors, const std::string& why) {
  PendingSum pending;
  pending.state_ = std::make_unique<PendingSum::State>();
  pending.state_->env = impl_->env;
  pending.state_->why = why;
  // One flat tensor: a single collective for all of them.
  with_collective_errors(impl_->env, why, [&]() {
    std::vector<at::Tensor> flat;
    for (const auto& t : tensors) flat.push_back(t.detach().reshape(-1));
    std::vector<at::Tensor> sum{at::cat(flat)};
    pending.state_->sum = sum[0];
    pending.state_->work = impl_->group->allreduce(sum);
  });
  return pending;
}

void ProcessGroup::check_same_on_all_ranks(const std::string& what, const std::string& value) {
  const auto& env = impl_->env;
  const std::string prefix = "remat/same/" + what + "/";
  with_collective_errors(env, "comparing " + what + " between ranks", [&]() {
    impl_->store->set(prefix + std::to_string(env.rank), std::vector<uint8_t>(value.begin(), value.end()));
    for (int other = 0; other < env.world_size; ++other) {
      if (other == env.rank) continue;
      const auto bytes = impl_->store->get(prefix + std::to_string(other));
      const std::string theirs(bytes.begin(), bytes.end());
      if (theirs != value) {
        throw_value_error("[distributed] " + env.describe() + ": " + what + " differs from rank " +
                          std::to_string(other) + "'s: " + first_difference(value, theirs) +
                          " (this rank's first). Every rank must run the same configuration");
      }
    }
  });
}

}  // namespace remat::distributed
