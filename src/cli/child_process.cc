#include "src/cli/child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace autopar::cli {
namespace {

// The process group of the running child, for the signal handler (0: none).
volatile sig_atomic_t g_child_group = 0;

[[noreturn]] void Fail(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

void KillChildGroupAndDie(int signal) {
  const pid_t group = g_child_group;
  if (group > 0) killpg(group, SIGKILL);
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(signal, &dfl, nullptr);
  raise(signal);
}

void SleepS(double s) {
  timespec t{static_cast<time_t>(s), static_cast<long>((s - static_cast<time_t>(s)) * 1e9)};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

ChildExit FromStatus(int status) {
  ChildExit e;
  if (WIFSIGNALED(status)) {
    e.signaled = true;
    e.signal = WTERMSIG(status);
  } else {
    e.code = WEXITSTATUS(status);
  }
  return e;
}

// In the child, between fork and exec: async-signal-safe calls only.
[[noreturn]] void ExecChild(pid_t parent, int log_fd, int null_fd, const char* path,
                            char* const* argv, char* const* envp, const std::string& failure) {
  if (setpgid(0, 0) != 0) _exit(126);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) _exit(126);
  if (getppid() != parent) _exit(126);  // the tuner died before the line above
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGPIPE}) signal(s, SIG_DFL);
  if (dup2(null_fd, STDIN_FILENO) < 0 || dup2(log_fd, STDOUT_FILENO) < 0 ||
      dup2(log_fd, STDERR_FILENO) < 0) {
    _exit(126);
  }
  execve(path, argv, envp);
  const ssize_t written = write(STDERR_FILENO, failure.data(), failure.size());
  (void)written;
  _exit(127);
}

}  // namespace

std::string ChildExit::Describe() const {
  if (!signaled) return "exit code " + std::to_string(code);
  const char* name = strsignal(signal);
  return "signal " + std::to_string(signal) + (name ? std::string(" (") + name + ")" : "");
}

std::string FindProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv,
                           const std::vector<std::string>& env, const std::string& log_path) {
  if (argv.empty()) throw std::runtime_error("ChildProcess: an empty command");
  std::string path = FindProgram(argv[0]);
  if (path.empty()) path = argv[0];
  const std::string failure = "autopar-tune: cannot execute '" + argv[0] + "' (" + path +
                              "): not found or not executable\n";
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) Fail("open('" + log_path + "')");
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) {
    close(log_fd);
    Fail("open('/dev/null')");
  }
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ == 0)
    ExecChild(parent, log_fd, null_fd, path.c_str(), args.data(), envp.data(), failure);
  const int fork_errno = errno;
  close(log_fd);
  close(null_fd);
  if (pid_ < 0) {
    errno = fork_errno;
    Fail("fork");
  }
  g_child_group = pid_;
  // The child does it too; whichever runs first wins, the other finds it done (EACCES once the
  // child has exec'd, ESRCH if it already ended).
  if (setpgid(pid_, pid_) != 0 && errno != EACCES && errno != ESRCH) {
    KillGroup(0);
    Fail("setpgid");
  }
}

ChildProcess::~ChildProcess() {
  if (pid_ <= 0) return;
  try {
    KillGroup(0);
  } catch (const std::runtime_error&) {
    // waitpid failed: nothing more a destructor can do
  }
}

std::optional<ChildExit> ChildProcess::Poll() {
  if (exit_ || pid_ <= 0) return exit_;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r < 0) Fail("waitpid");
  if (r == pid_) exit_ = FromStatus(status);
  return exit_;
}

ChildExit ChildProcess::KillGroup(double grace_s) {
  // The group may outlive its leader (whatever the child started): it goes either way.
  auto kill_group = [&](int signal) {
    if (killpg(pid_, signal) != 0 && errno != ESRCH && errno != EPERM) Fail("killpg");
  };
  if (!Poll()) {
    kill_group(SIGTERM);
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
    while (!Poll() && std::chrono::steady_clock::now() < end) SleepS(0.02);
  }
  kill_group(SIGKILL);
  if (!exit_) {
    int status = 0;
    pid_t r;
    do {
      r = waitpid(pid_, &status, 0);
    } while (r < 0 && errno == EINTR);
    if (r < 0) Fail("waitpid");
    exit_ = FromStatus(status);
  }
  g_child_group = 0;
  return *exit_;
}

void InstallChildGroupSignalHandlers() {
  static bool installed = false;
  if (installed) return;
  struct sigaction action = {};
  action.sa_handler = KillChildGroupAndDie;
  sigemptyset(&action.sa_mask);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) {
    if (sigaction(s, &action, nullptr) != 0) Fail("sigaction");
  }
  installed = true;
}

}  // namespace autopar::cli
