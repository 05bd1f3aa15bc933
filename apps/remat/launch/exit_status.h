#pragma once
// How a worker process ended, in words and as an exit code (the launcher's messages and its own
// exit code follow the shell: 128 + the signal for a process a signal ended).

#include <string>

namespace remat::cli::launch {

/// The signal's name ("SIGKILL" for 9), or "SIG<n>" for a number without a common name.
std::string signal_name(int signal_number);

/// A waitpid() status in words: "exited with code 3", "was killed by signal 9 (SIGKILL)".
std::string describe_wait_status(int status);

/// A waitpid() status as a shell reports it: the exit code, or 128 + the signal.
int exit_code_of(int status);

/// True when the process exited with code 0.
bool succeeded(int status);

}  // namespace remat::cli::launch
