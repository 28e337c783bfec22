/* sha256.c: a small, portable SHA-256 (FIPS 180-4), byte-order independent. */
#include <string.h>

#include "sha256.h"

static const uint32_t round_constants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void compress(uint32_t state[8], const uint8_t block[64])
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 |
               (uint32_t)block[4 * i + 2] << 8 | (uint32_t)block[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                      round_constants[i] + w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
    state[4] += e;
    state[5] += f;
    state[6] += g;
    state[7] += h;
}

void symm_sha256_init(symm_sha256_ctx *h)
{
    static const uint32_t initial[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(h->state, initial, sizeof initial);
    h->total_bytes = 0;
    h->block_len = 0;
}

void symm_sha256_update(symm_sha256_ctx *h, const void *data, size_t len)
{
    const uint8_t *p = data;
    h->total_bytes += len;
    while (len > 0) {
        size_t take = 64 - h->block_len;
        if (take > len)
            take = len;
        memcpy(h->block + h->block_len, p, take);
        h->block_len += take;
        p += take;
        len -= take;
        if (h->block_len == 64) {
            compress(h->state, h->block);
            h->block_len = 0;
        }
    }
}

void symm_sha256_final(symm_sha256_ctx *h, uint8_t digest[SYMM_SHA256_SIZE])
{
    uint64_t bits = h->total_bytes * 8;
    h->block[h->block_len++] = 0x80;
    if (h->block_len > 56) {
        memset(h->block + h->block_len, 0, 64 - h->block_len);
        compress(h->state, h->block);
        h->block_len = 0;
    }
    memset(h->block + h->block_len, 0, 56 - h->block_len);
    for (int i = 0; i < 8; i++)
        h->block[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    compress(h->state, h->block);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++)
            digest[4 * i + j] = (uint8_t)(h->state[i] >> (24 - 8 * j));
}

void symm_sha256(const void *data, size_t len, uint8_t digest[SYMM_SHA256_SIZE])
{
    symm_sha256_ctx h;
    symm_sha256_init(&h);
    symm_sha256_update(&h, data, len);
    symm_sha256_final(&h, digest);
}

void symm_sha256_hex(const uint8_t digest[SYMM_SHA256_SIZE], char hex[SYMM_SHA256_HEX_SIZE])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < SYMM_SHA256_SIZE; i++) {
        hex[2 * i] = digits[digest[i] >> 4];
        hex[2 * i + 1] = digits[digest[i] & 15];
    }
    hex[2 * SYMM_SHA256_SIZE] = '\0';
}

void symm_sha256_hex_of(const void *data, size_t len, char hex[SYMM_SHA256_HEX_SIZE])
{
    uint8_t digest[SYMM_SHA256_SIZE];
    symm_sha256(data, len, digest);
    symm_sha256_hex(digest, hex);
}

/* RFC 2104: HMAC(K, m) = H((K0 ^ opad) || H((K0 ^ ipad) || m)), K0 the key
 * padded to the 64-byte block (hashed first when longer). */
void symm_hmac_sha256_init(symm_hmac_sha256_ctx *m, const void *key, size_t key_len)
{
    uint8_t k0[64] = {0}, pad[64];
    if (key_len > sizeof k0)
        symm_sha256(key, key_len, k0);
    else if (key_len > 0)
        memcpy(k0, key, key_len);
    for (int i = 0; i < 64; i++)
        pad[i] = k0[i] ^ 0x36;
    symm_sha256_init(&m->inner);
    symm_sha256_update(&m->inner, pad, sizeof pad);
    for (int i = 0; i < 64; i++)
        pad[i] = k0[i] ^ 0x5c;
    symm_sha256_init(&m->outer);
    symm_sha256_update(&m->outer, pad, sizeof pad);
    memset(k0, 0, sizeof k0);
    memset(pad, 0, sizeof pad);
}

void symm_hmac_sha256_update(symm_hmac_sha256_ctx *m, const void *data, size_t len)
{
    symm_sha256_update(&m->inner, data, len);
}

void symm_hmac_sha256_final(symm_hmac_sha256_ctx *m, uint8_t mac[SYMM_SHA256_SIZE])
{
    uint8_t inner[SYMM_SHA256_SIZE];
    symm_sha256_final(&m->inner, inner);
    symm_sha256_update(&m->outer, inner, sizeof inner);
    symm_sha256_final(&m->outer, mac);
    memset(inner, 0, sizeof inner);
    memset(m, 0, sizeof *m);
}

void symm_hmac_sha256(const void *key, size_t key_len, const void *data, size_t len,
                      uint8_t mac[SYMM_SHA256_SIZE])
{
    symm_hmac_sha256_ctx m;
    symm_hmac_sha256_init(&m, key, key_len);
    symm_hmac_sha256_update(&m, data, len);
    symm_hmac_sha256_final(&m, mac);
}
