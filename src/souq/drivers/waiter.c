/* souq-waiter: the parent of one machine process, so that its exit status outlives the agent.
 *
 *   souq-waiter REPORT_FD [NOFILE] < JOB
 *
 * The agent starts waiters ahead of need and keeps one or two idle: an idle waiter blocks
 * reading its job on stdin, so starting a machine costs a fork, not an exec of the waiter too.
 * The job is a list of NUL-terminated fields, then end of file:
 *
 *   EXIT_FILE WORKDIR LOG_FILE LOG_MAX USER N CGROUP*N ARGC ARG*ARGC ENVC ENV*ENVC
 *
 * USER is empty (the command runs as the waiter's user) or UID:GID:G1,G2,... (the user the
 * command runs as, its primary group and supplementary groups, possibly none): the child
 * switches to it after it has joined its cgroup and before its exec (setgroups, setgid,
 * setuid), checks that it can no longer get its old ids back, and only then sets its
 * parent-death signal (a change of credentials clears it).
 *
 * A sandbox made ahead of its machine (souq.drivers.warm) is a waiter with a second job pipe:
 *
 *   souq-waiter REPORT_FD NOFILE WARM_FD < JOB
 *
 * Its JOB's EXIT_FILE and LOG_FILE are empty and its command is the sandbox (bwrap) whose own
 * command is this program, as "/proc/self/fd/4 stub": the child gets a socket at 3 and this
 * binary at 4 (static: it runs in an image's root, which has none of the host's libraries).
 * Once the stub runs and says so ("R" on the socket) the waiter writes "W <pid>" to REPORT_FD
 * ("E <errno>" if the sandbox ended first) and waits on WARM_FD for its machine: "EXIT_FILE
 * LOG_FILE LOG_MAX", then the stub's "CWD ARGC ARG*ARGC ENVC ENV*ENVC", then end of file. It
 * opens the log, passes the rest to the stub, which execs the command, and writes "P <pid>";
 * from there it is any machine's waiter. End of file with nothing (the agent went away, or gave
 * the sandbox up) ends the sandbox and the waiter.
 *
 * At start it closes every descriptor but 0-2, REPORT_FD and WARM_FD (what the agent inherited
 * must not reach a machine). NOFILE, if given, is the soft RLIMIT_NOFILE the machine gets (the
 * agent raises its own, see souq.drivers.exec.machine_nofile). An empty job (the agent went away)
 * ends the waiter quietly. Otherwise the waiter opens WORKDIR, /dev/null and LOG_FILE
 * (appended to) and makes a pipe, then starts the command in a new session (its own process
 * group), with
 * PR_SET_PDEATHSIG so that the machine never runs without its waiter. It writes one line to
 * REPORT_FD and closes it:
 * "P <pid>" as soon as the child exists, or "E <errno>" if the files could not be opened or the
 * fork failed. The child, in parallel with the agent, changes to WORKDIR, takes /dev/null as
 * stdin and the pipe as stdout and stderr, resets every signal to its default action (none
 * blocked) and execs the command. If the exec fails the child writes why to the log and exits
 * with status 127, an ordinary exit (the agent checks the program first). The waiter copies
 * what comes through the pipe into the log (splice: no copy through user space), bounded: once
 * LOG_FILE holds LOG_MAX bytes it is renamed LOG_FILE.1 (replacing the one before) and a new
 * LOG_FILE is begun, so neither file is ever over LOG_MAX and the output never takes more than
 * twice LOG_MAX on disk, however fast the command writes; a command writing faster than the
 * disk waits on the full pipe, as it would on the disk. LOG_FILE.state says where the current
 * file begins in the whole stream and which file it is: {"base": OFFSET, "ino": INODE}, written
 * (tmp, then a rename) after each rotation, so readers (souq.drivers.logfile) can tell a
 * rotation under way; a waiter that finds the state naming LOG_FILE.1 finishes the rotation an
 * earlier one was killed in. When the command exits the waiter kills what is left of its
 * process group, copies what is still in the pipe, reaps it and writes "code N" or "signal N"
 * to EXIT_FILE atomically (EXIT_FILE.tmp, then a rename) before it exits. It execs nothing else
 * and ignores the signals a stray kill might send it. It needs no agent for any of this: the
 * output goes on into its log while the agent restarts.
 *
 * Each CGROUP entry says how the command gets into its machine's cgroup (see
 * souq.drivers.cgroups), so that its first instruction runs under its limits:
 *
 *   c:DIR   (cgroup v2) the child is created in DIR by clone3(CLONE_INTO_CGROUP): no migration;
 *           if the kernel cannot, the child joins DIR/cgroup.procs instead
 *   j:PROCS the child writes itself into the cgroup.procs file PROCS before its exec
 *   l:PROCS (cgroup v1) the waiter was placed in the machine's cgroup ahead of need, so its
 *           child is born there; once it has reported, the waiter moves itself to PROCS
 *   n:PATH  not a cgroup: the child joins the network namespace PATH (/run/netns/NAME, the
 *           machine's own, see souq.network) after its cgroup and before its change of user
 *           (setns needs the waiter's privileges)
 *
 * A migration (j:, l:) can wait out an RCU grace period, milliseconds: the waiter reports the
 * pid before any, and c: and l: keep them off the command's way altogether. If a join fails the
 * child writes why to the log and exits with status 127. Built once per host by
 * souq.drivers.waiter with the system's C compiler. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <grp.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/sched.h>

#include "waiter_log.h"

#define MAX_JOB (1 << 20)
#define MAX_FIELDS 8192
#define MAX_GROUPS 256
#define PIPE_SIZE (256 << 10) /* the output pipe's, if the kernel lets us (fewer wake-ups) */
#define DRAIN_MAX (16LL << 20) /* copied after the exit at most: a stray writer cannot hold it */

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
    /* No fsync: the status must outlive the agent, not the host (a power loss ends the machine
     * too, and its exit is then unknown anyway); an fsync here could delay the exit by the
     * file system's journal commit. The rename makes it appear whole or not at all. */
    int ok = write(fd, line, (size_t)n) == n;
    close(fd);
    return ok && rename(tmp, path) == 0 ? 0 : -1;
}

