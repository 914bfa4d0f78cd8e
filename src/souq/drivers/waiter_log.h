/* souq-waiter's output log: what the machine writes, bounded on disk (see waiter.c). */
#ifndef SOUQ_WAITER_LOG_H
#define SOUQ_WAITER_LOG_H

struct out_log {
    const char *path;   /* LOG_FILE, the current file */
    char rotated[4096]; /* LOG_FILE.1, the one before it */
    char state[4096];   /* LOG_FILE.state */
    int fd;             /* the current file's, or -1 while it cannot be had (output is dropped) */
    long long size, max, base;
    int splice;         /* 0 once the file system refused a splice */
};

/* Open LOG_FILE at its end and carry on its stream: 0 or an errno. */
int log_open(struct out_log *lg, const char *path, const char *max);

/* Move what the pipe holds into the log, up to the current file's room: the bytes moved, 0 at
 * end of file (no writer left), -1 when the pipe is empty. */
long long log_pump(struct out_log *lg, int pipe_r);

#endif
