/* jit_cache.c: the JIT's on-disk cache (see jit_cache.h for the format).
 * Entries are verified before use and written atomically, so concurrent
 * writers (ranks) and crashed writers never leave a file that loads. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

int symm_jit_cache_read(const char *path, const uint8_t key[SYMM_SHA256_SIZE],
                        symm_jit_cache_lookup *lookup, void **payload, size_t *size,
                        char *why, size_t why_size)
{
    *lookup = SYMM_JIT_CACHE_MISS;
    *payload = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return 0;
        snprintf(why, why_size, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    int rc = verify_entry(fd, key, lookup, payload, size, why, why_size);
    close(fd);
    return rc;
}

/* Write the parts to a fresh temporary beside path, fsync, rename over path. */
static int write_atomic(const char *path, const void *const *parts, const size_t *sizes,
                        int nparts, char *why, size_t why_size)
{
    char tmp[PATH_MAX];
    const char *slash = strrchr(path, '/');
    int dir_len = slash ? (int)(slash - path + 1) : 0;
    if (snprintf(tmp, sizeof tmp, "%.*s.%s.XXXXXX", dir_len, path, slash ? slash + 1 : path) >=
        (int)sizeof tmp) {
        snprintf(why, why_size, "path too long: %s", path);
        return -1;
    }
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_size, "cannot create a file in %.*s: %s", dir_len ? dir_len : 1,
                 dir_len ? path : ".", strerror(errno));
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
    if (!failed && rename(tmp, path) != 0) {
        failed = "rename";
        err = errno;
    }
    if (failed) {
        snprintf(why, why_size, "%s %s: %s", failed, tmp, strerror(err));
        unlink(tmp);
        return -1;
    }
    return 0;
}

int symm_jit_cache_write(const char *path, const uint8_t key[SYMM_SHA256_SIZE],
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
    return write_atomic(path, parts, sizes, 2, why, why_size);
}

int symm_jit_write_file(const char *path, const void *data, size_t size, char *why,
                        size_t why_size)
{
    const void *parts[1] = {data};
    size_t sizes[1] = {size};
    return write_atomic(path, parts, sizes, 1, why, why_size);
}

int symm_jit_mkdirs(const char *dir, char *why, size_t why_size)
{
    char path[PATH_MAX];
    size_t len = strlen(dir);
    if (len == 0 || len >= sizeof path) {
        snprintf(why, why_size, "bad directory name \"%s\"", dir);
        return -1;
    }
    memcpy(path, dir, len + 1);
    /* Create each missing prefix in turn; existing ones are left as they are. */
    for (size_t i = 1; i <= len; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        char saved = path[i];
        path[i] = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST) {
            snprintf(why, why_size, "mkdir %s: %s", path, strerror(errno));
            return -1;
        }
        path[i] = saved;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(why, why_size, "%s is not a directory", dir);
        return -1;
    }
    return 0;
}

int symm_jit_dir_trusted(const char *dir, int *exists, char *why, size_t why_size)
{
    struct stat st;
    *exists = 0;
    if (stat(dir, &st) != 0) {
        /* Missing (or under a non-directory): symm_jit_mkdirs will say. */
        if (errno == ENOENT || errno == ENOTDIR)
            return 0;
        snprintf(why, why_size, "stat %s: %s", dir, strerror(errno));
        return -1;
    }
    *exists = 1;
    if (!S_ISDIR(st.st_mode)) {
        snprintf(why, why_size, "%s is not a directory", dir);
        return -1;
    }
    if (st.st_uid != geteuid()) {
        snprintf(why, why_size, "%s is owned by uid %u, not by this user (uid %u)", dir,
                 (unsigned)st.st_uid, (unsigned)geteuid());
        return -1;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(why, why_size, "%s is writable by %s (mode %03o), expected only its owner to write there", dir,
                 st.st_mode & S_IWOTH ? "other users" : "its group", (unsigned)(st.st_mode & 0777));
        return -1;
    }
    return 0;
}
