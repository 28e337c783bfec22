/* threads.h: work spread over a few host threads (the CPU reference's
 * combine; the tests' and moe_bench's per-rank inputs, tests/support/
 * par_ranks.h); not installed. */
#ifndef SYMM_THREADS_H
#define SYMM_THREADS_H

#include <stdint.h>

/* The most threads symm_run_threads starts, the caller's included. */
#define SYMM_MAX_THREADS 16

/* Threads for `wanted` (at least 1): at most the online CPUs and
 * SYMM_MAX_THREADS. */
int symm_threads_for(int64_t wanted);

/* worker(arg) on `threads` threads (at most SYMM_MAX_THREADS), the calling
 * one included; returns once every one has returned. A thread that cannot
 * start is not tried again: the workers take their work from arg as long
 * as some is left (each claims the next piece), so fewer threads still do
 * all of it. */
void symm_run_threads(int threads, void *(*worker)(void *), void *arg);

#endif
