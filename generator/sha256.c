/* sha256.c: SHA-256 (FIPS 180-4) for the generator's content hashes. Plain,
 * portable C; speed is a few hundred MB/s, far more than generation needs. */
#include <string.h>

#include "sg_sha256.h"

static const uint32_t K[64] = {
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

static void compress(uint32_t s[8], const uint8_t p[64])
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = s[0], b = s[1], c = s[2], d = s[3], e = s[4], f = s[5], g = s[6], h = s[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = e; e = d + t1;
        d = c; c = b; b = a; a = t1 + t2;
    }
    s[0] += a; s[1] += b; s[2] += c; s[3] += d;
    s[4] += e; s[5] += f; s[6] += g; s[7] += h;
}

void sg_sha256_init(sg_sha256 *h)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(h->state, iv, sizeof iv);
    h->total_bytes = 0;
    h->block_len = 0;
}

void sg_sha256_update(sg_sha256 *h, const void *data, size_t len)
{
    const uint8_t *p = data;
    h->total_bytes += len;
    if (h->block_len) {
        size_t take = 64 - h->block_len < len ? 64 - h->block_len : len;
        memcpy(h->block + h->block_len, p, take);
        h->block_len += take;
        p += take;
        len -= take;
        if (h->block_len < 64)
            return;
        compress(h->state, h->block);
        h->block_len = 0;
    }
    for (; len >= 64; p += 64, len -= 64)
        compress(h->state, p);
    memcpy(h->block, p, len);
    h->block_len = len;
}

void sg_sha256_final(sg_sha256 *h, uint8_t digest[SG_SHA256_SIZE])
{
    uint64_t bits = h->total_bytes * 8;
    uint8_t pad[72] = {0x80};
    size_t pad_len = (h->block_len < 56 ? 56 : 120) - h->block_len;
    for (int i = 0; i < 8; i++)
        pad[pad_len + i] = (uint8_t)(bits >> (56 - 8 * i));
    sg_sha256_update(h, pad, pad_len + 8);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++)
            digest[4 * i + j] = (uint8_t)(h->state[i] >> (24 - 8 * j));
}

void sg_sha256_to_hex(const uint8_t digest[SG_SHA256_SIZE], char hex[SG_SHA256_HEX_SIZE])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < SG_SHA256_SIZE; i++) {
        hex[2 * i] = digits[digest[i] >> 4];
        hex[2 * i + 1] = digits[digest[i] & 15];
    }
    hex[2 * SG_SHA256_SIZE] = '\0';
}

void sg_sha256_hex(const void *data, size_t len, char hex[SG_SHA256_HEX_SIZE])
{
    sg_sha256 h;
    uint8_t digest[SG_SHA256_SIZE];
    sg_sha256_init(&h);
    sg_sha256_update(&h, data, len);
    sg_sha256_final(&h, digest);
    sg_sha256_to_hex(digest, hex);
}
