// torchrun's environment contract (remat/distributed/environment.h).
#include "remat/distributed/environment.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "remat/util/error.h"

namespace remat::distributed {
namespace {

std::optional<std::string> read_process_environment(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// A whole decimal integer within [low, high]; anything else names the variable and the range.
int64_t parse_integer(const std::string& name, const std::string& value, int64_t low, int64_t high,
                      const std::string& meaning) {
  const auto fail = [&]() {
    throw_value_error("[distributed] " + name + "='" + value + "' must be an integer in [" + std::to_string(low) +
                      ", " + std::to_string(high) + "] (" + meaning + ")");
  };
  if (value.empty() || value.size() > 20) fail();
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(value.c_str(), &end, 10);
  if (errno != 0 || end != value.c_str() + value.size() || parsed < low || parsed > high) fail();
  return parsed;
}

}  // namespace

std::string LaunchEnvironment::describe() const {
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size);
}

LaunchEnvironment read_launch_environment(const EnvironmentReader& reader) {
  const EnvironmentReader read = reader ? reader : EnvironmentReader(read_process_environment);
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  LaunchEnvironment env;
  if (const auto timeout = read("SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS")) {
    // SimpleTuner reads the same variable (a positive number of seconds) for its process group.
    env.timeout = std::chrono::seconds(parse_integer("SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS", *timeout, 1,
                                                     365LL * 24 * 3600, "seconds a rank waits for the others"));
  }
  const auto world = read("WORLD_SIZE");
  if (!world) return env;
  env.world_size = static_cast<int>(parse_integer("WORLD_SIZE", *world, 1, kIntMax, "processes in the run"));
  if (env.world_size == 1) return env;

  const auto required = [&](const std::string& name) {
    const auto value = read(name);
    if (!value) {
      throw_value_error("[distributed] WORLD_SIZE=" + std::to_string(env.world_size) + " but " + name +
                        " is not set; a launcher (torchrun, `remat launch`, a Slurm script) sets RANK, WORLD_SIZE, "
                        "MASTER_ADDR and MASTER_PORT for every process");
    }
    return *value;
  };
  const int64_t last = env.world_size - 1;
  env.rank = static_cast<int>(parse_integer("RANK", required("RANK"), 0, last, "this process among WORLD_SIZE"));
  env.master_addr = required("MASTER_ADDR");
  if (env.master_addr.empty()) {
    throw_value_error("[distributed] MASTER_ADDR is empty; it must name the host of rank 0 (a name or an address)");
  }
  env.master_port =
      static_cast<int>(parse_integer("MASTER_PORT", required("MASTER_PORT"), 1, 65535, "rank 0's rendezvous port"));
  // LOCAL_*: one machine unless the launcher says otherwise.
  env.local_world_size = env.world_size;
  if (const auto local_world = read("LOCAL_WORLD_SIZE")) {
    env.local_world_size = static_cast<int>(
        parse_integer("LOCAL_WORLD_SIZE", *local_world, 1, env.world_size, "processes on this machine"));
  }
  env.local_rank = env.local_world_size == env.world_size ? env.rank : 0;
  if (const auto local = read("LOCAL_RANK")) {
    env.local_rank = static_cast<int>(
        parse_integer("LOCAL_RANK", *local, 0, env.local_world_size - 1, "this process among LOCAL_WORLD_SIZE"));
  } else if (env.local_world_size != env.world_size) {
    throw_value_error("[distributed] LOCAL_WORLD_SIZE=" + std::to_string(env.local_world_size) +
                      " is less than WORLD_SIZE=" + std::to_string(env.world_size) +
                      " (several machines), so LOCAL_RANK must be set too");
  }
  return env;
}

}  // namespace remat::distributed
