#pragma once
/// \file
/// Starting a child process (fork + exec) from a program that has threads: `remat ui`'s training
/// runs and step profiles, `remat launch`'s workers. What happens between fork and exec is
/// written once, here, from async-signal-safe calls only: another thread may have held a lock
/// (malloc's, a stream's) at the moment of the fork.

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "remat/export.h"

namespace remat::util {

/// What to start, and what it inherits.
struct ChildSpec {
  /// The program (argv[0], a path: no PATH search) and its arguments: never a shell, so an
  /// argument holds whatever characters it holds.
  std::vector<std::string> argv;
  /// Exactly this environment ("KEY=VALUE" entries); unset: the parent's.
  std::optional<std::vector<std::string>> env;
  /// The child's working directory; empty: the parent's.
  std::string directory;
  /// Descriptors of the parent that become the child's stdin, stdout and stderr.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  /// The signal the kernel sends the child when the thread that started it ends
  /// (PR_SET_PDEATHSIG, prctl(2); it survives exec); 0: none, the child may outlive the parent.
  /// With one set, a child whose parent is already gone by the time it runs exits at once.
  int parent_death_signal = 0;
};

/// Starts `spec` and returns its pid. The child leads its own process group (pid == pgid: a
/// Ctrl-C at the parent's terminal reaches the parent only, which forwards what each child
/// needs; were the child in that group too, a trainer would get SIGINT twice and abort its
/// checkpoint), starts with every signal at its default action and none blocked (the parent's
/// handlers, and its ignored SIGPIPE, do not carry over), and holds no descriptor of the parent
/// but its three standard ones (a listening socket or another child's pipe would otherwise live
/// on in it). Signals are blocked in the calling thread around the fork, so no handler of the
/// parent runs in the child. Throws c10::ValueError "[component] cannot start 'program': ..."
/// when the child cannot be created, and "[component] cannot run 'program': <reason>" when it
/// cannot enter `directory` or execute the program (the reason comes back through a
/// close-on-exec pipe; that child has been reaped).
REMAT_API pid_t start_child(const ChildSpec& spec, const std::string& component);

/// Sends `signal_number` to the process group of a child start_child made (the child and
/// whatever it started), or to the child alone when its group does not exist.
REMAT_API void signal_child_group(pid_t pid, int signal_number);

}  // namespace remat::util
