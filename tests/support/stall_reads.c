/* A fault for tests, loaded with LD_PRELOAD: a read that does not return, as
 * on a hung network filesystem. pread and preadv (and their 64-bit names) of a
 * file whose path contains DSTK_TEST_STALL_PATH, at or past byte
 * DSTK_TEST_STALL_FROM (default 0), block while the file DSTK_TEST_STALL_GATE
 * exists; the first read to block creates DSTK_TEST_STALL_GATE.stalled, so
 * that a test knows the stall has begun. Unset, every read goes through. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static void stall(int fd, off_t offset) {
    const char* gate = getenv("DSTK_TEST_STALL_GATE");
    const char* part = getenv("DSTK_TEST_STALL_PATH");
    const char* from = getenv("DSTK_TEST_STALL_FROM");
    if (!gate || !part || offset < (from ? atoll(from) : 0)) return;
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return;
    path[n] = '\0';
    if (!strstr(path, part) || access(gate, F_OK) != 0) return;
    char note[PATH_MAX];
    snprintf(note, sizeof note, "%s.stalled", gate);
    const int fdn = open(note, O_WRONLY | O_CREAT, 0644);
    if (fdn >= 0) close(fdn);
    const struct timespec tick = {0, 10 * 1000 * 1000};
    while (access(gate, F_OK) == 0) nanosleep(&tick, NULL);
}

typedef ssize_t (*pread_fn)(int, void*, size_t, off_t);
typedef ssize_t (*preadv_fn)(int, const struct iovec*, int, off_t);

ssize_t pread(int fd, void* buf, size_t count, off_t offset) {
    static pread_fn real;
    if (!real) real = (pread_fn)dlsym(RTLD_NEXT, "pread");
    stall(fd, offset);
    return real(fd, buf, count, offset);
}

ssize_t pread64(int fd, void* buf, size_t count, off_t offset) {
    static pread_fn real;
    if (!real) real = (pread_fn)dlsym(RTLD_NEXT, "pread64");
    stall(fd, offset);
    return real(fd, buf, count, offset);
}

ssize_t preadv(int fd, const struct iovec* iov, int n, off_t offset) {
    static preadv_fn real;
    if (!real) real = (preadv_fn)dlsym(RTLD_NEXT, "preadv");
    stall(fd, offset);
    return real(fd, iov, n, offset);
}

ssize_t preadv64(int fd, const struct iovec* iov, int n, off_t offset) {
    static preadv_fn real;
    if (!real) real = (preadv_fn)dlsym(RTLD_NEXT, "preadv64");
    stall(fd, offset);
    return real(fd, iov, n, offset);
}
