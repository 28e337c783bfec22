/* jit_cache.c: the JIT's on-disk cache (see jit_cache.h for the format).
 * Entries are verified before use and written atomically, so concurrent
 * writers (ranks) and crashed writers never leave a file that loads.
 *
 * A cubin from the cache is run on the GPU, so nothing another user can
 * write may be loaded: the directory is opened once (O_NOFOLLOW), checked on
 * its descriptor (ours, written by us alone) and every entry is opened
 * relative to that descriptor, without following links, and checked the
 * same way. A path is never resolved again between the check and the use. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "jit_cache.h"

static const char entry_magic[8] = {'S', 'Y', 'M', 'M', 'C', 'U', 'B', 'N'};

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int read_all(int fd, void *buf, size_t size)
{
    uint8_t *p = buf;
    while (size > 0) {
        ssize_t n = read(fd, p, size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        size -= (size_t)n;
    }
    return 0;
}

static int write_all(int fd, const void *buf, size_t size)
{
    const uint8_t *p = buf;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        p += n;
        size -= (size_t)n;
    }
    return 0;
}

/* Check a header against the file's size and the expected key. */
static const char *check_header(const uint8_t *h, off_t file_size,
                                const uint8_t key[SYMM_SHA256_SIZE], char *why, size_t why_size)
{
    if (memcmp(h, entry_magic, sizeof entry_magic) != 0)
        return "bad magic";
    if (get_u32(h + 8) != SYMM_JIT_CACHE_FORMAT) {
        snprintf(why, why_size, "format version %u, expected %u", get_u32(h + 8),
                 SYMM_JIT_CACHE_FORMAT);
        return why;
    }
    if (get_u32(h + 12) != SYMM_JIT_CACHE_HEADER_SIZE)
        return "bad header size";
    uint64_t payload = get_u64(h + 16);
    if (payload == 0 || payload > SYMM_JIT_CACHE_MAX_PAYLOAD)
        return "bad payload size";
    if ((uint64_t)file_size != SYMM_JIT_CACHE_HEADER_SIZE + payload) {
        snprintf(why, why_size, "truncated or overlong: %lld bytes, header says %llu",
                 (long long)file_size,
                 (unsigned long long)(SYMM_JIT_CACHE_HEADER_SIZE + payload));
        return why;
    }
    if (memcmp(h + 24, key, SYMM_SHA256_SIZE) != 0)
        return "entry holds another key";
    return NULL;
}

/* Verify the open entry fd; on success *payload is malloc'd. */
static int verify_entry(int fd, const uint8_t key[SYMM_SHA256_SIZE], symm_jit_cache_lookup *lookup,
                        void **payload, size_t *size, char *why, size_t why_size)
{
    struct stat st;
    uint8_t header[SYMM_JIT_CACHE_HEADER_SIZE];
    if (fstat(fd, &st) != 0) {
        snprintf(why, why_size, "fstat: %s", strerror(errno));
        return -1;
    }
    *lookup = SYMM_JIT_CACHE_INVALID;
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, why_size, "not a regular file");
        return 0;
    }
    if (st.st_size < (off_t)SYMM_JIT_CACHE_HEADER_SIZE || read_all(fd, header, sizeof header)) {
        snprintf(why, why_size, "truncated: %lld bytes, shorter than the header",
                 (long long)st.st_size);
        return 0;
    }
    char detail[256];
    const char *bad = check_header(header, st.st_size, key, detail, sizeof detail);
    if (bad) {
        snprintf(why, why_size, "%s", bad);
        return 0;
    }
    size_t n = (size_t)get_u64(header + 16);
    uint8_t *data = malloc(n);
    if (!data) {
        snprintf(why, why_size, "out of memory reading %zu bytes", n);
        return -1;
    }
    uint8_t digest[SYMM_SHA256_SIZE];
    if (read_all(fd, data, n) != 0) {
        snprintf(why, why_size, "truncated while reading");
        free(data);
        return 0;
    }
    symm_sha256(data, n, digest);
    if (memcmp(digest, header + 56, SYMM_SHA256_SIZE) != 0) {
        snprintf(why, why_size, "payload hash mismatch");
        free(data);
        return 0;
    }
    *lookup = SYMM_JIT_CACHE_FOUND;
    *payload = data;
    *size = n;
    return 0;
}

