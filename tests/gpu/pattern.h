/* pattern.h: the words the heap GPU tests write into peers' memory and check
 * on the host; shared by the kernel (kernels.cu) and the C tests, so that
 * both sides compute the same function. */
#ifndef HEAP_TEST_PATTERN_H
#define HEAP_TEST_PATTERN_H

#ifdef __CUDACC__
#define PATTERN_FN static __host__ __device__ inline
#else
#define PATTERN_FN static inline
#endif

/* Word i of what rank src writes to rank dst in a run seeded with seed
 * (splitmix64 of the four). */
PATTERN_FN unsigned int pattern_word(unsigned long long seed, int src, int dst,
                                     unsigned long long i)
{
    unsigned long long x = seed ^ ((unsigned long long)src << 56) ^
                           ((unsigned long long)dst << 40) ^ (i * 0x9E3779B97F4A7C15ull);
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (unsigned int)x;
}

#endif
