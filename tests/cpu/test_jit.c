/* test_jit.c: the JIT without a GPU: SHA-256, NVRTC compiles, the on-disk
 * cache (hits, misses, corrupt and truncated entries, concurrent writers,
 * unusable directories), compile errors, requests and environment knobs.
 * Every test uses a fresh cache directory and a freshly random kernel. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nvrtc.h>

#include "jit_cache.h"
#include "nvrtc_api.h"
#include "sha256.h"
#include "symm_jit.h"
#include "moe_inputs.h"
#include "world_fork.h"
#include "test_file.h"

#define HEADER SYMM_JIT_CACHE_HEADER_SIZE

static char cache_dir[256];
static moe_rng rng; /* fresh each test */

static uint64_t rnd(void) { return moe_rng_next(&rng); }

static void setup(void)
{
    wf_watchdog(60);
    wf_random(&rng.s, sizeof rng.s);
    unsetenv("SYMM_CACHE_DIR");
    unsetenv("SYMM_JIT_CACHE");
    unsetenv("SYMM_JIT_DUMP");
    unsetenv("SYMM_JIT_LINEINFO");
    strcpy(cache_dir, "/tmp/symm-test-jit-XXXXXX");
    cr_assert(mkdtemp(cache_dir), "mkdtemp: %s", strerror(errno));
}

static void teardown(void)
{
    chmod(cache_dir, 0700);
    wf_rmtree(cache_dir);
}

TestSuite(jit, .init = setup, .fini = teardown);

/* A small kernel with a random constant, so that every test compiles source
 * no earlier run has cached. */
static char *kernel_source(uint32_t constant)
{
    char *src;
    cr_assert(asprintf(&src,
                       "// test kernel\n"
                       "extern \"C\" __global__ void fill(unsigned *out, int n)\n"
                       "{\n"
                       "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                       "    if (i < n)\n"
                       "        out[i] = (unsigned)i * 2654435761u ^ 0x%08xu;\n"
                       "}\n",
                       constant) > 0);
    return src;
}

static symm_jit_request request(const char *src, const char *dir)
{
    symm_jit_request req = {.source = src, .source_name = "fill.cu", .arch = "sm_90a",
                            .cache_dir = dir};
    return req;
}

static void compile_ok(const symm_jit_request *req, symm_jit_result *res)
{
    symm_status st = symm_jit_compile(req, res);
    cr_assert(st == SYMM_OK, "symm_jit_compile(%s, %s): %s: %s", req->source_name, req->arch,
              symm_status_name(st), symm_last_error());
    cr_assert(res->cubin && res->cubin_size > 64, "no cubin (%zu bytes)", res->cubin_size);
    cr_assert(!memcmp(res->cubin, "\x7f" "ELF", 4), "the cubin is not an ELF image");
    cr_assert(res->warning && res->log && res->cache_path, "a result string is NULL");
}

static void write_file(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "open %s: %s", path, strerror(errno));
    cr_assert(fwrite(data, 1, size, f) == size, "write %s", path);
    fclose(f);
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static bool same_bytes(const symm_jit_result *a, const symm_jit_result *b)
{
    return a->cubin_size == b->cubin_size && !memcmp(a->cubin, b->cubin, a->cubin_size);
}

/* --- SHA-256 (the runtime's; symmgen uses the same) ---------------------- */

Test(sha256, matches_the_fips_180_test_vectors)
{
    static const struct {
        const char *msg, *digest;
    } vectors[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklm"
         "nopqrlmnopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    char hex[SYMM_SHA256_HEX_SIZE];
    for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++) {
        symm_sha256_hex_of(vectors[i].msg, strlen(vectors[i].msg), hex);
        cr_assert_str_eq(hex, vectors[i].digest, "SHA-256(\"%s\")", vectors[i].msg);
    }
    char *million = malloc(1000000);
    memset(million, 'a', 1000000);
    symm_sha256_hex_of(million, 1000000, hex);
    free(million);
    cr_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
                     "SHA-256 of a million 'a'");
}

/* RFC 4231's test cases 1 to 7 (case 5's MAC is truncated to 128 bits
 * there; here it is whole), through the one-shot call and in pieces. */