/* Why the file open at fd may not be trusted with code (a cubin is run on
 * the GPU): NULL when it is a regular file of this user that only its owner
 * may write. */
static const char *untrusted_file(const struct stat *st, char *buf, size_t n)
{
    if (!S_ISREG(st->st_mode))
        return "not a regular file";
    if (st->st_uid != geteuid()) {
        snprintf(buf, n, "owned by uid %u, not by this user (uid %u)", (unsigned)st->st_uid,
                 (unsigned)geteuid());
        return buf;
    }
    if (st->st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(buf, n, "writable by %s (mode %03o)", st->st_mode & S_IWOTH ? "other users" : "its group",
                 (unsigned)(st->st_mode & 0777));
        return buf;
    }
    return NULL;
}

int symm_jit_cache_read(int dir_fd, const char *name, const uint8_t key[SYMM_SHA256_SIZE],
                        symm_jit_cache_lookup *lookup, void **payload, size_t *size,
                        char *why, size_t why_size)
{
    *lookup = SYMM_JIT_CACHE_MISS;
    *payload = NULL;
    *size = 0;
    /* Relative to the checked directory, never by path again; a symbolic
     * link is not followed (ELOOP), a FIFO not waited on. */
    int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        if (errno == ENOENT)
            return 0;
        if (errno == ELOOP) {
            *lookup = SYMM_JIT_CACHE_INVALID;
            snprintf(why, why_size, "a symbolic link");
            return 0;
        }
        snprintf(why, why_size, "cannot open %s: %s", name, strerror(errno));
        return -1;
    }
    struct stat st;
    char detail[128];
    const char *bad = fstat(fd, &st) != 0 ? NULL : untrusted_file(&st, detail, sizeof detail);
    int rc = 0;
    if (bad) {
        *lookup = SYMM_JIT_CACHE_INVALID;
        snprintf(why, why_size, "%s", bad);
    } else {
        rc = verify_entry(fd, key, lookup, payload, size, why, why_size);
    }
    close(fd);
    return rc;
}

/* A name for a temporary beside name that nobody can guess. */
static void temp_name(char *out, size_t n, const char *name, unsigned attempt)
{
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        r = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 16) ^ attempt;
    }
    snprintf(out, n, ".%s.%016llx", name, (unsigned long long)r);
}

/* Write the parts to a fresh temporary in the directory, fsync, rename over
 * name: readers see the old entry or the whole new one. */
static int write_atomic(int dir_fd, const char *name, const void *const *parts, const size_t *sizes,
                        int nparts, char *why, size_t why_size)
{
    char tmp[NAME_MAX + 1];
    if (strlen(name) + 18 > NAME_MAX) {
        snprintf(why, why_size, "file name too long: %s", name);
        return -1;
    }
    int fd = -1;
    for (unsigned attempt = 0; fd < 0 && attempt < 8; attempt++) {
        temp_name(tmp, sizeof tmp, name, attempt);
        fd = openat(dir_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        snprintf(why, why_size, "cannot create a file there: %s", strerror(errno));
        return -1;
    }
    const char *failed = NULL;
    for (int i = 0; i < nparts && !failed; i++)
        if (write_all(fd, parts[i], sizes[i]) != 0)
            failed = "write";
    if (!failed && fsync(fd) != 0)
        failed = "fsync";
    int err = errno;
    if (close(fd) != 0 && !failed) {
        failed = "close";
        err = errno;
    }
    if (!failed && renameat(dir_fd, tmp, dir_fd, name) != 0) {
        failed = "rename";
        err = errno;
    }
    if (failed) {
        snprintf(why, why_size, "%s %s: %s", failed, tmp, strerror(err));
        unlinkat(dir_fd, tmp, 0);
        return -1;
    }
    return 0;
}

int symm_jit_cache_write(int dir_fd, const char *name, const uint8_t key[SYMM_SHA256_SIZE],
                         const void *payload, size_t size, char *why, size_t why_size)
{
    uint8_t header[SYMM_JIT_CACHE_HEADER_SIZE];
    memcpy(header, entry_magic, sizeof entry_magic);
    put_u32(header + 8, SYMM_JIT_CACHE_FORMAT);
    put_u32(header + 12, SYMM_JIT_CACHE_HEADER_SIZE);
    put_u64(header + 16, size);
    memcpy(header + 24, key, SYMM_SHA256_SIZE);
    symm_sha256(payload, size, header + 56);
    const void *parts[2] = {header, payload};
    size_t sizes[2] = {sizeof header, size};
    return write_atomic(dir_fd, name, parts, sizes, 2, why, why_size);
}

int symm_jit_write_file(int dir_fd, const char *name, const void *data, size_t size, char *why,
                        size_t why_size)
{
    const void *parts[1] = {data};
    size_t sizes[1] = {size};
    return write_atomic(dir_fd, name, parts, sizes, 1, why, why_size);
}

/* mkdir -p of the directories above dir, each created 0700; existing ones
 * are left as they are (the check is on dir itself, once opened). */
static int make_parents(const char *dir, char *why, size_t why_size)
{
    char path[PATH_MAX];
    size_t len = strlen(dir);
    memcpy(path, dir, len + 1);
    for (size_t i = 1; i < len; i++) {
        if (path[i] != '/')
            continue;
        path[i] = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST) {
            snprintf(why, why_size, "mkdir %s: %s", path, strerror(errno));
            return -1;
        }
        path[i] = '/';
    }
    return 0;
}

