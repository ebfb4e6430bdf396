/* An LD_PRELOAD shim for crash tests that model a power cut: it records, for every file under
 * $WEFT_SHIM_ROOT, in the append-only log $WEFT_SHIM_LOG: the size a file had at its last
 * successful fsync/fdatasync ("S <size> <path>"), each file it created ("C <path>"), each
 * rename ("R <from> <to> <backup>", where <backup> is a hard link to what <to> held before, or
 * "-"), and each fsync of a directory ("D <dir>"). After the process is killed, the test cuts
 * every file back to its last synced size, deletes files never synced, and undoes the names
 * that no directory sync made durable: a file created, or a rename made, after its
 * directory's last fsync. That is what a machine losing power may keep. sync_file_range and
 * msync are deliberately not counted: they do not make data durable. A deletion ("U <path>
 * <backup>", <backup> a hard link to the deleted file) is undone the same way when no fsync of
 * its directory followed it: the file comes back, cut to what was synced of it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
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

/* The path an open descriptor names, when it is under the root. */
static int path_of(int fd, char *path) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, PATH_MAX - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    return under_root(path);
}

static void synced(int fd) {
    char path[PATH_MAX];
    struct stat st;
    if (!path_of(fd, path) || fstat(fd, &st) != 0) return;
    if (S_ISREG(st.st_mode)) record("S %lld %s\n", (long long)st.st_size, path);
    if (S_ISDIR(st.st_mode)) record("D %s\n", path);
}

static void created(int fd) {
    char path[PATH_MAX];
    struct stat st;
    if (path_of(fd, path) && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) record("C %s\n", path);
}

/* open(2) and its variants, noting a file the call created. */
#define OPEN_LIKE(NAME, ...)                                                                  \
    int NAME(__VA_ARGS__, int flags, ...) {                                                   \
        static int (*real)(ARGS_DECL, int, ...);                                              \
        if (!real) real = (int (*)(ARGS_DECL, int, ...))dlsym(RTLD_NEXT, #NAME);              \
        mode_t mode = 0;                                                                      \
        if (flags & O_CREAT) {                                                                \
            va_list ap;                                                                       \
            va_start(ap, flags);                                                              \
            mode = (mode_t)va_arg(ap, int);                                                   \
            va_end(ap);                                                                       \
        }                                                                                     \
        struct stat st;                                                                       \
        int existed = !(flags & O_CREAT) || EXISTS;                                           \
        int fd = real(ARGS_CALL, flags, mode);                                                \
        if (fd >= 0 && !existed) created(fd);                                                 \
        return fd;                                                                            \
    }

#define ARGS_DECL const char *
#define ARGS_CALL path
#define EXISTS (stat(path, &st) == 0)
OPEN_LIKE(open, const char *path)
OPEN_LIKE(open64, const char *path)
#undef ARGS_DECL
#undef ARGS_CALL
#undef EXISTS
#define ARGS_DECL int, const char *
#define ARGS_CALL dirfd, path
#define EXISTS (fstatat(dirfd, path, &st, 0) == 0)
OPEN_LIKE(openat, int dirfd, const char *path)
OPEN_LIKE(openat64, int dirfd, const char *path)

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

/* A hard link to what `to` holds before a rename replaces it, beside the log (the test puts
 * it back if the rename does not become durable); "-" when `to` does not exist. */
static void keep_old(const char *to, char *backup) {
    static unsigned long next;
    const char *log = getenv("WEFT_SHIM_LOG");
    strcpy(backup, "-");
    if (!log || access(to, F_OK) != 0) return;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s.old.%d.%lu", log, (int)getpid(), __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED));
    if (link(to, path) == 0) strcpy(backup, path);
}

int rename(const char *from, const char *to) {
    static int (*real)(const char *, const char *);
    if (!real) real = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
    char backup[PATH_MAX];
    int watched = under_root(to);
    if (watched) keep_old(to, backup);
    int r = real(from, to);
    if (r == 0 && watched) record("R %s %s %s\n", from, to, backup);
    return r;
}

/* `path` made absolute (against the working directory, or the directory `dirfd` names). */
static int absolute(int dirfd, const char *path, char *out) {
    if (path[0] == '/') {
        snprintf(out, PATH_MAX, "%s", path);
        return 1;
    }
    char base[PATH_MAX];
    if (dirfd == AT_FDCWD) {
        if (!getcwd(base, sizeof base)) return 0;
    } else {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        ssize_t n = readlink(link, base, sizeof base - 1);
        if (n <= 0) return 0;
        base[n] = 0;
    }
    return snprintf(out, PATH_MAX, "%s/%s", base, path) < PATH_MAX;
}

static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);

static void find_real(void) {
    if (!real_unlink) real_unlink = (int (*)(const char *))dlsym(RTLD_NEXT, "unlink");
    if (!real_unlinkat) real_unlinkat = (int (*)(int, const char *, int))dlsym(RTLD_NEXT, "unlinkat");
}

/* Before deleting a regular file under the root: a hard link to it beside the log. */
static int before_delete(int dirfd, const char *path, char *full, char *backup) {
    struct stat st;
    int watched = absolute(dirfd, path, full) && under_root(full) && lstat(full, &st) == 0 &&
                  S_ISREG(st.st_mode);
    if (watched) keep_old(full, backup);
    return watched;
}

/* After it: the deletion logged, or the link dropped when it failed. */
static void after_delete(int watched, int r, const char *full, const char *backup) {
    if (!watched) return;
    if (r == 0) {
        record("U %s %s\n", full, backup);
    } else if (strcmp(backup, "-") != 0) {
        int saved = errno;
        real_unlink(backup);
        errno = saved;
    }
}

int unlink(const char *path) {
    find_real();
    char full[PATH_MAX], backup[PATH_MAX];
    int watched = before_delete(AT_FDCWD, path, full, backup);
    int r = real_unlink(path);
    after_delete(watched, r, full, backup);
    return r;
}

int unlinkat(int dirfd, const char *path, int flags) {
    find_real();
    if (flags & AT_REMOVEDIR) return real_unlinkat(dirfd, path, flags);
    char full[PATH_MAX], backup[PATH_MAX];
    int watched = before_delete(dirfd, path, full, backup);
    int r = real_unlinkat(dirfd, path, flags);
    after_delete(watched, r, full, backup);
    return r;
}