Test(hmac_sha256, matches_the_rfc_4231_test_vectors)
{
    static const char test7[] = "This is a test using a larger than block-size key and a larger than block-size "
                                "data. The key needs to be hashed before being used by the HMAC algorithm.";
    uint8_t k1[20], k3[20], k4[25], k5[20], k6[131], d3[50], d4[50];
    memset(k1, 0x0b, sizeof k1);
    memset(k3, 0xaa, sizeof k3);
    for (int i = 0; i < 25; i++)
        k4[i] = (uint8_t)(i + 1);
    memset(k5, 0x0c, sizeof k5);
    memset(k6, 0xaa, sizeof k6);
    memset(d3, 0xdd, sizeof d3);
    memset(d4, 0xcd, sizeof d4);
    const struct {
        const void *key;
        size_t key_len;
        const void *data;
        size_t len;
        const char *mac;
    } vectors[] = {
        {k1, 20, "Hi There", 8, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {"Jefe", 4, "what do ya want for nothing?", 28,
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {k3, 20, d3, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
        {k4, 25, d4, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
        {k5, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552bfa6f7c0a6a8aef8b93f860aab0cd20c5"},
        {k6, 131, "Test Using Larger Than Block-Size Key - Hash Key First", 54,
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        {k6, 131, test7, sizeof test7 - 1, "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
    };
    for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++) {
        uint8_t mac[SYMM_SHA256_SIZE];
        char hex[SYMM_SHA256_HEX_SIZE];
        symm_hmac_sha256(vectors[i].key, vectors[i].key_len, vectors[i].data, vectors[i].len, mac);
        symm_sha256_hex(mac, hex);
        cr_assert_str_eq(hex, vectors[i].mac, "RFC 4231 test case %zu", i + 1);
        symm_hmac_sha256_ctx m;
        symm_hmac_sha256_init(&m, vectors[i].key, vectors[i].key_len);
        for (size_t at = 0; at < vectors[i].len; at += 7)
            symm_hmac_sha256_update(&m, (const char *)vectors[i].data + at,
                                    vectors[i].len - at < 7 ? vectors[i].len - at : 7);
        symm_hmac_sha256_final(&m, mac);
        symm_sha256_hex(mac, hex);
        cr_assert_str_eq(hex, vectors[i].mac, "RFC 4231 test case %zu, in pieces of 7 bytes", i + 1);
    }
}

Test(sha256, random_input_in_random_pieces_matches_sha256sum, .init = setup, .fini = teardown)
{
    /* Lengths around the 55/56/64-byte padding edges, and a few longer. */
    size_t lengths[] = {1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 1000 + rnd() % 9000};
    for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
        size_t n = lengths[l];
        uint8_t *data = malloc(n);
        for (size_t i = 0; i < n; i++)
            data[i] = (uint8_t)rnd();
        symm_sha256_ctx h;
        symm_sha256_init(&h);
        for (size_t at = 0; at < n;) {
            size_t piece = 1 + rnd() % 70;
            piece = piece > n - at ? n - at : piece;
            symm_sha256_update(&h, data + at, piece);
            at += piece;
        }
        uint8_t digest[SYMM_SHA256_SIZE];
        char ours[SYMM_SHA256_HEX_SIZE], theirs[65] = "";
        symm_sha256_final(&h, digest);
        symm_sha256_hex(digest, ours);
        char path[300], cmd[400];
        snprintf(path, sizeof path, "%s/data", cache_dir);
        write_file(path, data, n);
        snprintf(cmd, sizeof cmd, "sha256sum %s", path);
        FILE *p = popen(cmd, "r");
        cr_assert(p && fscanf(p, "%64s", theirs) == 1, "running %s", cmd);
        pclose(p);
        cr_assert_str_eq(ours, theirs, "SHA-256 of %zu random bytes", n);
        free(data);
    }
}

/* --- compile and cache ---------------------------------------------------- */

Test(jit, cold_compile_misses_then_the_cache_returns_identical_bytes)
{
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, cache_dir);
    symm_jit_result cold, warm;
    compile_ok(&req, &cold);
    cr_assert(!cold.cache_hit, "a fresh cache directory gave a hit");
    cr_assert(cold.compile_ms > 0, "compile_ms %f", cold.compile_ms);
    cr_assert_str_eq(cold.warning, "", "warning on a clean compile");
    cr_assert(!strncmp(cold.cache_path, cache_dir, strlen(cache_dir)) &&
                  strstr(cold.cache_path, ".cubin"),
              "cache_path %s: expected <%s>/<key>.cubin", cold.cache_path, cache_dir);
    size_t size;
    uint8_t *entry = test_slurp(cold.cache_path, &size);
    cr_assert(size == HEADER + cold.cubin_size, "entry of %zu bytes for a %zu-byte cubin", size,
              cold.cubin_size);
    cr_assert(!memcmp(entry + HEADER, cold.cubin, cold.cubin_size), "entry payload differs");
    free(entry);

    compile_ok(&req, &warm);
    cr_assert(warm.cache_hit, "second compile of the same request missed the cache");
    cr_assert(same_bytes(&cold, &warm), "the cached cubin differs from the compiled one");
    cr_assert(warm.compile_ms == 0, "compile_ms %f on a hit", warm.compile_ms);
    cr_assert_str_eq(warm.cache_path, cold.cache_path);
    cr_assert_str_eq(warm.warning, "");
    cr_assert_eq(count_files(cache_dir), 1, "expected exactly one entry, no temporaries");
    symm_jit_result_free(&cold);
    symm_jit_result_free(&warm);
    cr_assert(!cold.cubin && !cold.log && !cold.cache_path, "result_free did not zero");
    free(src);
}

Test(jit, any_change_of_source_option_arch_or_name_misses)
{
    uint32_t constant = (uint32_t)rnd();
    char *src = kernel_source(constant);
    char *other = kernel_source(constant ^ (1u << (rnd() % 32)));
    const char *define[] = {"-DSYMM_TEST_OPTION=1"};
    symm_jit_request base = request(src, cache_dir);
    symm_jit_request changed[4] = {base, base, base, base};
    changed[0].source = other;
    changed[1].options = define;
    changed[1].option_count = 1;
    changed[2].arch = "sm_80";
    changed[3].source_name = "fill_renamed.cu";
    symm_jit_result first, res;
    compile_ok(&base, &first);
    for (int i = 0; i < 4; i++) {
        compile_ok(&changed[i], &res);
        cr_assert(!res.cache_hit, "change %d hit the cache", i);
        cr_assert_str_neq(res.cache_path, first.cache_path, "change %d kept the key", i);
        if (i == 2)
            cr_assert(!same_bytes(&first, &res), "sm_80 and sm_90a gave the same cubin");
        symm_jit_result_free(&res);
    }
    cr_assert_eq(count_files(cache_dir), 5, "one entry per distinct request");
    compile_ok(&base, &res);
    cr_assert(res.cache_hit && same_bytes(&first, &res), "the base request no longer hits");
    symm_jit_result_free(&res);
    symm_jit_result_free(&first);
    free(src);
    free(other);
}

/* Damage the entry of a compiled request with `damage`, then check the next
 * compile ignores it, says so, returns the right bytes, and repairs it. */
static void check_damage_is_repaired(void (*damage)(const char *path, size_t size),
                                     const char *expected_reason)
{
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, cache_dir);
    symm_jit_result first, again, third;
    compile_ok(&req, &first);
    damage(first.cache_path, HEADER + first.cubin_size);
    compile_ok(&req, &again);
    cr_assert(!again.cache_hit, "a damaged entry was loaded");
    cr_assert(strstr(again.warning, "invalid") && strstr(again.warning, expected_reason),
              "warning \"%s\": expected it to say the entry was invalid (%s)", again.warning,
              expected_reason);
    cr_assert(same_bytes(&first, &again), "recompiled cubin differs");
    compile_ok(&req, &third);
    cr_assert(third.cache_hit && same_bytes(&first, &third), "the entry was not replaced");
    cr_assert_str_eq(third.warning, "");
    symm_jit_result_free(&first);
    symm_jit_result_free(&again);
    symm_jit_result_free(&third);
    free(src);
}

static void flip_payload_byte(const char *path, size_t size)
{
    size_t n;
    uint8_t *entry = test_slurp(path, &n);
    cr_assert_eq(n, size);
    entry[HEADER + rnd() % (size - HEADER)] ^= (uint8_t)(1u << (rnd() % 8));
    write_file(path, entry, n);
    free(entry);
}

static void flip_header_byte(const char *path, size_t size)
{
    size_t n;
    uint8_t *entry = test_slurp(path, &n);
    cr_assert_eq(n, size);
    entry[rnd() % HEADER] ^= (uint8_t)(1u << (rnd() % 8));
    write_file(path, entry, n);
    free(entry);
}

static void truncate_entry(const char *path, size_t size)
{
    cr_assert(truncate(path, (off_t)(rnd() % size)) == 0, "truncate: %s", strerror(errno));
}

Test(jit, flipped_payload_byte_is_detected_recompiled_and_replaced)
{
    check_damage_is_repaired(flip_payload_byte, "payload hash mismatch");
}

Test(jit, flipped_header_byte_is_detected_recompiled_and_replaced)
{
    check_damage_is_repaired(flip_header_byte, "");
}

Test(jit, truncated_entry_is_detected_recompiled_and_replaced)
{
    check_damage_is_repaired(truncate_entry, "truncated");
}

Test(jit, entry_holding_another_key_is_not_loaded)
{
    uint32_t c = (uint32_t)rnd();
    char *src_a = kernel_source(c), *src_b = kernel_source(~c);
    symm_jit_request req_a = request(src_a, cache_dir), req_b = request(src_b, cache_dir);
    symm_jit_result a, b, b2;
    compile_ok(&req_a, &a);
    compile_ok(&req_b, &b);
    cr_assert(!same_bytes(&a, &b), "different constants gave the same cubin");
    cr_assert(rename(a.cache_path, b.cache_path) == 0, "rename: %s", strerror(errno));
    compile_ok(&req_b, &b2);
    cr_assert(!b2.cache_hit && strstr(b2.warning, "another key"), "warning \"%s\"", b2.warning);
    cr_assert(same_bytes(&b, &b2), "got another request's cubin");
    symm_jit_result_free(&a);
    symm_jit_result_free(&b);
    symm_jit_result_free(&b2);
    free(src_a);
    free(src_b);
}

/* Four processes compile the same request into the same fresh directory,
 * released at once; each reports its status and its cubin's digest. */
Test(jit, concurrent_processes_writing_one_entry_all_succeed)
{
    enum { WRITERS = 4 };
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, cache_dir);
    int go[2], report[2];
    cr_assert(pipe(go) == 0 && pipe(report) == 0);
    pid_t pids[WRITERS];
    for (int w = 0; w < WRITERS; w++) {
        pids[w] = fork();
        cr_assert(pids[w] >= 0, "fork: %s", strerror(errno));
        if (pids[w] == 0) {
            char c;
            close(go[1]);
            while (read(go[0], &c, 1) > 0)
                ;
            symm_jit_result res;
            uint8_t msg[1 + SYMM_SHA256_SIZE] = {0};
            msg[0] = (uint8_t)symm_jit_compile(&req, &res);
            if (msg[0] == SYMM_OK)
                symm_sha256(res.cubin, res.cubin_size, msg + 1);
            if (write(report[1], msg, sizeof msg) != (ssize_t)sizeof msg)
                _exit(2);
            _exit(0);
        }
    }
    close(go[0]);
    close(go[1]); /* releases every writer at once */
    close(report[1]);
    uint8_t digests[WRITERS][1 + SYMM_SHA256_SIZE];
    for (int w = 0; w < WRITERS; w++) {
        cr_assert(read(report[0], digests[w], sizeof digests[w]) == sizeof digests[w],
                  "writer %d reported nothing", w);
        cr_assert_eq(digests[w][0], SYMM_OK, "writer %d failed: %s", w,
                     symm_status_name((symm_status)digests[w][0]));
        cr_assert(!memcmp(digests[w], digests[0], sizeof digests[w]), "writers disagree");
    }
    for (int w = 0; w < WRITERS; w++) {
        int status;
        cr_assert(waitpid(pids[w], &status, 0) == pids[w] && WIFEXITED(status) &&
                  WEXITSTATUS(status) == 0, "writer %d exited abnormally", w);
    }
    cr_assert_eq(count_files(cache_dir), 1, "expected one entry and no temporaries");
    symm_jit_result res;
    compile_ok(&req, &res);
    uint8_t digest[SYMM_SHA256_SIZE];
    symm_sha256(res.cubin, res.cubin_size, digest);
    cr_assert(res.cache_hit && !memcmp(digest, digests[0] + 1, sizeof digest),
              "the entry left by concurrent writers is not a valid hit");
    symm_jit_result_free(&res);
    free(src);
}

typedef struct thread_job {
    symm_jit_request req;
    symm_jit_result res;
    symm_status status;
} thread_job;

static void *compile_thread(void *arg)
{
    thread_job *job = arg;
    job->status = symm_jit_compile(&job->req, &job->res);
    return NULL;
}

Test(jit, threads_compiling_at_once_all_succeed)
{
    enum { THREADS = 4 };
    uint32_t c = (uint32_t)rnd();
    char *src[2] = {kernel_source(c), kernel_source(c + 1)};
    thread_job jobs[THREADS];
    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; t++) {
        jobs[t].req = request(src[t % 2], cache_dir);
        cr_assert(pthread_create(&threads[t], NULL, compile_thread, &jobs[t]) == 0);
    }
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    for (int t = 0; t < THREADS; t++) {
        cr_assert_eq(jobs[t].status, SYMM_OK, "thread %d: %s", t,
                     symm_status_name(jobs[t].status));
        cr_assert(same_bytes(&jobs[t].res, &jobs[t % 2].res), "thread %d: other bytes", t);
    }
    cr_assert(!same_bytes(&jobs[0].res, &jobs[1].res), "two sources gave one cubin");
    cr_assert_eq(count_files(cache_dir), 2, "expected two entries and no temporaries");
    for (int t = 0; t < THREADS; t++)
        symm_jit_result_free(&jobs[t].res);
    free(src[0]);
    free(src[1]);
}

/* --- unusable cache directories -------------------------------------------- */

/* A path under a regular file cannot be created, even by root. */
Test(jit, uncreatable_cache_dir_compiles_without_caching_and_warns)
{
    char file[300], dir[340];
    snprintf(file, sizeof file, "%s/file", cache_dir);
    snprintf(dir, sizeof dir, "%s/cache", file);
    write_file(file, "x", 1);
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, dir);
    for (int round = 0; round < 2; round++) {
        symm_jit_result res;
        compile_ok(&req, &res);
        cr_assert(!res.cache_hit, "round %d: a hit from a directory that cannot exist", round);
        cr_assert_str_eq(res.cache_path, "", "round %d", round);
        cr_assert(strstr(res.warning, dir) && strstr(res.warning, "cannot be created") &&
                      strstr(res.warning, "compiled without caching"),
                  "round %d: warning \"%s\"", round, res.warning);
        symm_jit_result_free(&res);
    }
    free(src);
}

