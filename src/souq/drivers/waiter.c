/* souq-waiter: the parent of one machine process, so that its exit status outlives the agent.
 *
 *   souq-waiter REPORT_FD EXIT_FILE CMD [ARG...]
 *
 * Forks CMD in a new session (its own process group, as the exec driver always did), with
 * PR_SET_PDEATHSIG so that the machine never runs without its waiter. Writes one line to
 * REPORT_FD and closes it: "P <pid>" once CMD has been exec'd, or "E <errno>" if it could not
 * be. Then waits for CMD, kills what is left of its process group, reaps it and writes
 * "code N" or "signal N" to EXIT_FILE atomically (EXIT_FILE.tmp, fsync, rename) before it exits.
 * It execs nothing else and ignores the signals a stray kill might send it. Built once per host
 * by souq.drivers.waiter with the system's C compiler. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void report(int fd, char kind, long value) {
    char line[32];
    int n = snprintf(line, sizeof line, "%c %ld\n", kind, value);
    if (n > 0 && write(fd, line, (size_t)n) < 0) { /* the agent is gone: nothing to tell */ }
    close(fd);
}

static int write_status(const char *path, int status) {
    char tmp[4096], line[32];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (n < 0 || (size_t)n >= sizeof tmp) return -1;
    if (WIFEXITED(status)) n = snprintf(line, sizeof line, "code %d\n", WEXITSTATUS(status));
    else n = snprintf(line, sizeof line, "signal %d\n", WTERMSIG(status));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    int ok = write(fd, line, (size_t)n) == n && fsync(fd) == 0;
    close(fd);
    return ok && rename(tmp, path) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: souq-waiter REPORT_FD EXIT_FILE CMD [ARG...]\n");
        return 2;
    }
    int report_fd = atoi(argv[1]);
    const char *exit_path = argv[2];
    pid_t parent = getpid();
    int errpipe[2];
    if (pipe2(errpipe, O_CLOEXEC) < 0) {
        report(report_fd, 'E', errno);
        return 127;
    }
    pid_t pid = fork();
    if (pid < 0) {
        report(report_fd, 'E', errno);
        return 127;
    }
    if (pid == 0) {
        close(errpipe[0]);
        close(report_fd);
        setsid();
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127); /* the waiter died before the prctl */
        execvp(argv[3], argv + 3);
        int e = errno;
        if (write(errpipe[1], &e, sizeof e) < 0) { /* nothing more to do */ }
        _exit(127);
    }
    close(errpipe[1]);
    int err = 0;
    ssize_t got;
    do got = read(errpipe[0], &err, sizeof err); while (got < 0 && errno == EINTR);
    close(errpipe[0]);
    int status;
    if (got == (ssize_t)sizeof err) {
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
        report(report_fd, 'E', err);
        return 127;
    }
    report(report_fd, 'P', pid);
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGQUIT, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    siginfo_t info;
    while (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {}
    kill(-pid, SIGKILL); /* the leader is a zombie: its pid still names the group */
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    return write_status(exit_path, status) == 0 ? 0 : 1;
}
