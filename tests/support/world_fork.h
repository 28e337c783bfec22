/* world_fork.h: test helpers for code that needs several processes: run a
 * function as N forked "ranks" and collect what each reports through shared
 * memory, plus unique job ids, temporary directories, random bytes and
 * descriptor counts. Criterion's assertions do not work in a forked child, so
 * a rank reports failure by returning non-zero with a message in res->msg,
 * and the test asserts on the results in the parent. */
#ifndef WORLD_FORK_H
#define WORLD_FORK_H

#include <stddef.h>
#include <stdint.h>

typedef struct wf_result {
    int done;         /* the function returned (the process was not killed) */
    int code;         /* what it returned; 0: success */
    int status;       /* a symm_status the rank saw, for the test to check */
    double elapsed_s; /* as the rank measured it */
    char msg[1024];   /* what went wrong, or a symm_last_error() to check */
    /* Scratch shared by all ranks of one run. */
    volatile int flag;
    unsigned char token[32];
} wf_result;

/* One rank: index i of n (all holds every rank's result). Runs in a child. */
typedef int (*wf_rank_fn)(int i, void *arg, wf_result *res, wf_result *all);

/* Run fn in n forked children and wait at most wait_s for them (stragglers
 * are killed and keep done = 0). Returns shared memory for wf_free. */
wf_result *wf_run(int n, wf_rank_fn fn, void *arg, double wait_s);
void wf_free(wf_result *r, int n);

/* Like snprintf into res->msg, returning 1 (a failing code). */
int wf_failf(wf_result *res, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A new directory under /tmp (0700); wf_rmtree removes it and what it holds.
 * wf_cleanup_tempdirs removes every one this process made and has not
 * removed: a suite's .fini, which runs even after a failed assertion. */
void wf_tempdir(char *buf, size_t n);
void wf_rmtree(const char *path);
void wf_cleanup_tempdirs(void);

/* A job id no other test uses: "t-<pid>-<random>". */
void wf_job_id(char *buf, size_t n);

/* 64 random hex characters. */
void wf_secret(char buf[65]);

void wf_random(void *buf, size_t n);

/* Deterministic bytes from (seed, a, b): every rank can compute every
 * other rank's data. */
void wf_fill(void *buf, size_t n, uint64_t seed, uint64_t a, uint64_t b);

/* Open descriptors of this process. */
int wf_count_fds(void);

/* This test process ends after `seconds`, killed by SIGALRM after a line on
 * stderr (Criterion reports the test as crashed by that signal). The CPU
 * tests use it instead of Criterion's .timeout: the runner of Criterion 2.4.1
 * (its BoxFort timeout queue) loses a 48-byte request when tests with
 * timeouts overlap under load, and AddressSanitizer's leak check then fails a
 * binary whose tests all passed. Call it first in the test or its .init. */
void wf_watchdog(unsigned seconds);

/* A TCP port of 127.0.0.1 that was free a moment ago (bound to port 0 and
 * closed), for a root address; 0 when none could be had. */
int wf_free_port(void);

double wf_now(void);
void wf_sleep(double seconds);

#endif