/* 0 when the directory open at fd may hold code: a directory of this user
 * that only its owner may write; else -1 with why. */
static int check_dir_fd(int fd, const char *dir, char *why, size_t why_size)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(why, why_size, "fstat %s: %s", dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(why, why_size, "%s is not a directory", dir);
        return -1;
    }
    if (st.st_uid != geteuid()) {
        snprintf(why, why_size, "%s is owned by uid %u, not by this user (uid %u)", dir, (unsigned)st.st_uid,
                 (unsigned)geteuid());
        return -1;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(why, why_size, "%s is writable by %s (mode %03o), expected only its owner to write there", dir,
                 st.st_mode & S_IWOTH ? "other users" : "its group", (unsigned)(st.st_mode & 0777));
        return -1;
    }
    return 0;
}

int symm_jit_cache_open_dir(const char *dir, int *out, int *created, char *why, size_t why_size)
{
    char path[PATH_MAX];
    size_t len = strlen(dir);
    *out = -1;
    *created = 0;
    /* Without trailing slashes: "dir/" would follow a symbolic link. */
    while (len > 1 && dir[len - 1] == '/')
        len--;
    if (len == 0 || len >= sizeof path) {
        snprintf(why, why_size, "bad directory name \"%s\"", dir);
        return SYMM_JIT_DIR_UNAVAILABLE;
    }
    memcpy(path, dir, len);
    path[len] = '\0';
    const int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    int fd = open(path, flags);
    if (fd < 0 && errno == ENOENT) {
        /* Made here, 0700: but whatever stands at the path once it is opened
         * (another user may have put a directory of theirs there first, or
         * renamed one into place since) is checked like any other. */
        if (make_parents(path, why, why_size) != 0)
            return SYMM_JIT_DIR_UNAVAILABLE;
        if (mkdir(path, 0700) != 0 && errno != EEXIST) {
            snprintf(why, why_size, "mkdir %s: %s", path, strerror(errno));
            return SYMM_JIT_DIR_UNAVAILABLE;
        }
        *created = 1;
        fd = open(path, flags);
    }
    if (fd < 0) {
        int err = errno;
        struct stat st;
        /* (O_NOFOLLOW with O_DIRECTORY meets a symbolic link with ENOTDIR
         * or ELOOP; a parent that is not a directory gives ENOTDIR too.) */
        if ((err == ELOOP || err == ENOTDIR) && lstat(path, &st) == 0) {
            snprintf(why, why_size, "%s %s", path, S_ISLNK(st.st_mode) ? "is a symbolic link, expected a "
                     "directory of this user" : "is not a directory");
            return SYMM_JIT_DIR_REFUSED;
        }
        snprintf(why, why_size, "open %s: %s", path, strerror(err));
        return SYMM_JIT_DIR_UNAVAILABLE;
    }
    if (check_dir_fd(fd, path, why, why_size) != 0) {
        close(fd);
        return SYMM_JIT_DIR_REFUSED;
    }
    *out = fd;
    return 0;
}