Test(jit, read_only_cache_dir_serves_hits_and_warns_on_store)
{
    if (geteuid() == 0) {
        teardown(); /* a skipped test does not run .fini */
        cr_skip_test("running as root, where mode 0500 does not stop writes");
    }
    char *src = kernel_source((uint32_t)rnd()), *other = kernel_source((uint32_t)rnd() | 1);
    symm_jit_request req = request(src, cache_dir), req2 = request(other, cache_dir);
    symm_jit_result first, hit, miss;
    compile_ok(&req, &first);
    cr_assert(chmod(cache_dir, 0500) == 0);
    compile_ok(&req, &hit);
    cr_assert(hit.cache_hit && same_bytes(&first, &hit), "read-only entry not served");
    compile_ok(&req2, &miss);
    cr_assert(!miss.cache_hit && strstr(miss.warning, "not writable") &&
                  strstr(miss.warning, "compiled without caching"),
              "warning \"%s\"", miss.warning);
    cr_assert_str_eq(miss.cache_path, "");
    symm_jit_result_free(&first);
    symm_jit_result_free(&hit);
    symm_jit_result_free(&miss);
    free(src);
    free(other);
}

Test(jit, cache_dir_writable_by_others_is_not_used)
{
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, cache_dir);
    cr_assert(chmod(cache_dir, 0777) == 0);
    symm_jit_result res;
    compile_ok(&req, &res);
    cr_assert(!res.cache_hit && strstr(res.warning, "writable by other users"),
              "warning \"%s\"", res.warning);
    cr_assert_eq(count_files(cache_dir), 0, "an entry was written into a shared directory");
    symm_jit_result_free(&res);
    /* Its group is as much a writer as anyone. */
    cr_assert(chmod(cache_dir, 0770) == 0);
    compile_ok(&req, &res);
    cr_assert(!res.cache_hit && strstr(res.warning, "writable by its group (mode 770)"), "warning \"%s\"",
              res.warning);
    cr_assert_eq(count_files(cache_dir), 0, "an entry was written into a group-writable directory");
    symm_jit_result_free(&res);
    free(src);
}

