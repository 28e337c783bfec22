/* threads.c: see threads.h. */
#include "threads.h"

#include <pthread.h>
#include <unistd.h>

int symm_threads_for(int64_t wanted)
{
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t t = wanted < SYMM_MAX_THREADS ? wanted : SYMM_MAX_THREADS;
    if (cpus >= 1 && t > cpus)
        t = cpus;
    return t < 1 ? 1 : (int)t;
}

void symm_run_threads(int threads, void *(*worker)(void *), void *arg)
{
    pthread_t t[SYMM_MAX_THREADS];
    if (threads > SYMM_MAX_THREADS)
        threads = SYMM_MAX_THREADS;
    int started = 0;
    while (started < threads - 1 && pthread_create(&t[started], NULL, worker, arg) == 0)
        started++;
    worker(arg);
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
}
