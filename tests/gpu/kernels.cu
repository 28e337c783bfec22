/* kernels.cu: the device code of the heap GPU tests, kept apart from the
 * JIT module so that these tests depend only on the driver and libsymm.
 *
 * The tests load it as PTX (cuModuleLoadData; the driver compiles it for the
 * GPU at hand) from kernels_ptx.h, which is generated from this file: after
 * editing it or pattern.h, run tests/gpu/gen_kernels_ptx.sh from the
 * repository root. */
#include "pattern.h"

/* Rank `rank` writes, into slot `rank` (slot_words 32-bit words) of the
 * buffer of every rank p, the words pattern_word(seed, rank, p, i). peers[p]
 * is rank p's buffer as this rank sees it. */
extern "C" __global__ void write_peer_patterns(const unsigned long long *peers, int ranks,
                                               int rank, unsigned long long slot_words,
                                               unsigned long long seed)
{
    unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (int p = 0; p < ranks; p++) {
        unsigned int *slot = (unsigned int *)peers[p] + (unsigned long long)rank * slot_words;
        for (unsigned long long i = first; i < slot_words; i += stride)
            slot[i] = pattern_word(seed, rank, p, i);
    }
}
