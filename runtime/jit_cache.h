/* jit_cache.h: the JIT's on-disk cache: entry format, verified reads, atomic
 * writes and the cache directory. Internal; not installed.
 *
 * These never fail a compile: each returns -1 with the reason in `why`, and
 * jit.c turns that into the result's warning. */
#ifndef SYMM_JIT_CACHE_H
#define SYMM_JIT_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "sha256.h"

/* Bump when the entry format or what goes into the key changes. */
#define SYMM_JIT_CACHE_FORMAT 1u

/* Header of an entry, little-endian:
 *   0  magic "SYMMCUBN"   8  u32 format   12 u32 header size
 *   16 u64 payload size   24 key[32]      56 SHA-256(payload)[32]
 *   88 payload (the cubin) */
#define SYMM_JIT_CACHE_HEADER_SIZE 88u

/* Payloads above this are refused (a cubin is kilobytes to megabytes). */
#define SYMM_JIT_CACHE_MAX_PAYLOAD ((uint64_t)1 << 30)

typedef enum symm_jit_cache_lookup {
    SYMM_JIT_CACHE_MISS = 0,    /* no entry */
    SYMM_JIT_CACHE_FOUND = 1,   /* a verified entry */
    SYMM_JIT_CACHE_INVALID = 2, /* an entry that must not be loaded; why says why */
} symm_jit_cache_lookup;

/* symm_jit_cache_open_dir's failures. */
enum { SYMM_JIT_DIR_REFUSED = -1, SYMM_JIT_DIR_UNAVAILABLE = -2 };

/* Open the cache directory dir for the entries below: opened with
 * O_DIRECTORY | O_NOFOLLOW and checked on the descriptor (a directory owned
 * by the effective user that neither its group nor others may write).
 * Missing, it is created with mode 0700 (its missing parents too), *created
 * set, and checked the same way once opened. Returns 0 with *fd, or
 * SYMM_JIT_DIR_REFUSED (it exists but may not hold code) or
 * SYMM_JIT_DIR_UNAVAILABLE (it cannot be created or opened), why set. */
int symm_jit_cache_open_dir(const char *dir, int *fd, int *created, char *why, size_t why_size);

/* Read and verify the entry called name in the directory dir_fd for key.
 * It is opened without following a symbolic link and must be a regular
 * file of the effective user that neither its group nor others may write;
 * anything else is INVALID (never loaded). On FOUND, *payload (malloc'd)
 * and *size hold the cubin. Returns -1 (why set) only when the file exists
 * but cannot be read (or memory runs out). */
int symm_jit_cache_read(int dir_fd, const char *name, const uint8_t key[SYMM_SHA256_SIZE],
                        symm_jit_cache_lookup *lookup, void **payload, size_t *size,
                        char *why, size_t why_size);

/* Write the entry for key atomically: a temporary (mode 0600, a name nobody
 * can guess) in dir_fd, fsync, rename over name. */
int symm_jit_cache_write(int dir_fd, const char *name, const uint8_t key[SYMM_SHA256_SIZE],
                         const void *payload, size_t size, char *why, size_t why_size);

/* Write a plain file into dir_fd atomically (temporary, fsync, rename), mode 0600. */
int symm_jit_write_file(int dir_fd, const char *name, const void *data, size_t size, char *why,
                        size_t why_size);

#endif