/* Everything FD holds until end of file, into BUF: its length, or -1. */
static long read_all(int fd, char *buf) {
    size_t len = 0;
    for (;;) {
        ssize_t got = read(fd, buf + len, MAX_JOB - 1 - len);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return -1;
        if (got == 0) return (long)len;
        len += (size_t)got;
        if (len >= MAX_JOB - 1) return -1;
    }
}

/* The whole job from FD, split at NULs into fields; the count, or -1 if malformed. */
static int read_job(int fd, char *buf, char **fields) {
    long got = read_all(fd, buf);
    if (got < 0) return -1;
    size_t len = (size_t)got;
    int n = 0;
    for (size_t at = 0; at < len; n++) {
        if (n == MAX_FIELDS) return -1;
        fields[n] = buf + at;
        char *end = memchr(buf + at, '\0', len - at);
        if (end == NULL) return -1;
        at = (size_t)(end - buf) + 1;
    }
    return n;
}

/* A count field followed by that many fields, starting at fields[*at]; NULL if they run out. */
static char **take(char **fields, int nfields, int *at, int *count) {
    if (*at >= nfields) return NULL;
    char *end;
    long n = strtol(fields[*at], &end, 10);
    if (*end != '\0' || n < 0 || n > nfields - *at - 1) return NULL;
    char **first = fields + *at + 1;
    *count = (int)n;
    *at += 1 + (int)n;
    return first;
}

/* Move the calling process into the cgroup whose cgroup.procs file is PATH: 0 or an errno. */
static int join(const char *path) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    int e = write(fd, "0\n", 2) == 2 ? 0 : errno;
    close(fd);
    return e;
}

/* Close every descriptor above KEEP: os.posix_spawn, which starts the waiter, closes only
 * close-on-exec ones, and whatever the agent inherited must not reach a machine. */
