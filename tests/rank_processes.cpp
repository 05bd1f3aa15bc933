// Processes of a multi-process run, for tests (rank_processes.h).
#include "rank_processes.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace remat::testing {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd);
    throw std::runtime_error("could not bind a port");
  }
  const int port = ntohs(address.sin_port);
  ::close(fd);
  return port;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

RankProcess start_rank(const std::string& program, const std::vector<std::string>& args, int rank, int world,
                       int port, const std::string& log_path, const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> variables;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq != std::string::npos) variables[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  variables["RANK"] = std::to_string(rank);
  variables["WORLD_SIZE"] = std::to_string(world);
  variables["LOCAL_RANK"] = std::to_string(rank);
  variables["LOCAL_WORLD_SIZE"] = std::to_string(world);
  variables["MASTER_ADDR"] = "127.0.0.1";
  variables["MASTER_PORT"] = std::to_string(port);
  for (const auto& [k, v] : env) variables[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : variables) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings{program};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  RankProcess process;
  process.rank = rank;
  process.log_path = log_path;
  const int rc = posix_spawn(&process.pid, program.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("posix_spawn " + program + ": " + std::strerror(rc));
  return process;
}

RankExit wait_rank(const RankProcess& process, std::chrono::seconds deadline) {
  const auto start = std::chrono::steady_clock::now();
  RankExit out;
  int status = 0;
  while (true) {
    const pid_t done = ::waitpid(process.pid, &status, WNOHANG);
    if (done == process.pid) break;
    if (std::chrono::steady_clock::now() - start > deadline) {
      ::kill(process.pid, SIGKILL);
      ::waitpid(process.pid, &status, 0);
      out.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) out.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) out.signal = WTERMSIG(status);
  out.log = read_text(process.log_path);
  return out;
}

std::vector<RankExit> run_ranks(const std::string& program, const std::vector<std::string>& args, int world,
                                const std::string& log_dir, std::chrono::seconds deadline,
                                const std::map<std::string, std::string>& env) {
  const int port = free_port();
  std::vector<RankProcess> processes;
  for (int r = 0; r < world; ++r) {
    processes.push_back(start_rank(program, args, r, world, port, log_dir + "/rank" + std::to_string(r) + ".log", env));
  }
  std::vector<RankExit> exits;
  for (const auto& p : processes) exits.push_back(wait_rank(p, deadline));
  return exits;
}

}  // namespace remat::testing