Test(jit, nested_cache_dir_is_created_with_mode_0700)
{
    char dir[400], level[400];
    unsigned tag = (unsigned)rnd();
    snprintf(dir, sizeof dir, "%s/a%u/b/c", cache_dir, tag);
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, dir);
    symm_jit_result res;
    compile_ok(&req, &res);
    cr_assert(!strncmp(res.cache_path, dir, strlen(dir)), "entry %s not in %s", res.cache_path,
              dir);
    const char *levels[] = {"a%u", "a%u/b", "a%u/b/c"};
    for (int i = 0; i < 3; i++) {
        char rel[64];
        struct stat st;
        snprintf(rel, sizeof rel, levels[i], tag);
        snprintf(level, sizeof level, "%s/%s", cache_dir, rel);
        cr_assert(stat(level, &st) == 0 && S_ISDIR(st.st_mode), "%s missing", level);
        cr_assert_eq(st.st_mode & 0777, 0700, "%s has mode %o", level, st.st_mode & 0777);
    }
    symm_jit_result_free(&res);
    free(src);
}

Test(jit, no_cache_flag_neither_reads_nor_writes)
{
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, cache_dir);
    req.flags = SYMM_JIT_NO_CACHE;
    symm_jit_result res;
    compile_ok(&req, &res);
    cr_assert(!res.cache_hit && !res.cache_path[0] && count_files(cache_dir) == 0,
              "SYMM_JIT_NO_CACHE wrote %s", res.cache_path);
    symm_jit_result_free(&res);
    req.flags = 0;
    compile_ok(&req, &res);
    symm_jit_result_free(&res);
    req.flags = SYMM_JIT_NO_CACHE;
    compile_ok(&req, &res);
    cr_assert(!res.cache_hit, "SYMM_JIT_NO_CACHE read the cache");
    symm_jit_result_free(&res);
    free(src);
}

/* --- what another user could write ------------------------------------------ */

/* An entry that is not a regular file of ours that only we may write is
 * never loaded, even when its bytes are a valid entry for the key: it is
 * said to be invalid, compiled again and replaced by a file of ours (0600). */
static void check_untrusted_entry_is_replaced(void (*plant)(const char *entry, const char *copy),
                                              const char *expected_reason)
{
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, cache_dir);
    symm_jit_result first, again, third;
    compile_ok(&req, &first);
    char copy[400];
    snprintf(copy, sizeof copy, "%s.elsewhere", cache_dir);
    size_t n;
    void *bytes = test_slurp(first.cache_path, &n);
    write_file(copy, bytes, n); /* a valid entry for the key, outside the cache */
    free(bytes);
    plant(first.cache_path, copy);
    compile_ok(&req, &again);
    cr_assert(!again.cache_hit, "an entry another user could write was loaded (%s)", expected_reason);
    cr_assert(strstr(again.warning, "invalid") && strstr(again.warning, expected_reason),
              "warning \"%s\": expected it to say the entry was invalid (%s)", again.warning, expected_reason);
    cr_assert(same_bytes(&first, &again), "recompiled cubin differs");
    struct stat st;
    cr_assert(lstat(first.cache_path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
                  (st.st_mode & 0777) == 0600,
              "the entry was not replaced by a 0600 file of ours (mode %o, uid %u)", st.st_mode,
              (unsigned)st.st_uid);
    compile_ok(&req, &third);
    cr_assert(third.cache_hit && same_bytes(&first, &third) && !third.warning[0], "the replacement is not used");
    symm_jit_result_free(&first);
    symm_jit_result_free(&again);
    symm_jit_result_free(&third);
    unlink(copy);
    free(src);
}

static void plant_symlink(const char *entry, const char *copy)
{
    cr_assert(unlink(entry) == 0 && symlink(copy, entry) == 0, "symlink: %s", strerror(errno));
}

static void plant_group_writable(const char *entry, const char *copy)
{
    (void)copy;
    cr_assert(chmod(entry, 0620) == 0);
}

static void plant_world_writable(const char *entry, const char *copy)
{
    (void)copy;
    cr_assert(chmod(entry, 0602) == 0);
}

static void plant_foreign_owner(const char *entry, const char *copy)
{
    (void)copy;
    cr_assert(chown(entry, 65534, 65534) == 0, "chown: %s", strerror(errno));
}

Test(jit, symlinked_entry_is_not_loaded)
{
    check_untrusted_entry_is_replaced(plant_symlink, "a symbolic link");
}

Test(jit, group_or_world_writable_entry_is_not_loaded)
{
    check_untrusted_entry_is_replaced(plant_group_writable, "writable by its group (mode 620)");
    check_untrusted_entry_is_replaced(plant_world_writable, "writable by other users (mode 602)");
}

Test(jit, entry_of_another_user_is_not_loaded)
{
    if (geteuid() != 0) {
        teardown();
        cr_skip_test("needs root to give an entry to another uid");
    }
    check_untrusted_entry_is_replaced(plant_foreign_owner, "owned by uid 65534, not by this user");
}

Test(jit, cache_dir_owned_by_another_user_is_not_used)
{
    if (geteuid() != 0) {
        teardown();
        cr_skip_test("needs root to give a directory to another uid");
    }
    setenv("SYMM_JIT_DUMP", "1", 1);
    cr_assert(chown(cache_dir, 65534, 65534) == 0);
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, cache_dir);
    symm_jit_result res;
    compile_ok(&req, &res);
    cr_assert(!res.cache_hit && strstr(res.warning, "owned by uid 65534"), "warning \"%s\"", res.warning);
    cr_assert_eq(count_files(cache_dir), 0, "something was written into another user's directory");
    symm_jit_result_free(&res);
    free(src);
}

/* A symbolic link at the cache directory's path is not followed: whoever
 * can replace the link chooses the directory. */
