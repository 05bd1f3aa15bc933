// Child processes (remat/util/child_process.h), checked from the child's side: what it was given
// (arguments, environment, directory, standard streams), what it was not (the parent's other
// descriptors, its ignored signals), its own process group, and the errors that name the program.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <sstream>
#include <string>

#include "remat/util/child_process.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::util {
namespace {
namespace child_process_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::error_of;
using remat::testing::error_text;
using remat::testing::TempDir;

struct Finished {
  std::string out;
  int exit_code = -1;
};

// Runs `script` with /bin/sh under `spec` (its argv is set here), its stdout on a pipe read to
// the end, and waits for it.
Finished run_shell(ChildSpec spec, const std::string& script) {
  int out[2];
  EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  spec.argv = {"/bin/sh", "-c", script};
  spec.stdin_fd = null_fd;
  spec.stdout_fd = out[1];
  spec.stderr_fd = out[1];
  const pid_t pid = start_child(spec, "test");
  ::close(out[1]);
  ::close(null_fd);
  Finished result;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(out[0], buffer, sizeof buffer)) > 0) result.out.append(buffer, static_cast<size_t>(n));
  ::close(out[0]);
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

TEST(ChildProcess, ArgumentsEnvironmentAndDirectoryAreTheSpecs) {
  TempDir dir;
  ChildSpec spec;
  spec.env = std::vector<std::string>{"ONLY=this value"};
  spec.directory = dir.path().string();
  const Finished f = run_shell(spec, "echo \"$ONLY|${HOME:-unset}|$(pwd)\"; exit 3");
  EXPECT_EQ(f.out, "this value|unset|" + dir.path().string() + "\n");
  EXPECT_EQ(f.exit_code, 3);
}

TEST(ChildProcess, ItLeadsItsOwnGroupAndHoldsNoOtherDescriptorOfTheParent) {
  int kept[2];
  ASSERT_EQ(::pipe(kept), 0);  // not close-on-exec: a plain fork + exec would pass these on
  struct sigaction ignore {}, previous {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &previous);  // ignored dispositions survive exec unless reset
  const std::string script = "echo $$ $(cut -d' ' -f5 /proc/$$/stat); "
                             "[ -e /proc/$$/fd/" + std::to_string(kept[0]) + " ] && echo open || echo closed; "
                             "grep SigIgn /proc/$$/status";
  const Finished f = run_shell(ChildSpec{}, script);
  ::sigaction(SIGPIPE, &previous, nullptr);
  ::close(kept[0]);
  ::close(kept[1]);
  std::istringstream lines(f.out);
  std::string pid, pgid, fd_state, sig_ign_label, sig_ign;
  lines >> pid >> pgid >> fd_state >> sig_ign_label >> sig_ign;
  EXPECT_EQ(pid, pgid) << f.out;
  EXPECT_EQ(fd_state, "closed") << f.out;
  // No ignored signal but glibc's own two (32 and 33, NPTL's: sigaction refuses them, so a
  // parent's environment that ignores them passes that on to every program it starts).
  const uint64_t ignored = std::stoull(sig_ign, nullptr, 16);
  const uint64_t glibc_reserved = (uint64_t{1} << 31) | (uint64_t{1} << 32);
  EXPECT_EQ(ignored & ~glibc_reserved, 0u) << f.out;
}

TEST(ChildProcess, AProgramThatCannotRunIsAnErrorNamingIt) {
  ChildSpec spec;
  spec.argv = {"/nonexistent/remat-test-program"};
  spec.stdin_fd = spec.stdout_fd = spec.stderr_fd = STDERR_FILENO;
  EXPECT_EQ(error_text([&] { start_child(spec, "test"); }),
            "[test] cannot run '/nonexistent/remat-test-program': No such file or directory");
  spec.argv = {"/bin/true"};
  spec.directory = "/nonexistent/folder";
  EXPECT_EQ(error_text([&] { start_child(spec, "test"); }),
            "[test] cannot run '/bin/true': cannot enter '/nonexistent/folder': No such file or directory");
  spec.argv.clear();
  EXPECT_NE(error_of([&] { start_child(spec, "test"); }).find("needs a program"), std::string::npos);
}

}  // namespace child_process_test
}  // namespace
}  // namespace remat::util
