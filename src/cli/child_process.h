// One child process in its own process group, for `--backend megatron` trials (docs/trial.md
// §17). Internal to src/cli. POSIX: fork + exec, the child `setpgid(0, 0)` (the parent too, so
// neither order races), its stdout and stderr into a log file, `PR_SET_PDEATHSIG` = SIGKILL so it
// dies with a tuner process killed by SIGKILL; SIGTERM, SIGINT and SIGHUP to the tuner kill the
// group (InstallChildGroupSignalHandlers). Every process of the group is killed and the child
// reaped before the object goes: no orphans, no zombies.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace autopar::cli {

struct ChildExit {
  bool signaled = false;  // killed by `signal`; else exited with `code`
  int code = 0;
  int signal = 0;
  bool ok() const { return !signaled && code == 0; }
  std::string Describe() const;  // "exit code 1", "signal 9 (Killed)"
};

class ChildProcess {
 public:
  // Starts `argv` (argv[0] found on PATH when it has no '/') with exactly `env` as its
  // environment, output (stdout and stderr) appended to `log_path`, created 0644 if missing.
  // Throws std::runtime_error naming the call that failed (open, fork, pipe); a program that
  // cannot be executed ends the child with exit code 127 and the reason in the log.
  ChildProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env,
               const std::string& log_path);
  ~ChildProcess();  // KillGroup(0) if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Non-blocking: the exit once the child has ended (reaped; later calls return it again).
  std::optional<ChildExit> Poll();
  // SIGTERM to the group, up to `grace_s` for the child to end, then SIGKILL to the whole group
  // (whatever the child left in it too) and the child reaped. Returns its exit.
  ChildExit KillGroup(double grace_s);

 private:
  pid_t pid_ = -1;
  std::optional<ChildExit> exit_;
};

// SIGTERM, SIGINT and SIGHUP kill the running child's group (SIGKILL), then end the tuner as the
// signal would have. Idempotent; called before the first child starts.
void InstallChildGroupSignalHandlers();

// The first directory of $PATH holding an executable `name` (or `name` itself when it has a '/');
// empty when none.
std::string FindProgram(const std::string& name);

}  // namespace autopar::cli