Test(jit, symlinked_cache_dir_is_not_used)
{
    char link[320];
    snprintf(link, sizeof link, "%s/link", cache_dir);
    cr_assert(symlink(cache_dir, link) == 0);
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, link);
    symm_jit_result res;
    compile_ok(&req, &res);
    cr_assert(!res.cache_hit && strstr(res.warning, "is a symbolic link") &&
                  strstr(res.warning, "compiled without caching"), "warning \"%s\"", res.warning);
    cr_assert_str_eq(res.cache_path, "");
    cr_assert_eq(count_files(cache_dir), 1, "only the link: nothing written through it");
    symm_jit_result_free(&res);
    free(src);
}

/* SYMM_JIT_DUMP writes into the cache's directory only when the cache could
 * use it: never into one it refused. */
Test(jit, dump_writes_nothing_into_a_refused_directory)
{
    setenv("SYMM_JIT_DUMP", "1", 1);
    cr_assert(chmod(cache_dir, 0777) == 0);
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, cache_dir);
    symm_jit_result res;
    compile_ok(&req, &res);
    cr_assert(strstr(res.warning, "writable by other users") && strstr(res.warning, "SYMM_JIT_DUMP: nothing written"),
              "warning \"%s\"", res.warning);
    cr_assert_eq(count_files(cache_dir), 0, "SYMM_JIT_DUMP wrote into a directory others can write");
    symm_jit_result_free(&res);
    /* With the cache off, the dumps' directory is checked all the same. */
    req.flags = SYMM_JIT_NO_CACHE;
    compile_ok(&req, &res);
    cr_assert(strstr(res.warning, "writable by other users") && strstr(res.warning, "SYMM_JIT_DUMP: nothing written"),
              "warning \"%s\"", res.warning);
    cr_assert_eq(count_files(cache_dir), 0, "SYMM_JIT_DUMP wrote into a directory others can write");
    symm_jit_result_free(&res);
    free(src);
}

/* A missing cache directory is made here, 0700 whatever the umask, and
 * used; its world-writable parent (like /tmp) does not matter. */
Test(jit, missing_cache_dir_is_created_0700_and_used)
{
    char parent[320], dir[340];
    snprintf(parent, sizeof parent, "%s/shared", cache_dir);
    cr_assert(mkdir(parent, 0777) == 0 && chmod(parent, 01777) == 0);
    snprintf(dir, sizeof dir, "%s/mine", parent);
    mode_t old = umask(0);
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, dir);
    symm_jit_result res, hit;
    compile_ok(&req, &res);
    umask(old);
    struct stat st;
    cr_assert(lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700,
              "mode %o", st.st_mode & 0777);
    cr_assert(!strncmp(res.cache_path, dir, strlen(dir)) && !res.warning[0], "entry %s, warning \"%s\"",
              res.cache_path, res.warning);
    compile_ok(&req, &hit);
    cr_assert(hit.cache_hit);
    symm_jit_result_free(&res);
    symm_jit_result_free(&hit);
    free(src);
}

/* Once checked, the directory is used through its descriptor: a directory
 * renamed into its place afterwards (the race of a directory that did not
 * exist yet, in a parent others can write) is never read from or written to. */
Test(jit, directory_swapped_in_after_the_check_is_not_used)
{
    char dir[320], planted[320], aside[320], name[96], why[512];
    snprintf(dir, sizeof dir, "%s/cache", cache_dir);
    snprintf(planted, sizeof planted, "%s/planted", cache_dir);
    snprintf(aside, sizeof aside, "%s/aside", cache_dir);
    int fd = -1, created = 0;
    cr_assert_eq(symm_jit_cache_open_dir(dir, &fd, &created, why, sizeof why), 0, "%s", why);
    cr_assert(created, "the missing directory was not created here");
    /* Someone else's directory, with a valid entry for the key. */
    uint8_t key[SYMM_SHA256_SIZE], payload[256];
    for (size_t i = 0; i < sizeof key; i++)
        key[i] = (uint8_t)rnd();
    for (size_t i = 0; i < sizeof payload; i++)
        payload[i] = (uint8_t)rnd();
    snprintf(name, sizeof name, "k%u.cubin", (unsigned)rnd());
    cr_assert(mkdir(planted, 0700) == 0);
    int pfd = open(planted, O_RDONLY | O_DIRECTORY);
    cr_assert(pfd >= 0 && symm_jit_cache_write(pfd, name, key, payload, sizeof payload, why, sizeof why) == 0, "%s",
              why);
    close(pfd);
    cr_assert(rename(dir, aside) == 0 && rename(planted, dir) == 0, "swap: %s", strerror(errno));
    symm_jit_cache_lookup lookup;
    void *got = NULL;
    size_t size = 0;
    cr_assert_eq(symm_jit_cache_read(fd, name, key, &lookup, &got, &size, why, sizeof why), 0, "%s", why);
    cr_assert_eq(lookup, SYMM_JIT_CACHE_MISS, "the swapped-in directory's entry was read");
    free(got);
    cr_assert_eq(symm_jit_cache_write(fd, name, key, payload, 16, why, sizeof why), 0, "%s", why);
    char mine[512];
    snprintf(mine, sizeof mine, "%s/%s", aside, name);
    cr_assert(access(mine, F_OK) == 0, "the entry did not go into the directory that was checked");
    close(fd);
}

/* --- errors ------------------------------------------------------------------ */

Test(jit, compile_error_names_the_file_and_nvrtc_line)
{
    char name[64], *src;
    snprintf(name, sizeof name, "bad_%u.cu", (unsigned)(rnd() % 100000));
    cr_assert(asprintf(&src, "extern \"C\" __global__ void k(int *p)\n{\n"
                             "    p[0] = undefined_%u;\n}\n", (unsigned)rnd()) > 0);
    symm_jit_request req = request(src, cache_dir);
    req.source_name = name;
    symm_jit_result res;
    symm_status st = symm_jit_compile(&req, &res);
    cr_assert_eq(st, SYMM_ERR_NVRTC, "got %s", symm_status_name(st));
    char head[128], where[80];
    snprintf(head, sizeof head, "symm_jit_compile: NVRTC failed to compile %s for sm_90a:\n",
             name);
    snprintf(where, sizeof where, "%s(3): error", name);
    const char *msg = symm_last_error();
    cr_assert(!strncmp(msg, head, strlen(head)), "message \"%s\": expected it to start \"%s\"",
              msg, head);
    cr_assert(strstr(msg, where) && strstr(msg, "undefined_"),
              "message \"%s\": expected NVRTC's error at %s", msg, where);
    cr_assert(res.log && strstr(res.log, where), "res.log \"%s\"", res.log ? res.log : "(null)");
    cr_assert(!res.cubin && count_files(cache_dir) == 0, "a failed compile left a cubin");
    symm_jit_result_free(&res);
    free(src);
}

