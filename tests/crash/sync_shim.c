/* An LD_PRELOAD shim for crash tests that model a power cut: it records, for every file under
 * $WEFT_SHIM_ROOT, the size it had at its last successful fsync/fdatasync, and every rename, in
 * the append-only log $WEFT_SHIM_LOG ("S <size> <path>", "R <from> <to>"). After the process is
 * killed, the test cuts every file back to its last synced size and deletes files never synced:
 * what a machine losing power would have kept. sync_file_range and msync are deliberately not
 * counted: they do not make data durable. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int log_fd = -1;

static void record(const char *fmt, ...) {
    if (log_fd < 0) {
        const char *path = getenv("WEFT_SHIM_LOG");
        if (!path) return;
        log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (log_fd < 0) return;
    }
    char line[2 * PATH_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0 && n < (int)sizeof line) {
        ssize_t w = write(log_fd, line, (size_t)n); /* one O_APPEND write: atomic */
        (void)w;
    }
}

static int under_root(const char *path) {
    const char *root = getenv("WEFT_SHIM_ROOT");
    return root && strncmp(path, root, strlen(root)) == 0;
}

static void synced(int fd) {
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = 0;
    struct stat st;
    if (!under_root(path) || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
    record("S %lld %s\n", (long long)st.st_size, path);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    int r = real(fd);
    if (r == 0) synced(fd);
    return r;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    int r = real(fd);
    if (r == 0) synced(fd);
    return r;
}

int rename(const char *from, const char *to) {
    static int (*real)(const char *, const char *);
    if (!real) real = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
    int r = real(from, to);
    if (r == 0 && under_root(to)) record("R %s %s\n", from, to);
    return r;
}