static void close_others(int keep) {
#ifdef SYS_close_range
    if (syscall(SYS_close_range, (unsigned)keep + 1, ~0U, 0U) == 0) return;
#endif
    DIR *fds = opendir("/proc/self/fd");
    if (fds == NULL) return;
    int self = dirfd(fds);
    struct dirent *entry;
    while ((entry = readdir(fds)) != NULL) {
        int fd = atoi(entry->d_name);
        if (fd > keep && fd != self) close(fd);
    }
    closedir(fds);
}

/* In the child: every signal to its default action and none blocked. An ignored signal stays
 * ignored across exec: the agent's Python ignores SIGPIPE and SIGXFSZ, and glibc's posix_spawn
 * (which starts the waiter) ignores its two internal signals, 32 and 33, which libc's own
 * signal() refuses to touch. So the raw system call: a zeroed kernel sigaction is SIG_DFL with
 * no flags and no mask, whatever the architecture's layout. */
static void default_signals(void) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    unsigned long dfl[4] = {0, 0, 0, 0};
    for (int sig = 1; sig <= 64; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            syscall(SYS_rt_sigaction, sig, dfl, NULL, (size_t)(64 / 8));
}

/* fork(), or clone3(CLONE_INTO_CGROUP) into the cgroup directory INTO when there is one and the
 * kernel can: then *placed is set and the child needs no join. The waiter is single-threaded,
 * so a raw clone leaves the child's libc as consistent as fork would. */
static pid_t spawn(const char *into, int *placed) {
    *placed = 0;
#if defined(CLONE_INTO_CGROUP) && defined(SYS_clone3)
    if (into != NULL) {
        int dir = open(into, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir >= 0) {
            struct clone_args args;
            memset(&args, 0, sizeof args);
            args.flags = CLONE_INTO_CGROUP;
            args.exit_signal = SIGCHLD;
            args.cgroup = (unsigned long long)dir;
            long pid = syscall(SYS_clone3, &args, sizeof args);
            int e = errno;
            if (pid != 0) close(dir);
            if (pid >= 0) {
                *placed = 1;
                return (pid_t)pid;
            }
            if (e != ENOSYS && e != EINVAL && e != EOPNOTSUPP && e != EPERM) {
                errno = e;
                return -1;
            }
        }
    }
#else
    (void)into;
#endif
    return fork();
}

/* Before the fork: the child's working directory, stdin and the pipe of its output, opened by
 * the waiter (and the log) so that any failure is reported as "E <errno>" and the child has
 * nothing left that can fail. */
static int open_streams(const char *workdir, int *dir, int *in, int out[2]) {
    *dir = open(workdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*dir < 0) return errno;
    *in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (*in < 0) return errno;
    if (pipe2(out, O_CLOEXEC) < 0) return errno;
    fcntl(out[0], F_SETPIPE_SZ, PIPE_SIZE); /* the kernel may refuse, which is fine */
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    return 0;
}

/* Copy the output until the command exits (its pidfd, or a poll of waitid without one), then
 * kill what is left of its group and copy what is still in the pipe. */
static void copy_output(struct out_log *lg, int pipe_r, pid_t pid) {
    int pidfd = -1;
#ifdef SYS_pidfd_open
    pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
#endif
    struct pollfd fds[2] = {{.fd = pipe_r, .events = POLLIN}, {.fd = pidfd, .events = POLLIN}};
    siginfo_t info;
    for (;;) {
        if (pidfd < 0) {
            info.si_pid = 0;
            if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT | WNOHANG) == 0 &&
                info.si_pid == pid)
                break;
        }
        int r = poll(fds, 2, pidfd < 0 ? 50 : -1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        if (fds[1].revents) break;
        if (fds[0].revents && log_pump(lg, pipe_r) == 0) fds[0].fd = -1; /* no writer left */
    }
    if (pidfd >= 0) close(pidfd);
    kill(-pid, SIGKILL); /* the leader is a zombie: its pid still names the group */
    for (long long moved = 0, n; fds[0].fd >= 0 && moved < DRAIN_MAX; moved += n)
        if ((n = log_pump(lg, pipe_r)) <= 0) break;
}