Test(jit, unknown_nvrtc_option_is_reported_with_nvrtc_s_words)
{
    char *src = kernel_source((uint32_t)rnd());
    const char *opts[] = {"--no-such-option-for-symm"};
    symm_jit_request req = request(src, cache_dir);
    req.options = opts;
    req.option_count = 1;
    symm_jit_result res;
    cr_assert_eq(symm_jit_compile(&req, &res), SYMM_ERR_NVRTC);
    const char *msg = symm_last_error();
    cr_assert(strstr(msg, "fill.cu") && strstr(msg, "NVRTC_ERROR_INVALID_OPTION") &&
                  strstr(msg, "--no-such-option-for-symm"),
              "message \"%s\"", msg);
    symm_jit_result_free(&res);
    free(src);
}

static void expect_invalid(const symm_jit_request *req, const char *words)
{
    symm_jit_result res;
    symm_status st = symm_jit_compile(req, &res);
    cr_assert_eq(st, SYMM_ERR_INVALID_ARG, "expected SYMM_ERR_INVALID_ARG (%s), got %s", words,
                 symm_status_name(st));
    cr_assert(strstr(symm_last_error(), words), "message \"%s\": expected \"%s\"",
              symm_last_error(), words);
    cr_assert(!res.cubin && !res.warning, "a rejected request filled the result");
    symm_jit_result_free(&res);
}

Test(jit, bad_requests_are_rejected_naming_the_field)
{
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, cache_dir);
    const char *arch_opt[] = {"--gpu-architecture=sm_80"};
    const char *null_opt[] = {"-DX=1", NULL};
    symm_jit_request r;
    r = req, r.source = NULL;
    expect_invalid(&r, "req->source is NULL");
    r = req, r.source_name = NULL;
    expect_invalid(&r, "req->source_name is NULL");
    r = req, r.arch = NULL;
    expect_invalid(&r, "req->arch is NULL");
    const char *bad_arch[] = {"compute_90a", "sm90", "sm_9", "sm_90x", "sm_90aa", ""};
    for (size_t i = 0; i < sizeof bad_arch / sizeof bad_arch[0]; i++) {
        char words[64];
        snprintf(words, sizeof words, "arch \"%s\": expected sm_", bad_arch[i]);
        r = req, r.arch = bad_arch[i];
        expect_invalid(&r, words);
    }
    r = req, r.options = arch_opt, r.option_count = 1;
    expect_invalid(&r, "set by req->arch");
    r = req, r.options = null_opt, r.option_count = 2;
    expect_invalid(&r, "option 1 is NULL");
    r = req, r.flags = 0x40;
    expect_invalid(&r, "flags 0x40");
    r = req, r.cache_dir = "";
    expect_invalid(&r, "req->cache_dir");
    cr_assert_eq(symm_jit_compile(NULL, &(symm_jit_result){0}), SYMM_ERR_INVALID_ARG);
    cr_assert_eq(symm_jit_compile(&req, NULL), SYMM_ERR_INVALID_ARG);
    cr_assert_eq(count_files(cache_dir), 0);
    free(src);
}

/* --- environment ------------------------------------------------------------ */

static void expect_env_error(const char *var, const char *value, const char *words)
{
    setenv(var, value, 1);
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, cache_dir);
    for (int round = 0; round < 2; round++) {
        symm_jit_result res;
        cr_assert_eq(symm_jit_compile(&req, &res), SYMM_ERR_INVALID_ARG, "%s=\"%s\" accepted",
                     var, value);
        const char *msg = symm_last_error();
        cr_assert(strstr(msg, var) && strstr(msg, words), "message \"%s\": expected %s and %s",
                  msg, var, words);
        symm_jit_result_free(&res);
    }
    free(src);
}

Test(jit, env_cache_with_unknown_value_lists_accepted_values)
{
    expect_env_error("SYMM_JIT_CACHE", "yes", "\"yes\": expected 0 or 1");
}

Test(jit, env_dump_with_unknown_value_lists_accepted_values)
{
    expect_env_error("SYMM_JIT_DUMP", "true", "\"true\": expected 0 or 1");
}

Test(jit, env_lineinfo_with_unknown_value_lists_accepted_values)
{
    expect_env_error("SYMM_JIT_LINEINFO", "on", "\"on\": expected 0 or 1");
}

Test(jit, env_empty_cache_dir_is_an_error_pointing_at_symm_jit_cache)
{
    expect_env_error("SYMM_CACHE_DIR", "", "SYMM_JIT_CACHE=0");
}

Test(jit, env_cache_0_turns_the_cache_off)
{
    setenv("SYMM_JIT_CACHE", "0", 1);
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, cache_dir);
    for (int round = 0; round < 2; round++) {
        symm_jit_result res;
        compile_ok(&req, &res);
        cr_assert(!res.cache_hit && !res.cache_path[0], "round %d used the cache", round);
        symm_jit_result_free(&res);
    }
    cr_assert_eq(count_files(cache_dir), 0);
    free(src);
}

/* Compile with no cache_dir in the request; the entry must land in want_dir. */
static void expect_default_dir(const char *want_dir)
{
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, NULL);
    symm_jit_result res, hit;
    compile_ok(&req, &res);
    cr_assert(!strncmp(res.cache_path, want_dir, strlen(want_dir)) &&
                  res.cache_path[strlen(want_dir)] == '/',
              "entry %s: expected it in %s", res.cache_path, want_dir);
    compile_ok(&req, &hit);
    cr_assert(hit.cache_hit, "no hit from the default directory");
    symm_jit_result_free(&res);
    symm_jit_result_free(&hit);
    free(src);
}

Test(jit, env_symm_cache_dir_is_the_default_directory)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/from-env", cache_dir);
    setenv("SYMM_CACHE_DIR", dir, 1);
    setenv("XDG_CACHE_HOME", "/nonexistent-xdg", 1);
    expect_default_dir(dir);
}

Test(jit, env_xdg_cache_home_comes_before_home)
{
    char xdg[300], want[320];
    snprintf(xdg, sizeof xdg, "%s/xdg", cache_dir);
    snprintf(want, sizeof want, "%s/symmgen", xdg);
    setenv("XDG_CACHE_HOME", xdg, 1);
    setenv("HOME", "/nonexistent-home", 1);
    expect_default_dir(want);
}

Test(jit, env_home_is_the_last_default)
{
    char want[320];
    snprintf(want, sizeof want, "%s/.cache/symmgen", cache_dir);
    setenv("XDG_CACHE_HOME", "relative/is/ignored", 1);
    setenv("HOME", cache_dir, 1);
    expect_default_dir(want);
}

Test(jit, env_without_any_directory_compiles_and_warns)
{
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, NULL);
    symm_jit_result res;
    compile_ok(&req, &res);
    cr_assert(strstr(res.warning, "HOME") && strstr(res.warning, "compiled without caching"),
              "warning \"%s\"", res.warning);
    symm_jit_result_free(&res);
    free(src);
}

static void *dump_file(const char *key_path, const char *ext, size_t *size)
{
    char path[400];
    snprintf(path, sizeof path, "%.*s.%s", (int)(strlen(key_path) - strlen(".cubin")), key_path,
             ext);
    return test_slurp(path, size);
}

