/* souq-waiter's output log (see waiter.c and waiter_log.h): LOG_FILE, bounded at LOG_MAX bytes
 * by rotation to LOG_FILE.1, with LOG_FILE.state saying where the current file begins. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "waiter_log.h"

#define CHUNK (1 << 20) /* the most one splice moves */

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

int log_open(struct out_log *lg, const char *path, const char *max) {
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

long long log_pump(struct out_log *lg, int pipe_r) {
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