/* USER as "UID:GID:G1,G2,..." into its parts; -1 if malformed. */
static int parse_user(const char *text, uid_t *uid, gid_t *gid, gid_t *groups, int *ngroups) {
    char *end;
    unsigned long u = strtoul(text, &end, 10);
    if (end == text || *end != ':') return -1;
    const char *at = end + 1;
    unsigned long g = strtoul(at, &end, 10);
    if (end == at || *end != ':') return -1;
    *uid = (uid_t)u;
    *gid = (gid_t)g;
    *ngroups = 0;
    at = end + 1;
    while (*at != '\0') {
        if (*ngroups == MAX_GROUPS) return -1;
        unsigned long x = strtoul(at, &end, 10);
        if (end == at || (*end != ',' && *end != '\0')) return -1;
        groups[(*ngroups)++] = (gid_t)x;
        at = *end == ',' ? end + 1 : end;
    }
    return 0;
}

/* In the child: become UID:GID with GROUPS for good; 0 or an errno. */
static int become(uid_t uid, gid_t gid, const gid_t *groups, int ngroups) {
    if (setgroups((size_t)ngroups, groups) < 0) return errno;
    if (setresgid(gid, gid, gid) < 0) return errno;
    if (setresuid(uid, uid, uid) < 0) return errno;
    uid_t r, e, s;
    gid_t rg, eg, sg;
    if (getresuid(&r, &e, &s) < 0 || r != uid || e != uid || s != uid) return EPERM;
    if (getresgid(&rg, &eg, &sg) < 0 || rg != gid || eg != gid || sg != gid) return EPERM;
    if (uid != 0 && (setuid(0) == 0 || seteuid(0) == 0)) return EPERM; /* must be for good */
    return 0;
}

/* A list of COUNT fields as an argv or environment array ending with NULL (moved down over its
 * count field). */
static char **terminated(char **list, int count) {
    memmove(list - 1, list, (size_t)count * sizeof *list);
    list[count - 1] = NULL;
    return list - 1;
}

/* The exec of the machine's command, with what it failed of in its log: execvpe searches the
 * caller's PATH, so the machine's is set first. */
static int run(char **cmdv, char **envv) {
    for (int i = 0; envv[i] != NULL; i++)
        if (strncmp(envv[i], "PATH=", 5) == 0) setenv("PATH", envv[i] + 5, 1);
    execvpe(cmdv[0], cmdv, envv);
    dprintf(2, "souq-waiter: cannot run %s: %s\n", cmdv[0], strerror(errno));
    return 127;
}

/* "souq-waiter stub", inside a sandbox made ahead of its machine: it says "R" on descriptor 3
 * (its waiter's socket, see await_machine: the sandbox is made), reads "CWD ARGC ARG*ARGC ENVC
 * ENV*ENVC" there, keeps no descriptor above 2, and becomes the machine's command. End of file
 * with nothing read: the sandbox was given up. */
static int stub(void) {
    static char buf[MAX_JOB];
    static char *fields[MAX_FIELDS + 1];
    if (write(3, "R", 1) != 1) return 0; /* ready; no waiter: nothing to wait for */
    int n = read_job(3, buf, fields), at = 1, cmdc = 0, envc = 0;
    close_others(2);
    if (n == 0) return 0;
    char **cmd = n > 1 ? take(fields, n, &at, &cmdc) : NULL;
    char **env = cmd && cmdc > 0 ? take(fields, n, &at, &envc) : NULL;
    if (env == NULL || at != n) {
        dprintf(2, "souq-waiter: a malformed command for the sandbox\n");
        return 127;
    }
    if (fields[0][0] != '\0' && chdir(fields[0]) < 0) {
        dprintf(2, "souq-waiter: cannot enter %s: %s\n", fields[0], strerror(errno));
        return 127;
    }
    default_signals();
    return run(terminated(cmd, cmdc), terminated(env, envc));
}