/* Does the cubin hold the string needle, with its NUL (a section's or a
 * symbol's name)? */
static bool has_bytes(const void *hay, size_t n, const char *needle)
{
    return memmem(hay, n, needle, strlen(needle) + 1) != NULL;
}

Test(jit, env_dump_writes_source_options_cubin_ptx_and_log)
{
    setenv("SYMM_JIT_DUMP", "1", 1);
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, cache_dir);
    symm_jit_result res;
    compile_ok(&req, &res);
    cr_assert_str_eq(res.warning, "");
    size_t n;
    char *text = dump_file(res.cache_path, "cu", &n);
    cr_assert(n == strlen(src) && !memcmp(text, src, n), "dumped source differs");
    free(text);
    uint8_t *elf = dump_file(res.cache_path, "elf", &n);
    cr_assert(n == res.cubin_size && !memcmp(elf, res.cubin, n), "dumped cubin differs");
    cr_assert(!has_bytes(elf, n, ".debug_line"), "a line table without SYMM_JIT_LINEINFO");
    free(elf);
    text = dump_file(res.cache_path, "options", &n);
    text = realloc(text, n + 1);
    text[n] = '\0';
    const char *defaults = "--gpu-architecture=sm_90a\n-std=c++17\n-default-device\n";
    cr_assert(!strncmp(text, defaults, strlen(defaults)), "options dump \"%s\"", text);
    free(text);
    text = dump_file(res.cache_path, "ptx", &n);
    text = realloc(text, n + 1);
    text[n] = '\0';
    cr_assert(strstr(text, ".target sm_90a") && strstr(text, "fill"), "ptx dump: %.200s", text);
    free(text);
    free(dump_file(res.cache_path, "log", &n));
    cr_assert_eq(count_files(cache_dir), 6, "entry + cu, options, elf, ptx, log");
    symm_jit_result_free(&res);
    free(src);
}

/* SYMM_JIT_LINEINFO=1 compiles with -lineinfo: the option is in the dump
 * (so in the cache key), and the cubin carries a line table, which the
 * plain compile of env_dump_writes_source_options_cubin_ptx_and_log does
 * not. */
Test(jit, env_lineinfo_adds_a_line_table)
{
    setenv("SYMM_JIT_LINEINFO", "1", 1);
    setenv("SYMM_JIT_DUMP", "1", 1);
    char *src = kernel_source((uint32_t)rnd());
    symm_jit_request req = request(src, cache_dir);
    symm_jit_result res;
    compile_ok(&req, &res);
    size_t n;
    char *text = dump_file(res.cache_path, "options", &n);
    cr_assert(memmem(text, n, "\n-lineinfo\n", 11), "options dump \"%.*s\" lacks -lineinfo", (int)n, text);
    free(text);
    cr_assert(has_bytes(res.cubin, res.cubin_size, ".debug_line"), "no line table in the cubin");
    symm_jit_result_free(&res);
    free(src);
}

/* --- NVRTC, architectures, loading ------------------------------------------ */

Test(jit, nvrtc_version_is_the_loaded_library_s)
{
    int major = 0, minor = -1, want_major, want_minor;
    cr_assert_eq(symm_jit_nvrtc_version(&major, &minor), SYMM_OK, "%s", symm_last_error());
    cr_assert_eq(nvrtcVersion(&want_major, &want_minor), NVRTC_SUCCESS);
    cr_assert(major == want_major && minor == want_minor, "got %d.%d, NVRTC says %d.%d", major,
              minor, want_major, want_minor);
}

Test(jit, missing_nvrtc_is_reported_with_every_place_tried)
{
    char missing[300];
    snprintf(missing, sizeof missing, "%s/libnvrtc.so.13", cache_dir);
    const char *candidates[] = {missing, "libm.so.6"};
    symm_nvrtc_api api;
    char why[2048];
    cr_assert_eq(symm_nvrtc_open(candidates, 2, &api, why, sizeof why), -1);
    cr_assert(strstr(why, missing) && strstr(why, "libm.so.6 lacks nvrtcVersion"),
              "why \"%s\"", why);
}

Test(jit, arch_for_compute_capability_follows_the_a_suffix_rule)
{
    static const struct {
        int major, minor;
        const char *arch;
    } table[] = {{7, 5, "sm_75"},   {8, 0, "sm_80"},     {8, 6, "sm_86"},
                 {8, 9, "sm_89"},   {9, 0, "sm_90a"},    {10, 0, "sm_100a"},
                 {10, 3, "sm_103a"}, {11, 0, "sm_110a"}, {12, 1, "sm_121a"}};
    char buf[16];
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        cr_assert_eq(symm_jit_arch_for(table[i].major, table[i].minor, buf, sizeof buf), SYMM_OK);
        cr_assert_str_eq(buf, table[i].arch, "compute capability %d.%d", table[i].major,
                         table[i].minor);
    }
    cr_assert_eq(symm_jit_arch_for(10, 0, buf, 8), SYMM_OK, "sm_100a fits 8 bytes");
    cr_assert_eq(symm_jit_arch_for(10, 0, buf, 7), SYMM_ERR_INVALID_ARG);
    cr_assert(strstr(symm_last_error(), "needs 8"), "%s", symm_last_error());
    cr_assert_eq(symm_jit_arch_for(0, 0, buf, sizeof buf), SYMM_ERR_INVALID_ARG);
    cr_assert_eq(symm_jit_arch_for(9, 10, buf, sizeof buf), SYMM_ERR_INVALID_ARG);
}

Test(jit, load_rejects_what_is_not_a_cubin_before_any_driver_call)
{
    uint8_t junk[256];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)rnd();
    junk[0] = 'J';
    CUmodule mod = (CUmodule)(uintptr_t)1;
    cr_assert_eq(symm_jit_load(junk, sizeof junk, &mod), SYMM_ERR_INVALID_ARG);
    cr_assert(strstr(symm_last_error(), "not a cubin") && mod == NULL, "%s", symm_last_error());
    cr_assert_eq(symm_jit_load(NULL, 100, &mod), SYMM_ERR_INVALID_ARG);
    cr_assert_eq(symm_jit_get_function(NULL, "fill", &(CUfunction){0}), SYMM_ERR_INVALID_ARG);
    cr_assert_eq(symm_jit_unload(NULL), SYMM_OK);
}

/* --- compiling parts at once ------------------------------------------------ */

/* Parts 1 and 2 of one source, each with -DSYMM_PART=<i>: each cubin holds
 * its part's kernel only, both are cached, and a second call hits twice. */
