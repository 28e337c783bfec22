/* sha256.h: SHA-256 (FIPS 180-4), used to key the JIT cache, to check the
 * integrity of cache entries and sources, and by symmgen for the hashes it
 * writes into stubs and the manifest; HMAC-SHA256 (RFC 2104), with which the
 * ranks of a world across hosts prove the job secret to each other.
 * Internal; not installed. */
#ifndef SYMM_SHA256_H
#define SYMM_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SYMM_SHA256_SIZE 32
#define SYMM_SHA256_HEX_SIZE (2 * SYMM_SHA256_SIZE + 1)

typedef struct symm_sha256_ctx {
    uint32_t state[8];
    uint64_t total_bytes;
    uint8_t block[64];
    size_t block_len;
} symm_sha256_ctx;

void symm_sha256_init(symm_sha256_ctx *h);
void symm_sha256_update(symm_sha256_ctx *h, const void *data, size_t len);
/* Writes the digest; h must be initialised again before reuse. */
void symm_sha256_final(symm_sha256_ctx *h, uint8_t digest[SYMM_SHA256_SIZE]);

/* One-shot digest of a buffer. */
void symm_sha256(const void *data, size_t len, uint8_t digest[SYMM_SHA256_SIZE]);

/* Lowercase hex of a digest, NUL-terminated. */
void symm_sha256_hex(const uint8_t digest[SYMM_SHA256_SIZE], char hex[SYMM_SHA256_HEX_SIZE]);

/* Lowercase hex digest of one buffer. */
void symm_sha256_hex_of(const void *data, size_t len, char hex[SYMM_SHA256_HEX_SIZE]);

/* HMAC-SHA256 (RFC 2104) with a key of any length. */
typedef struct symm_hmac_sha256_ctx {
    symm_sha256_ctx inner, outer;
} symm_hmac_sha256_ctx;

void symm_hmac_sha256_init(symm_hmac_sha256_ctx *m, const void *key, size_t key_len);
void symm_hmac_sha256_update(symm_hmac_sha256_ctx *m, const void *data, size_t len);
/* Writes the MAC and wipes m. */
void symm_hmac_sha256_final(symm_hmac_sha256_ctx *m, uint8_t mac[SYMM_SHA256_SIZE]);
void symm_hmac_sha256(const void *key, size_t key_len, const void *data, size_t len,
                      uint8_t mac[SYMM_SHA256_SIZE]);

#endif
