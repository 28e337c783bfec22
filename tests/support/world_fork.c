/* world_fork.c: see world_fork.h. */
#include "world_fork.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double wf_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char watchdog_msg[96];
static size_t watchdog_len;

static void watchdog_fire(int sig)
{
    ssize_t ignored = write(2, watchdog_msg, watchdog_len);
    (void)ignored;
    signal(sig, SIG_DFL);
    raise(sig);
}

void wf_watchdog(unsigned seconds)
{
    int n = snprintf(watchdog_msg, sizeof watchdog_msg, "watchdog: the test ran past its limit of %u s\n", seconds);
    watchdog_len = n > 0 && (size_t)n < sizeof watchdog_msg ? (size_t)n : 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = watchdog_fire;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    alarm(seconds);
}

void wf_sleep(double seconds)
{
    struct timespec ts = {.tv_sec = (time_t)seconds,
                          .tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

int wf_failf(wf_result *res, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->msg, sizeof res->msg, fmt, ap);
    va_end(ap);
    return 1;
}

wf_result *wf_run(int n, wf_rank_fn fn, void *arg, double wait_s)
{
    size_t bytes = sizeof(wf_result) * (size_t)n;
    wf_result *all = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (all == MAP_FAILED)
        return NULL;
    memset(all, 0, bytes);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            double t0 = wf_now();
            int code = fn(i, arg, &all[i], all);
            all[i].elapsed_s = all[i].elapsed_s ? all[i].elapsed_s : wf_now() - t0;
            all[i].code = code;
            all[i].done = 1;
            _exit(0);
        }
    }
    double deadline = wf_now() + wait_s;
    int left = n;
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            if (pids[i] <= 0)
                continue;
            int st;
            if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
                pids[i] = 0;
                left--;
            }
        }
        if (left == 0)
            break;
        if (wf_now() > deadline) {
            for (int i = 0; i < n; i++)
                if (pids[i] > 0) {
                    kill(pids[i], SIGKILL);
                    waitpid(pids[i], NULL, 0);
                    snprintf(all[i].msg, sizeof all[i].msg, "rank %d still running after %g s: killed", i,
                             wait_s);
                }
            break;
        }
        wf_sleep(0.005);
    }
    free(pids);
    return all;
}

void wf_free(wf_result *r, int n)
{
    if (r)
        munmap(r, sizeof(wf_result) * (size_t)n);
}

/* The temporary directories of this process, for wf_cleanup_tempdirs. */
static char made_dirs[16][64];

void wf_tempdir(char *buf, size_t n)
{
    snprintf(buf, n, "/tmp/symm-test-XXXXXX");
    if (!mkdtemp(buf)) {
        buf[0] = '\0';
        return;
    }
    for (size_t i = 0; i < sizeof made_dirs / sizeof made_dirs[0]; i++)
        if (!made_dirs[i][0]) {
            snprintf(made_dirs[i], sizeof made_dirs[i], "%s", buf);
            break;
        }
}

void wf_cleanup_tempdirs(void)
{
    for (size_t i = 0; i < sizeof made_dirs / sizeof made_dirs[0]; i++)
        if (made_dirs[i][0]) {
            wf_rmtree(made_dirs[i]);
            made_dirs[i][0] = '\0';
        }
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void wf_rmtree(const char *path)
{
    if (path && *path)
        nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void wf_random(void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = getrandom((char *)buf + got, n - got, 0);
        if (k > 0)
            got += (size_t)k;
    }
}

void wf_job_id(char *buf, size_t n)
{
    uint32_t r;
    wf_random(&r, sizeof r);
    snprintf(buf, n, "t-%ld-%08x", (long)getpid(), r);
}

void wf_secret(char buf[65])
{
    unsigned char b[32];
    wf_random(b, sizeof b);
    for (int i = 0; i < 32; i++)
        snprintf(buf + 2 * i, 3, "%02x", b[i]);
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void wf_fill(void *buf, size_t n, uint64_t seed, uint64_t a, uint64_t b)
{
    uint64_t s = seed ^ (a * 0x100000001b3ull) ^ (b << 32);
    unsigned char *p = buf;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = splitmix(&s);
        size_t k = n - i < 8 ? n - i : 8;
        memcpy(p + i, &v, k);
    }
}

int wf_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

int wf_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr = {.s_addr = htonl(INADDR_LOOPBACK)}};
    socklen_t len = sizeof a;
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}
