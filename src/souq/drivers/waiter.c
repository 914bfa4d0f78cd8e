/* souq-waiter: the parent of one machine process, so that its exit status outlives the agent.
 *
 *   souq-waiter REPORT_FD [NOFILE] < JOB
 *
 * The agent starts waiters ahead of need and keeps one or two idle: an idle waiter blocks
 * reading its job on stdin, so starting a machine costs a fork, not an exec of the waiter too.
 * The job is a list of NUL-terminated fields, then end of file:
 *
 *   EXIT_FILE WORKDIR LOG_FILE USER N CGROUP*N ARGC ARG*ARGC ENVC ENV*ENVC
 *
 * USER is empty (the command runs as the waiter's user) or UID:GID:G1,G2,... (the user the
 * command runs as, its primary group and supplementary groups, possibly none): the child
 * switches to it after it has joined its cgroup and before its exec (setgroups, setgid,
 * setuid), checks that it can no longer get its old ids back, and only then sets its
 * parent-death signal (a change of credentials clears it).
 *
 * At start it closes every descriptor but 0-2 and REPORT_FD (what the agent inherited must not
 * reach a machine). NOFILE, if given, is the soft RLIMIT_NOFILE the machine gets (the agent
 * raises its own, see souq.drivers.exec.machine_nofile). An empty job (the agent went away)
 * ends the waiter quietly. Otherwise the waiter opens WORKDIR, /dev/null and LOG_FILE
 * (appended to), then starts the command in a new session (its own process group), with
 * PR_SET_PDEATHSIG so that the machine never runs without its waiter. It writes one line to
 * REPORT_FD and closes it:
 * "P <pid>" as soon as the child exists, or "E <errno>" if the files could not be opened or the
 * fork failed. The child, in parallel with the agent, changes to WORKDIR, takes /dev/null as
 * stdin and the log as stdout and stderr, resets every signal to its default action (none
 * blocked) and execs the command. If the exec fails the child writes why to the log and exits
 * with status 127, an ordinary exit (the agent checks the program first). The waiter waits for
 * the command, kills what is left of its process group, reaps it and writes "code N" or
 * "signal N" to EXIT_FILE atomically (EXIT_FILE.tmp, then a rename) before it exits. It execs
 * nothing else and ignores the signals a stray kill might send it.
 *
 * Each CGROUP entry says how the command gets into its machine's cgroup (see
 * souq.drivers.cgroups), so that its first instruction runs under its limits:
 *
 *   c:DIR   (cgroup v2) the child is created in DIR by clone3(CLONE_INTO_CGROUP): no migration;
 *           if the kernel cannot, the child joins DIR/cgroup.procs instead
 *   j:PROCS the child writes itself into the cgroup.procs file PROCS before its exec
 *   l:PROCS (cgroup v1) the waiter was placed in the machine's cgroup ahead of need, so its
 *           child is born there; once it has reported, the waiter moves itself to PROCS
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
#include <sys/prctl.h>
#include <grp.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/sched.h>

#define MAX_JOB (1 << 20)
#define MAX_FIELDS 8192
#define MAX_GROUPS 256

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

/* The whole job from stdin, split at NULs into fields; the count, or -1 if malformed. */
static int read_job(char *buf, char **fields) {
    size_t len = 0;
    for (;;) {
        ssize_t got = read(0, buf + len, MAX_JOB - 1 - len);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return -1;
        if (got == 0) break;
        len += (size_t)got;
        if (len >= MAX_JOB - 1) return -1;
    }
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

/* Close every descriptor but 0-2 and KEEP: os.posix_spawn, which starts the waiter, closes only
 * close-on-exec ones, and whatever the agent inherited must not reach a machine. */
static void close_others(int keep) {
#ifdef SYS_close_range
    if ((keep <= 3 || syscall(SYS_close_range, 3U, (unsigned)keep - 1, 0U) == 0) &&
        syscall(SYS_close_range, (unsigned)keep + 1, ~0U, 0U) == 0)
        return;
#endif
    DIR *fds = opendir("/proc/self/fd");
    if (fds == NULL) return;
    int self = dirfd(fds);
    struct dirent *entry;
    while ((entry = readdir(fds)) != NULL) {
        int fd = atoi(entry->d_name);
        if (fd > 2 && fd != keep && fd != self) close(fd);
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

/* Before the fork: the child's working directory and log, opened by the waiter so that any
 * failure is reported as "E <errno>" and the child has nothing left that can fail. */
static int open_streams(const char *workdir, const char *log, int *dir, int *in, int *out) {
    *dir = open(workdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*dir < 0) return errno;
    *in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (*in < 0) return errno;
    /* The log is in the machine's own directory, which its user may write: never follow a
     * link it left there, nor append to anything but a plain file of its own. */
    *out = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (*out < 0) return errno;
    struct stat st;
    if (fstat(*out, &st) < 0) return errno;
    if (!S_ISREG(st.st_mode) || st.st_nlink != 1) return EPERM;
    return 0;
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

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: souq-waiter REPORT_FD [NOFILE] < JOB\n");
        return 2;
    }
    int report_fd = atoi(argv[1]);
    close_others(report_fd);
    struct rlimit nofile;
    if (argc == 3 && getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
        rlim_t soft = (rlim_t)strtoull(argv[2], NULL, 10);
        if (soft > 0 && soft < nofile.rlim_cur) {
            nofile.rlim_cur = soft;
            setrlimit(RLIMIT_NOFILE, &nofile);
        }
    }
    if (chdir("/") < 0) { /* keep no directory of the agent's busy; the child moves anyway */ }
    static char buf[MAX_JOB];
    static char *fields[MAX_FIELDS + 1];
    int nfields = read_job(buf, fields);
    if (nfields == 0) return 0; /* an idle waiter whose agent went away */
    int at = 4, ncgroups = 0, cmdc = 0, envc = 0;
    char **cgroups = nfields > 4 ? take(fields, nfields, &at, &ncgroups) : NULL;
    char **cmd = cgroups ? take(fields, nfields, &at, &cmdc) : NULL;
    char **env = cmd && cmdc > 0 ? take(fields, nfields, &at, &envc) : NULL;
    if (env == NULL || at != nfields) {
        report(report_fd, 'E', EINVAL);
        return 2;
    }
    const char *exit_path = fields[0], *workdir = fields[1], *log = fields[2];
    const char *user = fields[3];
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
        if ((kind != 'c' && kind != 'j' && kind != 'l') || cgroups[i][1] != ':') {
            report(report_fd, 'E', EINVAL);
            return 2;
        }
        if (kind == 'c') into = cgroups[i] + 2;
    }
    /* The argv and environment arrays end with NULL: move each list down over its count. */
    char **cmdv = cmd - 1, **envv = env - 1;
    memmove(cmdv, cmd, (size_t)cmdc * sizeof *cmd);
    cmdv[cmdc] = NULL;
    memmove(envv, env, (size_t)envc * sizeof *env);
    envv[envc] = NULL;

    pid_t parent = getpid();
    int dir = -1, in = -1, out = -1;
    int e = open_streams(workdir, log, &dir, &in, &out);
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
        if (fchdir(dir) < 0 || dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0) _exit(127);
        default_signals();
        for (int i = 0; i < ncgroups; i++) {
            char procs[4096];
            const char *target = cgroups[i] + 2;
            if (cgroups[i][0] == 'l' || (cgroups[i][0] == 'c' && placed)) continue;
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
        if (user[0] != '\0') {
            e = become(uid, gid, groups, ngroups);
            if (e != 0) {
                dprintf(2, "souq-waiter: cannot run as %s: %s\n", user, strerror(e));
                _exit(127);
            }
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* the switch cleared it */
            if (getppid() != parent) _exit(127);
        }
        for (int i = 0; i < envc; i++) /* execvpe searches the caller's PATH: the machine's */
            if (strncmp(envv[i], "PATH=", 5) == 0) setenv("PATH", envv[i] + 5, 1);
        execvpe(cmdv[0], cmdv, envv);
        dprintf(2, "souq-waiter: cannot run %s: %s\n", cmdv[0], strerror(errno));
        _exit(127);
    }
    close(dir);
    close(in);
    close(out);
    int status;
    report(report_fd, 'P', pid);
    for (int i = 0; i < ncgroups; i++) /* out of the machine's cgroup, off its way */
        if (cgroups[i][0] == 'l') join(cgroups[i] + 2);
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