Test(jit, parts_compile_at_once_each_into_its_own_cubin_and_cache_entry)
{
    char *src;
    const uint32_t c = (uint32_t)rnd();
    cr_assert(asprintf(&src,
                       "#if SYMM_PART == 1\n"
                       "extern \"C\" __global__ void part_one(unsigned *out) { out[threadIdx.x] = 0x%08xu; }\n"
                       "#elif SYMM_PART == 2\n"
                       "extern \"C\" __global__ void part_two(unsigned *out) { out[threadIdx.x] = ~0x%08xu; }\n"
                       "#else\n"
                       "#error SYMM_PART not given\n"
                       "#endif\n",
                       c, c) > 0);
    symm_jit_request req = request(src, cache_dir);
    symm_jit_result res[2];
    for (int round = 0; round < 2; round++) {
        symm_status st = symm_jit_compile_parts(&req, 2, res);
        cr_assert_eq(st, SYMM_OK, "round %d: %s", round, symm_last_error());
        for (int i = 0; i < 2; i++) {
            cr_assert_eq(res[i].cache_hit, round == 1, "round %d, part %d: cache_hit %d", round, i + 1,
                         res[i].cache_hit);
            cr_assert(has_bytes(res[i].cubin, res[i].cubin_size, i == 0 ? "part_one" : "part_two") &&
                          !has_bytes(res[i].cubin, res[i].cubin_size, i == 0 ? "part_two" : "part_one"),
                      "round %d: part %d's cubin holds the wrong kernel", round, i + 1);
            symm_jit_result_free(&res[i]);
        }
    }
    cr_assert_eq(count_files(cache_dir), 2, "one cache entry per part");
    free(src);
}

/* A list of parts (combine = "auto" compiles 1, 2 and 4): part list[i] into
 * res[i], each with its own -DSYMM_PART and its own kernel, in any order;
 * parts 3 and those not listed are not compiled. A bad list is refused,
 * naming the entry, before anything compiles. */
Test(jit, a_list_of_parts_compiles_each_listed_part_into_its_place)
{
    char *src;
    const uint32_t c = (uint32_t)rnd();
    const int lists[][3] = {{1, 2, 4}, {4, 1, 2}, {2, 4, 1}};
    const int l = (int)(rnd() % 3);
    symm_jit_result res[3];
    /* The kernel's name is its part (part_1, ...): SYMM_PART pasted. */
    cr_assert(asprintf(&src,
                       "#if SYMM_PART == 3\n"
                       "#error part 3 was not asked for\n"
                       "#endif\n"
                       "#define NAME2(p) part_##p\n#define NAME(p) NAME2(p)\n"
                       "extern \"C\" __global__ void NAME(SYMM_PART)(unsigned *out) { out[threadIdx.x] = 0x%08xu; }\n",
                       c) > 0);
    symm_jit_request req = request(src, cache_dir);
    symm_status st = symm_jit_compile_part_list(&req, lists[l], 3, res);
    cr_assert_eq(st, SYMM_OK, "parts %d, %d, %d: %s", lists[l][0], lists[l][1], lists[l][2], symm_last_error());
    for (int i = 0; i < 3; i++) {
        char mine[16];
        snprintf(mine, sizeof mine, "part_%d", lists[l][i]);
        cr_assert(has_bytes(res[i].cubin, res[i].cubin_size, mine), "res[%d] lacks %s", i, mine);
        for (int p = 1; p <= 4; p++) {
            char other[16];
            snprintf(other, sizeof other, "part_%d", p);
            cr_assert(p == lists[l][i] || !has_bytes(res[i].cubin, res[i].cubin_size, other),
                      "res[%d] (part %d) holds %s", i, lists[l][i], other);
        }
        symm_jit_result_free(&res[i]);
    }
    cr_assert_eq(count_files(cache_dir), 3, "one cache entry per listed part");
    static const struct {
        int list[3], n;
        const char *want;
    } bad[] = {
        {{1, 0, 2}, 3, "list[1] = 0: expected distinct parts 1..4"},
        {{1, 5}, 2, "list[1] = 5: expected distinct parts 1..4"},
        {{2, 4, 2}, 3, "list[2] = 2: expected distinct parts 1..4"},
        {{1}, 0, "parts 0: expected 1..4"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(symm_jit_compile_part_list(&req, bad[i].list, bad[i].n, res), SYMM_ERR_INVALID_ARG);
        cr_assert(strstr(symm_last_error(), bad[i].want), "%s", symm_last_error());
    }
    cr_assert_eq(count_files(cache_dir), 3, "a refused list compiled nothing");
    free(src);
}

/* A part that does not compile fails the call with that part's message; the
 * other part's result is released by the caller as usual. */
Test(jit, a_failing_part_fails_the_call_naming_its_error)
{
    char *src;
    const int bad = 1 + (int)(rnd() % 2);
    cr_assert(asprintf(&src,
                       "#if SYMM_PART == %d\n"
                       "#error part %d is broken on purpose\n"
                       "#endif\n"
                       "extern \"C\" __global__ void k(unsigned *out) { out[threadIdx.x] = SYMM_PART; }\n",
                       bad, bad) > 0);
    symm_jit_request req = request(src, cache_dir);
    symm_jit_result res[2];
    cr_assert_eq(symm_jit_compile_parts(&req, 2, res), SYMM_ERR_NVRTC);
    char want[64];
    snprintf(want, sizeof want, "part %d is broken on purpose", bad);
    cr_assert(strstr(symm_last_error(), want), "%s", symm_last_error());
    cr_assert(res[2 - bad].cubin != NULL, "the good part compiled");
    symm_jit_result_free(&res[0]);
    symm_jit_result_free(&res[1]);
    free(src);

    /* A part's long log reaches the message whole (up to its 8 KiB), not cut
     * at a part's buffer: 40 errors, about 5 KB, the last one included. */
    size_t cap = 8192, len = 0;
    src = malloc(cap);
    cr_assert(src);
    len += (size_t)snprintf(src + len, cap - len, "extern \"C\" __global__ void k(int *out)\n{\n#if SYMM_PART == %d\n",
                            bad);
    for (int i = 0; i < 40; i++)
        len += (size_t)snprintf(src + len, cap - len, "    out[%d] = undefined_%d;\n", i, i);
    snprintf(src + len, cap - len, "#endif\n    out[threadIdx.x] = SYMM_PART;\n}\n");
    req.source = src;
    cr_assert_eq(symm_jit_compile_parts(&req, 2, res), SYMM_ERR_NVRTC);
    cr_assert(strstr(symm_last_error(), "undefined_0") && strstr(symm_last_error(), "undefined_39"),
              "the message (%zu bytes) lacks the first or the last of the part's 40 errors: %s",
              strlen(symm_last_error()), symm_last_error());
    symm_jit_result_free(&res[0]);
    symm_jit_result_free(&res[1]);
    cr_assert_eq(symm_jit_compile_parts(&req, 0, res), SYMM_ERR_INVALID_ARG);
    cr_assert_eq(symm_jit_compile_parts(&req, SYMM_JIT_MAX_PARTS + 1, res), SYMM_ERR_INVALID_ARG);
    cr_assert_eq(symm_jit_compile_parts(&req, 2, NULL), SYMM_ERR_INVALID_ARG);
    free(src);
}
