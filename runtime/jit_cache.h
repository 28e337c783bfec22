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

/* Read and verify the entry at path for key. On FOUND, *payload (malloc'd)
 * and *size hold the cubin. Returns -1 (why set) only when the file exists
 * but cannot be read (or memory runs out). */
int symm_jit_cache_read(const char *path, const uint8_t key[SYMM_SHA256_SIZE],
                        symm_jit_cache_lookup *lookup, void **payload, size_t *size,
                        char *why, size_t why_size);

/* Write the entry for key atomically: a temporary file beside path, fsync,
 * rename over path. */
int symm_jit_cache_write(const char *path, const uint8_t key[SYMM_SHA256_SIZE],
                         const void *payload, size_t size, char *why, size_t why_size);

/* Write a plain file atomically (temporary, fsync, rename), mode 0600. */
int symm_jit_write_file(const char *path, const void *data, size_t size, char *why,
                        size_t why_size);

/* mkdir -p dir with mode 0700 for each directory created. */
int symm_jit_mkdirs(const char *dir, char *why, size_t why_size);

/* May dir be trusted with code? It must be a directory owned by the effective
 * user and not writable by others. *exists is set to 0 (and 0 returned) when
 * it does not exist yet. */
int symm_jit_dir_trusted(const char *dir, int *exists, char *why, size_t why_size);

#endif
