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
 * At start it closes every descriptor but 0-2 and REPORT_FD (what the agent inherited must not
 * reach a machine). NOFILE, if given, is the soft RLIMIT_NOFILE the machine gets (the agent
 * raises its own, see souq.drivers.exec.machine_nofile). An empty job (the agent went away)
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
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/sched.h>

#define MAX_JOB (1 << 20)
#define MAX_FIELDS 8192
#define MAX_GROUPS 256
#define CHUNK (1 << 20) /* the most one splice moves */
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

/* -- the output log ------------------------------------------------------------------------ */

struct out_log {
    const char *path;   /* LOG_FILE, the current file */
    char rotated[4096]; /* LOG_FILE.1, the one before it */
    char state[4096];   /* LOG_FILE.state */
    int fd;             /* the current file's, or -1 while it cannot be had (output is dropped) */
    long long size, max, base;
    int splice;         /* 0 once the file system refused a splice */
};

/* A plain file of the waiter's own at PATH, for writing: never a link the machine left, nor
 * another name of some file (O_NONBLOCK: nor a FIFO it could block the open on). */
static int open_plain(const char *path, int flags) {
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | flags, 0644);
    if (fd < 0) return -errno;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
        close(fd);
        return -EPERM;
    }
    return fd;
}

/* The number after "KEY": in the state file's text, or -1. */
static long long state_field(const char *text, const char *key) {
    char quoted[16];
    snprintf(quoted, sizeof quoted, "\"%s\":", key);
    const char *at = strstr(text, quoted);
    if (at == NULL) return -1;
    char *end;
    long long n = strtoll(at + strlen(quoted), &end, 10);
    return end == at + strlen(quoted) || n < 0 ? -1 : n;
}

static void log_write_state(struct out_log *lg) {
    struct stat st;
    char tmp[4200], line[96];
    if (lg->fd < 0 || fstat(lg->fd, &st) < 0) return;
    int n = snprintf(line, sizeof line, "{\"base\": %lld, \"ino\": %llu}\n", lg->base,
                     (unsigned long long)st.st_ino);
    snprintf(tmp, sizeof tmp, "%s.tmp", lg->state);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return;
    int ok = write(fd, line, (size_t)n) == n;
    close(fd);
    if (!ok || rename(tmp, lg->state) < 0) unlink(tmp);
}

/* Begin a new current file: the full one becomes LOG_FILE.1. If that fails the output is
 * dropped (and counted in the stream) until a later rotation succeeds: the bound holds. */
static void log_rotate(struct out_log *lg) {
    lg->base += lg->size;
    lg->size = 0;
    if (lg->fd >= 0 && rename(lg->path, lg->rotated) < 0) { /* begin this one again */
        if (ftruncate(lg->fd, 0) == 0 && lseek(lg->fd, 0, SEEK_SET) == 0) {
            log_write_state(lg);
            return;
        }
    }
    if (lg->fd >= 0) close(lg->fd);
    int fd = open_plain(lg->path, O_TRUNC);
    lg->fd = fd < 0 ? -1 : fd;
    log_write_state(lg);
}

/* Open LOG_FILE at its end and carry on its stream: 0 or an errno. */
static int log_open(struct out_log *lg, const char *path, const char *max) {
    char *end;
    lg->path = path;
    lg->max = strtoll(max, &end, 10);
    lg->splice = 1;
    if (*end != '\0' || lg->max <= 0) return EINVAL;
    if (snprintf(lg->rotated, sizeof lg->rotated, "%s.1", path) >= (int)sizeof lg->rotated ||
        snprintf(lg->state, sizeof lg->state, "%s.state", path) >= (int)sizeof lg->state)
        return ENAMETOOLONG;
    int fd = open_plain(path, 0);
    if (fd < 0) return -fd;
    lg->fd = fd;
    struct stat st, old;
    if (fstat(fd, &st) < 0) return errno;
    lg->size = (long long)st.st_size;
    if (lseek(fd, 0, SEEK_END) < 0) return errno;
    char text[256] = "";
    int sfd = open(lg->state, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (sfd >= 0) {
        ssize_t got = read(sfd, text, sizeof text - 1);
        text[got > 0 ? got : 0] = '\0';
        close(sfd);
    }
    lg->base = state_field(text, "base") < 0 ? 0 : state_field(text, "base");
    long long ino = state_field(text, "ino");
    /* The state names LOG_FILE.1: a waiter was killed between a rotation's rename and its
     * state. The current file begins where that one ends. */
    if (ino >= 0 && (unsigned long long)ino != (unsigned long long)st.st_ino &&
        stat(lg->rotated, &old) == 0 && (unsigned long long)old.st_ino == (unsigned long long)ino)
        lg->base += (long long)old.st_size;
    log_write_state(lg);
    if (lg->size >= lg->max) log_rotate(lg);
    return 0;
}

/* Move what the pipe holds into the log, up to the current file's room: the bytes moved, 0 at
 * end of file (no writer left), -1 when the pipe is empty. */
static long long log_pump(struct out_log *lg, int pipe_r) {
    static char buf[CHUNK];
    long long room = lg->max - lg->size;
    size_t want = room < CHUNK ? (size_t)room : CHUNK;
    ssize_t n = -1;
    if (lg->fd >= 0 && lg->splice) {
        n = splice(pipe_r, NULL, lg->fd, NULL, want, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (n < 0 && errno == EINVAL) lg->splice = 0; /* this file system cannot: copy */
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return -1;
    }
    if (n < 0) { /* no splice, no file, or a write error (a full disk): copy, or drop */
        n = read(pipe_r, buf, want);
        if (n < 0) return -1;
        for (ssize_t done = 0; lg->fd >= 0 && done < n;) {
            ssize_t w = write(lg->fd, buf + done, (size_t)(n - done));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) break; /* lost, but counted: the stream's offsets stay true */
            done += w;
        }
        if (lg->fd >= 0) lseek(lg->fd, lg->size + n, SEEK_SET);
    }
    lg->size += n;
    if (lg->size >= lg->max || (lg->fd < 0 && n > 0)) log_rotate(lg);
    return n;
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
    /* The argv and environment arrays end with NULL: move each list down over its count. */
    char **cmdv = cmd - 1, **envv = env - 1;
    memmove(cmdv, cmd, (size_t)cmdc * sizeof *cmd);
    cmdv[cmdc] = NULL;
    memmove(envv, env, (size_t)envc * sizeof *env);
    envv[envc] = NULL;

    pid_t parent = getpid();
    int dir = -1, in = -1, out[2] = {-1, -1};
    static struct out_log lg;
    int e = log_open(&lg, log, log_max);
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
        for (int i = 0; i < envc; i++) /* execvpe searches the caller's PATH: the machine's */
            if (strncmp(envv[i], "PATH=", 5) == 0) setenv("PATH", envv[i] + 5, 1);
        execvpe(cmdv[0], cmdv, envv);
        dprintf(2, "souq-waiter: cannot run %s: %s\n", cmdv[0], strerror(errno));
        _exit(127);
    }
    close(dir);
    close(in);
    close(out[1]);
    int status;
    report(report_fd, 'P', pid);
    for (int i = 0; i < ncgroups; i++) /* out of the machine's cgroup, off its way */
        if (cgroups[i][0] == 'l') join(cgroups[i] + 2);
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGQUIT, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    copy_output(&lg, out[0], pid);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    return write_status(exit_path, status) == 0 ? 0 : 1;
}