/* A warm waiter's child is a sandbox whose command is the stub, reading STUB_W's other end.
 * Wait for the machine on WARM_FD: "EXIT_FILE LOG_FILE LOG_MAX", then the stub's fields, then
 * end of file. Open the log, pass the rest to the stub and return EXIT_FILE; NULL when the
 * sandbox is given up (an empty job: the agent went away or let it go) or ended (it is then
 * reaped, and the agent reads no "P" line). */
static const char *await_machine(int warm_fd, int report_fd, pid_t pid, int stub_w,
                                 struct out_log *lg) {
    static char buf[MAX_JOB];
    int pidfd = -1;
#ifdef SYS_pidfd_open
    pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
#endif
    struct pollfd fds[2] = {{.fd = warm_fd, .events = POLLIN}, {.fd = pidfd, .events = POLLIN}};
    while (poll(fds, 2, -1) < 0 && errno == EINTR) {}
    if (pidfd >= 0) close(pidfd);
    long len = fds[1].revents ? -1 : read_all(warm_fd, buf), at = 0;
    const char *fields[3];
    int found = 0, e = len < 0 ? ESRCH : 0;
    for (; found < 3 && len > 0; found++) {
        const char *end = memchr(buf + at, '\0', (size_t)(len - at));
        if (end == NULL) break;
        fields[found] = buf + at;
        at = end - buf + 1;
    }
    if (e == 0 && len > 0) e = found < 3 ? EINVAL : log_open(lg, fields[1], fields[2]);
    for (long done = 0, w; e == 0 && done < len - at; done += w)
        if ((w = write(stub_w, buf + at + done, (size_t)(len - at - done))) < 0) e = errno;
    close(stub_w);
    if (e != 0 || len == 0) {
        if (len != 0) report(report_fd, 'E', e);
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
        return NULL;
    }
    report(report_fd, 'P', pid);
    return fields[0];
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "stub") == 0) return stub();
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: souq-waiter REPORT_FD [NOFILE [WARM_FD]] < JOB\n");
        return 2;
    }
    int report_fd = atoi(argv[1]), warm_fd = argc == 4 ? atoi(argv[3]) : -1;
    close_others(warm_fd > report_fd ? warm_fd : report_fd);
    struct rlimit nofile;
    if (argc >= 3 && getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
        rlim_t soft = (rlim_t)strtoull(argv[2], NULL, 10);
        if (soft > 0 && soft < nofile.rlim_cur) {
            nofile.rlim_cur = soft;
            setrlimit(RLIMIT_NOFILE, &nofile);
        }
    }
    if (chdir("/") < 0) { /* keep no directory of the agent's busy; the child moves anyway */ }
    static char buf[MAX_JOB];
    static char *fields[MAX_FIELDS + 1];
    int nfields = read_job(0, buf, fields);
    if (nfields == 0) return 0; /* an idle waiter whose agent went away */
    int at = 5, ncgroups = 0, cmdc = 0, envc = 0;
    char **cgroups = nfields > 5 ? take(fields, nfields, &at, &ncgroups) : NULL;
    char **cmd = cgroups ? take(fields, nfields, &at, &cmdc) : NULL;
    char **env = cmd && cmdc > 0 ? take(fields, nfields, &at, &envc) : NULL;
    if (env == NULL || at != nfields) {
        report(report_fd, 'E', EINVAL);
        return 2;
    }
    const char *exit_path = fields[0], *workdir = fields[1], *log = fields[2];
    const char *log_max = fields[3], *user = fields[4];
    uid_t uid = 0;
    gid_t gid = 0;
    static gid_t groups[MAX_GROUPS];
    int ngroups = 0;
    if (user[0] != '\0' && parse_user(user, &uid, &gid, groups, &ngroups) < 0) {
        report(report_fd, 'E', EINVAL);
        return 2;
    }
    const char *into = NULL;
    for (int i = 0; i < ncgroups; i++) {
        char kind = cgroups[i][0];
        if ((kind != 'c' && kind != 'j' && kind != 'l' && kind != 'n') || cgroups[i][1] != ':') {
            report(report_fd, 'E', EINVAL);
            return 2;
        }
        if (kind == 'c') into = cgroups[i] + 2;
    }
    char **cmdv = terminated(cmd, cmdc), **envv = terminated(env, envc);

    pid_t parent = getpid();
    int dir = -1, in = -1, out[2] = {-1, -1}, stub[2] = {-1, -1}, exe = -1;
    static struct out_log lg;
    int e = 0;
    if (warm_fd < 0) /* else the log comes with the machine */
        e = log_open(&lg, log, log_max);
    else if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, stub) < 0 ||
             (exe = open("/proc/self/exe", O_RDONLY | O_CLOEXEC)) < 0)
        e = errno;
    if (e == 0) e = open_streams(workdir, &dir, &in, out);
    if (e != 0) {
        report(report_fd, 'E', e);
        return 127;
    }
    int placed;
    pid_t pid = spawn(into, &placed);
    if (pid < 0) {
        report(report_fd, 'E', errno);
        return 127;
    }
    if (pid == 0) {
        close(report_fd);
        setsid();
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127); /* the waiter died before the prctl */
        if (fchdir(dir) < 0 || dup2(in, 0) < 0 || dup2(out[1], 1) < 0 || dup2(out[1], 2) < 0)
            _exit(127);
        /* A warm sandbox's stub: its job's pipe at 3, this program at 4 (/proc/self/fd/4) */
        if (warm_fd >= 0 && (dup2(stub[0], 3) < 0 || dup2(exe, 4) < 0)) _exit(127);
        default_signals();
        for (int i = 0; i < ncgroups; i++) {
            char procs[4096];
            const char *target = cgroups[i] + 2;
            if (cgroups[i][0] == 'l' || cgroups[i][0] == 'n' || (cgroups[i][0] == 'c' && placed))
                continue;
            if (cgroups[i][0] == 'c') {
                if (snprintf(procs, sizeof procs, "%s/cgroup.procs", target) >= (int)sizeof procs)
                    e = ENAMETOOLONG;
                else
                    e = join(procs);
                if (e == 0) continue;
            } else {
                e = join(target);
            }
            if (e != 0) {
                dprintf(2, "souq-waiter: cannot join cgroup %s: %s\n", target, strerror(e));
                _exit(127);
            }
        }
        for (int i = 0; i < ncgroups; i++) {
            if (cgroups[i][0] != 'n') continue;
            int ns = open(cgroups[i] + 2, O_RDONLY | O_CLOEXEC);
            if (ns < 0 || setns(ns, CLONE_NEWNET) < 0) {
                dprintf(2, "souq-waiter: cannot join network %s: %s\n", cgroups[i] + 2,
                        strerror(errno));
                _exit(127);
            }
            close(ns);
        }
        if (user[0] != '\0') {
            e = become(uid, gid, groups, ngroups);
            if (e != 0) {
                dprintf(2, "souq-waiter: cannot run as %s: %s\n", user, strerror(e));
                _exit(127);
            }
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* the switch cleared it */
            if (getppid() != parent) _exit(127);
        }
        _exit(run(cmdv, envv));
    }
    close(dir);
    close(in);
    close(out[1]);
    int status;
    char ready = 0;
    if (warm_fd < 0) report(report_fd, 'P', pid);
    else if (close(stub[0]) == 0 && read(stub[1], &ready, 1) == 1 && ready == 'R')
        dprintf(report_fd, "W %ld\n", (long)pid); /* the sandbox is made: its stub waits */
    else { /* bwrap failed: no stub */
        report(report_fd, 'E', ECHILD);
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
        return 127;
    }
    for (int i = 0; i < ncgroups; i++) /* out of the machine's cgroup, off its way */
        if (cgroups[i][0] == 'l') join(cgroups[i] + 2);
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGQUIT, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    if (warm_fd >= 0) {
        close(exe);
        exit_path = await_machine(warm_fd, report_fd, pid, stub[1], &lg);
        if (exit_path == NULL) return 0;
    }
    copy_output(&lg, out[0], pid);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    return write_status(exit_path, status) == 0 ? 0 : 1;
}
