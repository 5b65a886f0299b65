/* LD_PRELOAD shim: a slow file system under one directory, for one rank.
 *
 * write, writev, pwrite and pwrite64 on a file whose path starts with $SLOW_WRITES_DIR, in the
 * process whose $RANK is $SLOW_WRITES_RANK, sleep len / $SLOW_WRITES_BYTES_PER_S seconds before
 * the real call (a disk that takes that long to accept the bytes). Everything else passes
 * straight through. The checkpoint's own code (torch.distributed.checkpoint, torch.save, Python's
 * file objects, libstdc++ streams) is left as it is: the slowness is below it.
 * Built by tests/test_outside_faults.py with `gcc -shared -fPIC ... -ldl`.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static double bytes_per_s = -1;  /* < 0: not read yet; 0: this process is not slowed */
static const char *dir;

static void setup(void) {
    const char *rank = getenv("RANK"), *slow = getenv("SLOW_WRITES_RANK");
    const char *rate = getenv("SLOW_WRITES_BYTES_PER_S");
    dir = getenv("SLOW_WRITES_DIR");
    bytes_per_s = (rank && slow && rate && dir && strcmp(rank, slow) == 0) ? atof(rate) : 0;
}

static void slow_down(int fd, size_t bytes) {
    char link[64], path[PATH_MAX];
    if (bytes_per_s < 0) setup();
    if (bytes_per_s <= 0 || bytes == 0) return;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = 0;
    if (strncmp(path, dir, strlen(dir)) != 0) return;
    double seconds = bytes / bytes_per_s;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

ssize_t write(int fd, const void *buf, size_t count) {
    static ssize_t (*real)(int, const void *, size_t);
    if (!real) real = dlsym(RTLD_NEXT, "write");
    slow_down(fd, count);
    return real(fd, buf, count);
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    static ssize_t (*real)(int, const struct iovec *, int);
    size_t total = 0;
    if (!real) real = dlsym(RTLD_NEXT, "writev");
    for (int i = 0; i < iovcnt; i++) total += iov[i].iov_len;
    slow_down(fd, total);
    return real(fd, iov, iovcnt);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    static ssize_t (*real)(int, const void *, size_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "pwrite");
    slow_down(fd, count);
    return real(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off64_t offset) {
    static ssize_t (*real)(int, const void *, size_t, off64_t);
    if (!real) real = dlsym(RTLD_NEXT, "pwrite64");
    slow_down(fd, count);
    return real(fd, buf, count, offset);
}
