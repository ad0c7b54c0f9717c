/*
 * startup.c - see startup.h.
 */
#include "startup.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int zi_startup_pipe(int fds[2]) {
    if (pipe2(fds, O_CLOEXEC) != 0) return -1;
    /* The supervisor reads it only after the child has exited: whatever
     * was written is there, and an empty pipe must not block it. */
    int fl = fcntl(fds[0], F_GETFL);
    if (fl < 0 || fcntl(fds[0], F_SETFL, fl | O_NONBLOCK) != 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        errno = e;
        return -1;
    }
    return 0;
}

void zi_startup_pipe_child(int wr) {
    if (wr < 0 || fcntl(wr, F_SETFD, 0) != 0) return;
    char num[16];
    snprintf(num, sizeof num, "%d", wr);
    setenv(ZI_STARTUP_FD_ENV, num, 1);
}

void zi_startup_pipe_read(int rd, char *buf, size_t cap) {
    if (cap == 0) return;
    buf[0] = '\0';
    if (rd < 0) return;
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(rd, buf + n, cap - 1 - n);
        if (r > 0) {
            n += (size_t)r;
        } else if (r < 0 && errno == EINTR) {
            continue;
        } else {
            break;
        }
    }
    buf[n] = '\0';
    /* One line: the message ends at its first newline. */
    buf[strcspn(buf, "\r\n")] = '\0';
    close(rd);
}

bool zi_startup_report(const char *msg) {
    const char *v = getenv(ZI_STARTUP_FD_ENV);
    if (!v || !*v) return false;
    char *end;
    long fd = strtol(v, &end, 10);
    struct stat st;
    /* Only a pipe: a stale or hand-set variable naming another file must
     * not receive the message (it would go nowhere anyone reads). */
    if (*end || fd < 0 || fd > 1 << 20 || fstat((int)fd, &st) != 0 || !S_ISFIFO(st.st_mode))
        return false;
    size_t len = strlen(msg), off = 0;
    while (off < len) {
        ssize_t w = write((int)fd, msg + off, len - off);
        if (w > 0)
            off += (size_t)w;
        else if (!(w < 0 && errno == EINTR))
            return false;
    }
    return true;
}
