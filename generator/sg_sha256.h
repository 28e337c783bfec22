/* sg_sha256.h: the generator's own SHA-256 (FIPS 180-4), for the content
 * hashes in generated stubs and in the manifest. The runtime has a separate
 * copy: the generator and libsymm share no internals. */
#ifndef SG_SHA256_H
#define SG_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SG_SHA256_SIZE 32
#define SG_SHA256_HEX_SIZE (2 * SG_SHA256_SIZE + 1)

typedef struct sg_sha256 {
    uint32_t state[8];
    uint64_t total_bytes;
    uint8_t block[64];
    size_t block_len;
} sg_sha256;

void sg_sha256_init(sg_sha256 *h);
void sg_sha256_update(sg_sha256 *h, const void *data, size_t len);
/* Writes the digest; h must be initialised again before reuse. */
void sg_sha256_final(sg_sha256 *h, uint8_t digest[SG_SHA256_SIZE]);
/* Lowercase hex of a digest, NUL-terminated. */
void sg_sha256_to_hex(const uint8_t digest[SG_SHA256_SIZE], char hex[SG_SHA256_HEX_SIZE]);
/* Lowercase hex digest of one buffer. */
void sg_sha256_hex(const void *data, size_t len, char hex[SG_SHA256_HEX_SIZE]);

#endif
