/* test_cli.c: the symmgen program as users run it: the built binary
 * ($SYMM_BUILD_DIR/bin/symmgen) in a fresh temporary directory, checked by
 * its exit status, its stdout and stderr, and the files it leaves (or does
 * not leave) behind. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "moe_inputs.h"
#include "sg.h"
#include "sha256.h"
#include "world_fork.h"

/* ---- helpers ------------------------------------------------------------ */

/* snprintf into an array, failing the test rather than truncating. */
#define FMT(buf, ...) cr_assert(snprintf(buf, sizeof buf, __VA_ARGS__) < (int)sizeof buf, "%s: too long", #buf)

/* This build is under ASan (and UBSan): its libsymm.a links only with the
 * sanitizers, and NVRTC runs about 2.5 times slower (its allocator). */
#if defined(__SANITIZE_ADDRESS__)
static const bool sanitized = true;
#define SAN_FLAGS "-fsanitize=address,undefined"
#else
static const bool sanitized = false;
#define SAN_FLAGS ""
#endif

static char work[PATH_MAX];     /* fresh per test; symmgen runs here */
static char symmgen[PATH_MAX];
static char repo[PATH_MAX];     /* the source tree (specs/, runtime/include) */
static moe_rng rng; /* fresh each test */

static uint32_t rnd(void) { return (uint32_t)(moe_rng_next(&rng) >> 32); }

static int rnd_in(int lo, int hi) { return lo + moe_rng_int(&rng, hi - lo + 1); }

static void setup(void)
{
    wf_random(&rng.s, sizeof rng.s);
    const char *build = getenv("SYMM_BUILD_DIR");
    char exe[PATH_MAX] = "";
    if (build) {
        FMT(symmgen, "%s/bin/symmgen", build);
    } else {
        /* Run by hand: BUILD/tests/test_cli -> BUILD/bin/symmgen. */
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        cr_assert(n > 0);
        exe[n] = '\0';
        FMT(symmgen, "%s/../bin/symmgen", dirname(exe));
    }
    cr_assert(access(symmgen, X_OK) == 0, "%s: %s (build it first)", symmgen, strerror(errno));
    cr_assert(getcwd(repo, sizeof repo) != NULL);
    char probe[PATH_MAX + 32];
    FMT(probe, "%s/specs/default.lua", repo);
    cr_assert(access(probe, R_OK) == 0, "run the tests from the repository root (no %s)", probe);
    FMT(work, "/tmp/sg-cli-XXXXXX");
    cr_assert(mkdtemp(work) != NULL);
}

static void teardown(void)
{
    wf_rmtree(work);
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    sg_buf b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        sg_buf_append(&b, chunk, n);
    fclose(f);
    if (!b.data)
        sg_buf_append(&b, "", 0);
    if (len)
        *len = b.len;
    return b.data;
}

static char *read_at(const char *rel, size_t *len)
{
    char path[PATH_MAX];
    FMT(path, "%s/%s", work, rel);
    return read_file(path, len);
}

static void write_at(const char *rel, const char *text)
{
    char path[PATH_MAX];
    FMT(path, "%s/%s", work, rel);
    FILE *f = fopen(path, "w");
    cr_assert(f != NULL, "%s: %s", path, strerror(errno));
    fputs(text, f);
    cr_assert(fclose(f) == 0);
}

static void mkdir_at(const char *rel)
{
    char path[PATH_MAX];
    FMT(path, "%s/%s", work, rel);
    cr_assert_eq(mkdir(path, 0755), 0, "mkdir %s: %s", path, strerror(errno));
}

static bool exists_at(const char *rel)
{
    char path[PATH_MAX];
    FMT(path, "%s/%s", work, rel);
    return access(path, F_OK) == 0;
}

typedef struct result {
    int status;  /* exit status, or 128 + signal */
    char *out, *err;
    double ms;
} result;

static void result_free(result *r)
{
    free(r->out);
    free(r->err);
}

/* Runs symmgen with argv (NULL-terminated after argv[0]) in the work
 * directory; fsize_limit > 0 caps the size of files it may write. */
static result run_limited(long fsize_limit, const char *const *args)
{
    char out_path[PATH_MAX], err_path[PATH_MAX];
    FMT(out_path, "%s/../%s.stdout", work, strrchr(work, '/') + 1);
    FMT(err_path, "%s/../%s.stderr", work, strrchr(work, '/') + 1);
    const char *argv[64] = {symmgen};
    int argc = 1;
    for (; args[argc - 1]; argc++)
        argv[argc] = args[argc - 1];
    argv[argc] = NULL;

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0 || chdir(work) != 0)
            _exit(126);
        if (fsize_limit > 0) {
            struct rlimit lim;
            getrlimit(RLIMIT_FSIZE, &lim);
            lim.rlim_cur = (rlim_t)fsize_limit;
            signal(SIGXFSZ, SIG_IGN);
            setrlimit(RLIMIT_FSIZE, &lim);
        }
        execv(symmgen, (char *const *)argv);
        _exit(127);
    }
    int wstatus;
    while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR)
        ;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    result r = {
        .status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus),
        .out = read_file(out_path, NULL),
        .err = read_file(err_path, NULL),
        .ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6,
    };
    unlink(out_path);
    unlink(err_path);
    return r;
}

#define RUN(...) run_limited(0, (const char *const[]){__VA_ARGS__, NULL})

/* Every entry under dir, sorted, with sizes, modes and hashes; paths
 * relative to root. */
static void snapshot_rel(const char *root, const char *dir, sg_buf *out)
{
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    if (n < 0) {
        sg_buf_printf(out, "(no %s)\n", dir);
        return;
    }
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX];
        FMT(path, "%s/%s", dir, names[i]->d_name);
        struct stat st;
        if (strcmp(names[i]->d_name, ".") && strcmp(names[i]->d_name, "..") && lstat(path, &st) == 0) {
            char hex[SYMM_SHA256_HEX_SIZE] = "-";
            if (S_ISREG(st.st_mode)) {
                size_t len;
                char *data = read_file(path, &len);
                symm_sha256_hex_of(data, len, hex);
                free(data);
            }
            sg_buf_printf(out, "%s %lld %o %s\n", path + strlen(root), (long long)st.st_size,
                          (unsigned)st.st_mode, hex);
            if (S_ISDIR(st.st_mode))
                snapshot_rel(root, path, out);
        }
        free(names[i]);
    }
    free(names);
}

static void snapshot(const char *dir, sg_buf *out) { snapshot_rel(dir, dir, out); }

static void snapshot_work(sg_buf *out)
{
    out->len = 0;
    snapshot(work, out);
    if (!out->data)
        sg_buf_puts(out, "");
}

/* A small valid variant line; fields are random but valid. */
static void variant_line(sg_buf *spec, const char *name, int max_tokens)
{
    static const char *const dtypes[] = {"bf16", "fp16", "fp32", "fp8_e4m3"};
    int world = 2 << rnd_in(0, 2), experts = world * rnd_in(1, 8);
    int topk = rnd_in(1, experts < 4 ? experts : 4);
    sg_buf_printf(spec, "layout { name = \"%s\", hidden = %d, topk = %d, experts = %d, world = %d, "
                        "max_tokens = %d, dtype = \"%s\", layout = \"%s\" }\n",
                  name, 128 * rnd_in(1, 32), topk, experts, world, max_tokens,
                  dtypes[rnd() % 4], rnd() & 1 ? "rank" : "expert");
}

/* Writes spec NAME.lua with n random variants named PREFIX0..; returns the
 * names' prefix. */
static void write_spec(const char *rel, const char *prefix, int n)
{
    sg_buf spec = {0};
    sg_buf_puts(&spec, "-- test spec\n");
    for (int i = 0; i < n; i++) {
        char name[64];
        FMT(name, "%s%d", prefix, i);
        variant_line(&spec, name, rnd_in(1, 300));
    }
    write_at(rel, spec.data);
    sg_buf_free(&spec);
}

/* A minimal JSON validator: true when text is one JSON value. */
static const char *json_value(const char *p);

static const char *json_ws(const char *p)
{
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')
        p++;
    return p;
}

static const char *json_string(const char *p)
{
    if (*p++ != '"')
        return NULL;
    for (; *p != '"'; p++) {
        if ((unsigned char)*p < 0x20)
            return NULL;
        if (*p == '\\' && !*++p)
            return NULL;
    }
    return p + 1;
}

static const char *json_list(const char *p, char close, bool object)
{
    p = json_ws(p + 1);
    if (*p == close)
        return p + 1;
    for (;;) {
        if (object) {
            p = json_string(json_ws(p));
            if (!p || *(p = json_ws(p)) != ':')
                return NULL;
            p++;
        }
        p = json_value(p);
        if (!p)
            return NULL;
        p = json_ws(p);
        if (*p == close)
            return p + 1;
        if (*p++ != ',')
            return NULL;
    }
}

static const char *json_value(const char *p)
{
    p = json_ws(p);
    if (*p == '{')
        return json_list(p, '}', true);
    if (*p == '[')
        return json_list(p, ']', false);
    if (*p == '"')
        return json_string(p);
    if (strncmp(p, "true", 4) == 0 || strncmp(p, "null", 4) == 0)
        return p + 4;
    if (strncmp(p, "false", 5) == 0)
        return p + 5;
    char *end;
    strtod(p, &end);
    return end == p ? NULL : end;
}

static bool json_valid(const char *text)
{
    const char *end = json_value(text);
    return end && *json_ws(end) == '\0';
}

/* The string value of "key" in the object text that starts at from. */
static void json_field(const char *from, const char *key, char *out, size_t size)
{
    char pattern[64];
    FMT(pattern, "\"%s\": \"", key);
    const char *p = strstr(from, pattern);
    cr_assert(p, "no %s after %.60s", key, from);
    p += strlen(pattern);
    size_t n = strcspn(p, "\"");
    cr_assert(n < size);
    memcpy(out, p, n);
    out[n] = '\0';
}

/* ---- tests ------------------------------------------------------------- */

TestSuite(cli, .init = setup, .fini = teardown);

Test(cli, help_and_version_exit_0)
{
    result r = RUN("--help");
    cr_assert_eq(r.status, 0, "stderr: %s", r.err);
    cr_assert(strstr(r.out, "usage: symmgen") && strstr(r.out, "--compile") && strstr(r.out, "-D FIELD=VALUE"),
              "help: %s", r.out);
    result_free(&r);
    r = RUN("--version");
    cr_assert_eq(r.status, 0);
    cr_assert_str_eq(r.out, "symmgen " SYMM_VERSION "\n");
    result_free(&r);
}

Test(cli, usage_errors_exit_2_with_a_message_and_write_nothing)
{
    write_spec("a.lua", "a", 1);
    write_at("b.lua", "");
    char unknown[32], bad_define[32];
    FMT(unknown, "--no-such-%u", rnd());
    FMT(bad_define, "hidden%u", rnd());
    struct {
        const char *args[6];
        const char *says;
    } cases[] = {
        {{unknown, "a.lua"}, unknown},
        {{"-D", bad_define, "a.lua"}, "expected FIELD=VALUE"},
        {{"-D", "=3", "a.lua"}, "expected FIELD=VALUE"},
        {{"-o", "x", "a.lua", "b.lua"}, "several specs"},
        {{"--arch", "sm90", "a.lua"}, "--arch sm90"},
        {{"--compile", "--arch=compute_90", "a.lua"}, "compute_90"},
        {{"--arch", "sm_90b", "a.lua"}, "sm_90b"},
        {{"--json", "a.lua"}, "--list"},
        {{"--list", "--compile", "a.lua"}, "--list"},
        {{"-q"}, "no spec file"},
        {{"-o"}, "expected an output directory"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *const *a = cases[i].args;
        result r = run_limited(0, a);
        cr_assert_eq(r.status, 2, "case %zu (%s): status %d, stderr %s", i, a[0], r.status, r.err);
        cr_assert(strstr(r.err, cases[i].says), "case %zu: stderr lacks \"%s\": %s", i, cases[i].says, r.err);
        cr_assert(strstr(r.err, "symmgen --help"), "case %zu: no pointer to --help", i);
        cr_assert(!exists_at("out") && !exists_at("x"), "case %zu wrote files", i);
        result_free(&r);
    }
    /* Two specs with the same name would write the same directory. */
    mkdir_at("sub");
    write_spec("sub/a.lua", "c", 1);
    result r = RUN("a.lua", "sub/a.lua");
    cr_assert_eq(r.status, 2, "%s", r.err);
    cr_assert(strstr(r.err, "both write out/a"), "%s", r.err);
    cr_assert(!exists_at("out"));
    result_free(&r);
}

/* A target older than Hopper is refused in one line before NVRTC runs
 * (which would print pages of ptxas errors), and nothing is written. */
Test(cli, compile_for_a_gpu_older_than_hopper_is_refused_in_one_line)
{
    write_spec("a.lua", "a", 2);
    static const char *const older[] = {"sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_80a"};
    const char *arch = older[rnd() % (sizeof older / sizeof older[0])];
    for (int check = 0; check < 2; check++) {
        result r = check ? RUN("--check", "--compile", "--arch", arch, "a.lua") : RUN("--compile", "--arch", arch, "a.lua");
        char want[128];
        FMT(want, "symmgen: --arch %s: the generated kernels need a Hopper (sm_90) or newer GPU\n", arch);
        cr_assert_eq(r.status, 2, "--arch %s: status %d: %s", arch, r.status, r.err);
        cr_assert_str_eq(r.err, want);
        cr_assert(!exists_at("out"), "--arch %s wrote out/", arch);
        result_free(&r);
    }
}

Test(cli, spec_error_exits_1_with_every_message_and_writes_nothing)
{
    int line = rnd_in(2, 30);
    sg_buf spec = {0};
    for (int i = 1; i < line; i++)
        sg_buf_puts(&spec, i % 3 ? "\n" : "-- comment\n");
    char field[32];
    FMT(field, "bogus_%u", rnd() % 1000);
    sg_buf_printf(&spec, "layout { name = \"x\", hidden = 1024, topk = 2, experts = 8, world = 2, "
                         "max_tokens = 64, %s = 1 }\n", field);
    sg_buf_puts(&spec, "layout { name = \"y\", hidden = 1024, topk = 99, experts = 8, world = 2, max_tokens = 64 }\n");
    write_at("bad.lua", spec.data);
    result r = RUN("bad.lua");
    cr_assert_eq(r.status, 1, "status %d: %s", r.status, r.err);
    char want[64];
    FMT(want, "bad.lua:%d: ", line);
    cr_assert(strstr(r.err, want) && strstr(r.err, field), "stderr lacks \"%s\" and %s: %s", want, field, r.err);
    FMT(want, "bad.lua:%d: ", line + 1);
    cr_assert(strstr(r.err, want) && strstr(r.err, "topk"), "the second error is missing: %s", r.err);
    cr_assert_null(strstr(r.err, "traceback"), "%s", r.err);
    cr_assert(!exists_at("out"), "a failing spec wrote out/");
    cr_assert_str_eq(r.out, "");
    result_free(&r);
    sg_buf_free(&spec);
}

Test(cli, check_validates_and_writes_nothing)
{
    int n = rnd_in(1, 5);
    write_spec("s.lua", "v", n);
    result r = RUN("--check", "s.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    char want[64];
    FMT(want, "s.lua: %d variant%s OK", n, n == 1 ? "" : "s");
    cr_assert(strstr(r.err, want), "%s", r.err);
    cr_assert(!exists_at("out"));
    result_free(&r);
    r = RUN("--check", "-q", "s.lua");
    cr_assert_eq(r.status, 0);
    cr_assert_str_eq(r.err, "", "-q printed: %s", r.err);
    result_free(&r);
}

/* --list prints what the spec declares without expanding any template: a
 * spec of the most variants lists at once, in little memory (expanding all
 * of them first took 35 s and 4 GB). */
Test(cli, list_of_the_most_variants_expands_no_template)
{
    wf_watchdog(20);
    const int n = 16384;
    write_at("many.lua", "for i = 1, 16384 do\n"
                         "  layout { name = \"v\" .. i, hidden = 128, topk = 2, experts = 4, world = 2, max_tokens = 16 }\n"
                         "end\n");
    result r = RUN("--list", "many.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    int lines = 0;
    for (const char *p = r.out; (p = strchr(p, '\n')); p++)
        lines++;
    cr_assert_eq(lines, n, "%d rows, expected %d", lines, n);
    result_free(&r);
}

Test(cli, list_prints_aligned_rows_and_json_and_writes_nothing)
{
    int n = rnd_in(2, 6);
    sg_buf spec = {0};
    char names[6][32];
    for (int i = 0; i < n; i++) {
        FMT(names[i], "v%.*s%d", rnd_in(0, 8), "xxxxxxxx", i);
        variant_line(&spec, names[i], rnd_in(1, 1000));
    }
    write_at("s.lua", spec.data);
    result r = RUN("--list", "s.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    int lines = 0;
    long layout_col = -1, sym_col = -1;
    for (char *line = r.out, *nl; (nl = strchr(line, '\n')); line = nl + 1, lines++) {
        *nl = '\0';
        cr_assert(strncmp(line, names[lines], strlen(names[lines])) == 0, "row %d: %s", lines, line);
        cr_assert(strstr(line, "hidden=") && strstr(line, " MiB"), "row %d: %s", lines, line);
        long lc = strstr(line, "  rank ") ? strstr(line, "  rank ") - line : strstr(line, "  expert") - line;
        long sc = strstr(line, "sym=") - line;
        cr_assert(layout_col < 0 || (lc == layout_col && sc == sym_col), "columns are not aligned at row %d", lines);
        layout_col = lc, sym_col = sc;
    }
    cr_assert_eq(lines, n);
    result_free(&r);

    r = RUN("--list", "--json", "s.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(json_valid(r.out), "not JSON:\n%s", r.out);
    for (int i = 0; i < n; i++) {
        char key[64];
        FMT(key, "\"name\": \"%s\"", names[i]);
        cr_assert(strstr(r.out, key), "no %s", key);
    }
    cr_assert(!exists_at("out"));
    result_free(&r);
    sg_buf_free(&spec);
}

Test(cli, same_spec_gives_byte_identical_output)
{
    write_spec("s.lua", "v", rnd_in(2, 6));
    result a = RUN("-o", "one", "s.lua"), b = RUN("-q", "-o", "two/deeper", "s.lua");
    cr_assert_eq(a.status, 0, "%s", a.err);
    cr_assert_eq(b.status, 0, "%s", b.err);
    cr_assert_str_eq(b.err, "", "-q printed: %s", b.err);
    char one[PATH_MAX], two[PATH_MAX];
    FMT(one, "%s/one", work);
    FMT(two, "%s/two/deeper", work);
    sg_buf sa = {0}, sb = {0};
    snapshot(one, &sa);
    snapshot(two, &sb);
    cr_assert_str_eq(sa.data, sb.data, "the two outputs differ");
    cr_assert(strstr(sa.data, "/manifest.json ") && strstr(sa.data, "/v0.c "), "%s", sa.data);
    result_free(&a);
    result_free(&b);
    sg_buf_free(&sa);
    sg_buf_free(&sb);
}

Test(cli, spec_error_leaves_an_existing_output_byte_identical)
{
    write_spec("s.lua", "v", rnd_in(1, 4));
    result r = RUN("s.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    result_free(&r);
    sg_buf before = {0}, after = {0};
    /* Same spec, now with an error in its last variant. */
    size_t len;
    char *text = read_at("s.lua", &len);
    sg_buf broken = {0};
    sg_buf_append(&broken, text, len);
    sg_buf_puts(&broken, "layout { name = \"late\", hidden = 1001, topk = 2, experts = 8, world = 2, max_tokens = 8 }\n");
    write_at("s.lua", broken.data);
    snapshot_work(&before);
    r = RUN("s.lua");
    cr_assert_eq(r.status, 1, "%s", r.err);
    cr_assert(strstr(r.err, "hidden"), "%s", r.err);
    snapshot_work(&after);
    cr_assert_str_eq(after.data, before.data, "the output changed after a spec error");
    result_free(&r);
    free(text);
    sg_buf_free(&broken);
    sg_buf_free(&before);
    sg_buf_free(&after);
}

Test(cli, regenerating_replaces_the_whole_output)
{
    write_spec("s.lua", "old", 3);
    result r = RUN("s.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    result_free(&r);
    write_spec("s.lua", "new", 2);
    r = RUN("s.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(!exists_at("out/s/old0.cu"), "a variant no longer in the spec survived");
    cr_assert(exists_at("out/s/new1.cu") && exists_at("out/s/new1.h") && exists_at("out/s/new1.c"));
    char out_dir[PATH_MAX];
    FMT(out_dir, "%s/out", work);
    DIR *d = opendir(out_dir);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d));)
        entries += e->d_name[0] != '.';
    closedir(d);
    sg_buf all = {0};
    snapshot(out_dir, &all);
    cr_assert_eq(entries, 1, "out/ holds more than out/s");
    cr_assert_null(strstr(all.data, "/."), "hidden leftovers in out/:\n%s", all.data);
    result_free(&r);
    sg_buf_free(&all);
}

Test(cli, refuses_to_replace_a_directory_that_is_not_ours)
{
    write_spec("s.lua", "v", 1);
    mkdir_at("out");
    mkdir_at("out/s");
    char text[32];
    FMT(text, "%u\n", rnd());
    write_at("out/s/precious.txt", text);
    sg_buf before = {0}, after = {0};
    snapshot_work(&before);
    result r = RUN("s.lua");
    cr_assert_eq(r.status, 1, "%s", r.err);
    cr_assert(strstr(r.err, "out/s exists and is not a symmgen output directory (no manifest.json): "
                            "refusing to replace it"), "%s", r.err);
    snapshot_work(&after);
    cr_assert_str_eq(after.data, before.data);
    result_free(&r);
    sg_buf_free(&before);
    sg_buf_free(&after);
}

/* A manifest.json that mentions "format" does not make a directory ours:
 * symmgen replaces the whole directory, and notes.txt would be lost. */
Test(cli, refuses_a_directory_with_a_foreign_manifest_and_keeps_its_files)
{
    write_spec("s.lua", "v", rnd_in(1, 3));
    char dir[32], manifest[64], notes[64], text[32];
    FMT(dir, "proj%u", rnd() % 1000);
    mkdir_at(dir);
    FMT(manifest, "%s/manifest.json", dir);
    FMT(notes, "%s/notes.txt", dir);
    write_at(manifest, "{\"format\":\"png\"}\n");
    FMT(text, "%u\n", rnd());
    write_at(notes, text);
    sg_buf before = {0}, after = {0};
    snapshot_work(&before);
    result r = RUN("-o", dir, "s.lua");
    cr_assert_eq(r.status, 1, "symmgen -o %s exited %d, expected 1 (a refusal): %s", dir, r.status, r.err);
    char want[128];
    FMT(want, "%s exists and is not a symmgen output directory (", dir);
    cr_assert(strstr(r.err, want) && strstr(r.err, "nothing was written"),
              "expected \"%s...\" and \"nothing was written\", got: %s", want, r.err);
    snapshot_work(&after);
    cr_assert_str_eq(after.data, before.data, "%s changed although symmgen refused it", dir);
    result_free(&r);

    /* symmgen's own output, with a file of the user's added, is kept too. */
    r = RUN("-q", "s.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    result_free(&r);
    write_at("out/s/mine.c", text);
    snapshot_work(&before);
    r = RUN("s.lua");
    cr_assert_eq(r.status, 1, "regenerating over out/s/mine.c exited %d, expected 1: %s", r.status, r.err);
    cr_assert(strstr(r.err, "it holds mine.c, which symmgen did not write"), "%s", r.err);
    snapshot_work(&after);
    cr_assert_str_eq(after.data, before.data, "out/s changed although symmgen refused it");
    result_free(&r);
    sg_buf_free(&before);
    sg_buf_free(&after);
}

/* The review's reproducer: d/manifest.json names the user's d/mydata.txt;
 * `symmgen -o d spec.lua` must not delete it. Nor a generated file edited
 * by hand since: its hash no longer matches the manifest's. */
Test(cli, files_a_manifest_names_without_a_matching_hash_are_never_deleted)
{
    write_spec("spec.lua", "v", rnd_in(1, 3));
    mkdir_at("d");
    write_at("d/manifest.json", "{\"format\":1,\"symmgen\":\"x\",\"variants\":[{\"files\":{\"a\":\"mydata.txt\"}}]}");
    char text[32];
    FMT(text, "mine %u\n", rnd());
    write_at("d/mydata.txt", text);
    sg_buf before = {0}, after = {0};
    snapshot_work(&before);
    result r = RUN("-o", "d", "spec.lua");
    cr_assert_eq(r.status, 1, "exit %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "d exists and is not a symmgen output directory") && strstr(r.err, "nothing was written"),
              "%s", r.err);
    snapshot_work(&after);
    cr_assert_str_eq(after.data, before.data, "d changed");
    result_free(&r);

    r = RUN("-q", "-o", "e", "spec.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    result_free(&r);
    char *h = read_at("e/v0.h", NULL);
    cr_assert(h);
    sg_buf edited = {0};
    sg_buf_puts(&edited, h);
    sg_buf_puts(&edited, "/* a note of mine */\n");
    write_at("e/v0.h", edited.data);
    free(h);
    sg_buf_free(&edited);
    sg_buf_free(&before);
    sg_buf_free(&after);
    snapshot_work(&before);
    r = RUN("-o", "e", "spec.lua");
    cr_assert_eq(r.status, 1, "exit %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "was changed since symmgen wrote it"), "%s", r.err);
    snapshot_work(&after);
    cr_assert_str_eq(after.data, before.data, "e changed although one of its files was edited");
    result_free(&r);
    sg_buf_free(&before);
    sg_buf_free(&after);
}

Test(cli, write_error_exits_1_naming_the_file_and_keeps_the_output)
{
    write_spec("s.lua", "v", 2);
    result r = RUN("s.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    result_free(&r);
    sg_buf before = {0}, after = {0};
    snapshot_work(&before);
    r = run_limited(1000, (const char *const[]){"s.lua", NULL});
    cr_assert_eq(r.status, 1, "status %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, strerror(EFBIG)) && strstr(r.err, "out/.s.tmp-"), "%s", r.err);
    snapshot_work(&after);
    cr_assert_str_eq(after.data, before.data);
    result_free(&r);
    sg_buf_free(&before);
    sg_buf_free(&after);
}

/* "-o dir/" is a directory, as with every other tool; "-o /" is not one. */
Test(cli, output_with_trailing_slashes_writes_that_directory)
{
    int n = rnd_in(1, 4), slashes = rnd_in(1, 3);
    write_spec("s.lua", "v", n);
    char dir[64];
    FMT(dir, "gen%d/x%.*s", rnd_in(0, 9999), slashes, "///");
    result r = RUN("-q", "-o", dir, "s.lua");
    cr_assert_eq(r.status, 0, "-o %s: %s", dir, r.err);
    result_free(&r);
    char rel[128];
    FMT(rel, "%.*s/v%d.cu", (int)(strlen(dir) - (size_t)slashes), dir, n - 1);
    cr_assert(exists_at(rel), "-o %s wrote no %s", dir, rel);
    r = RUN("-q", "-o", dir, "s.lua");
    cr_assert_eq(r.status, 0, "regenerating into -o %s: %s", dir, r.err);
    result_free(&r);

    r = RUN("-o", "/", "s.lua");
    cr_assert_eq(r.status, 2, "-o /: %s", r.err);
    cr_assert_not_null(strstr(r.err, "-o /: expected a directory with a name"), "%s", r.err);
    result_free(&r);
}

Test(cli, several_specs_each_get_their_directory)
{
    int na = rnd_in(1, 3), nb = rnd_in(1, 3);
    write_spec("first.lua", "a", na);
    write_spec("second.lua", "b", nb);
    result r = RUN("first.lua", "second.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(exists_at("out/first/manifest.json") && exists_at("out/second/manifest.json"));
    cr_assert(exists_at("out/first/a0.c") && !exists_at("out/first/b0.c") && exists_at("out/second/b0.c"));
    result_free(&r);
    r = RUN("--list", "--json", "first.lua", "second.lua");
    cr_assert_eq(r.status, 0);
    cr_assert(json_valid(r.out), "%s", r.out);
    /* Each variant names the file it came from: the one array mixes specs. */
    cr_assert(strstr(r.out, "\"name\": \"a0\",\n    \"file\": \"first.lua\",\n    \"line\": 2,") &&
              strstr(r.out, "\"name\": \"b0\",\n    \"file\": \"second.lua\",\n    \"line\": 2,"), "%s", r.out);
    result_free(&r);
}

/* A variant declared by a module the spec requires: the manifest and --list
 * --json give that module's path with the line (which counts in it), not
 * the spec's. */
Test(cli, a_variant_from_a_module_names_the_module)
{
    int pad = rnd_in(0, 9);
    sg_buf mod = {0}, spec = {0};
    for (int i = 0; i < pad; i++)
        sg_buf_puts(&mod, "-- module\n");
    sg_buf_puts(&mod, "local M = {}\nfunction M.declare()\n");
    variant_line(&mod, "from_module", rnd_in(1, 300));
    sg_buf_puts(&mod, "end\nreturn M\n");
    write_at("shapes.lua", mod.data);
    sg_buf_puts(&spec, "-- spec\nrequire(\"shapes\").declare()\n");
    variant_line(&spec, "from_spec", rnd_in(1, 300));
    write_at("s.lua", spec.data);
    char want_module[128], want_spec[128];
    FMT(want_module, "\"name\": \"from_module\",\n    \"file\": \"shapes.lua\",\n    \"line\": %d,", pad + 3);
    FMT(want_spec, "\"name\": \"from_spec\",\n    \"file\": \"s.lua\",\n    \"line\": 3,");
    result r = RUN("--list", "--json", "s.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, want_module) && strstr(r.out, want_spec), "--list --json:\n%s", r.out);
    result_free(&r);
    r = RUN("s.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    char *manifest = read_at("out/s/manifest.json", NULL);
    cr_assert(manifest && strstr(manifest, "\"spec\": \"s.lua\","), "%.200s", manifest ? manifest : "(none)");
    /* The manifest's variants sit one level deeper than --list --json's. */
    FMT(want_module, "\"name\": \"from_module\",\n      \"file\": \"shapes.lua\",\n      \"line\": %d,", pad + 3);
    cr_assert(strstr(manifest, want_module), "manifest.json:\n%s", manifest);
    free(manifest);
    result_free(&r);
    sg_buf_free(&mod);
    sg_buf_free(&spec);
}

Test(cli, manifest_is_json_and_its_hashes_match_the_files)
{
    int n = rnd_in(1, 4);
    write_spec("s.lua", "v", n);
    result r = RUN("s.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    char *manifest = read_at("out/s/manifest.json", NULL);
    cr_assert(manifest && json_valid(manifest), "manifest.json is not JSON");
    cr_assert(strncmp(manifest, "{\n  \"format\": 2,\n  \"symmgen\": \"" SYMM_VERSION "\",\n  \"spec\": \"s.lua\",",
                      strlen("{\n  \"format\": 2,\n")) == 0, "%.100s", manifest);
    cr_assert(manifest[strlen(manifest) - 1] == '\n' && manifest[strlen(manifest) - 2] == '}');
    for (int i = 0; i < n; i++) {
        char key[64], name[32], want[SYMM_SHA256_HEX_SIZE], got[SYMM_SHA256_HEX_SIZE];
        FMT(name, "v%d", i);
        FMT(key, "\"name\": \"%s\"", name);
        const char *obj = strstr(manifest, key);
        cr_assert(obj, "no variant %s", name);
        symm_sha256_ctx h;
        uint8_t digest[SYMM_SHA256_SIZE];
        symm_sha256_init(&h);
        const char *ext[] = {"cu", "h", "c"};
        for (int k = 0; k < 3; k++) {
            char rel[64];
            size_t len;
            FMT(rel, "out/s/%s.%s", name, ext[k]);
            char *data = read_at(rel, &len);
            cr_assert(data, "%s missing", rel);
            if (k == 0) {
                symm_sha256_hex_of(data, len, want);
                json_field(obj, "source_sha256", got, sizeof got);
                cr_assert_str_eq(got, want, "%s: source_sha256", name);
            }
            symm_sha256_update(&h, data, len);
            free(data);
        }
        symm_sha256_final(&h, digest);
        symm_sha256_hex(digest, want);
        json_field(obj, "content_sha256", got, sizeof got);
        cr_assert_str_eq(got, want, "%s: content_sha256", name);
    }
    free(manifest);
    result_free(&r);
}

Test(cli, every_file_starts_with_the_header_and_d_overrides_show)
{
    int n = rnd_in(1, 3), tokens = rnd_in(1, 5000);
    write_spec("s.lua", "v", n);
    char define[64];
    FMT(define, "max_tokens=%d", tokens);
    result r = RUN("-D", define, "s.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    char *manifest = read_at("out/s/manifest.json", NULL);
    for (int i = 0; i < n; i++) {
        const char *ext[] = {"cu", "h", "c"};
        for (int k = 0; k < 3; k++) {
            char rel[64], want[160], line[64];
            FMT(rel, "out/s/v%d.%s", i, ext[k]);
            char *data = read_at(rel, NULL);
            cr_assert(data, "%s missing", rel);
            FMT(want, "/* Generated by symmgen %s from s.lua, variant v%d. Do not edit.\n",
                     SYMM_VERSION, i);
            cr_assert(strncmp(data, want, strlen(want)) == 0, "%s starts: %.120s", rel, data);
            FMT(line, "\n *   max_tokens     %d\n", tokens);
            char *end = strstr(data, " */\n");
            cr_assert(end && strstr(data, line) && strstr(data, line) < end, "%s: no %s in the header", rel, line);
            free(data);
        }
        char key[64];
        FMT(key, "\"name\": \"v%d\"", i);
        char want[64];
        FMT(want, "\"max_tokens\": %d,", tokens);
        const char *obj = strstr(manifest, key);
        cr_assert(obj && strstr(obj, want), "manifest lacks %s for v%d", want, i);
    }
    free(manifest);
    result_free(&r);
}

Test(cli, generated_c_of_the_default_spec_compiles_cleanly)
{
    char spec[PATH_MAX + 32];
    FMT(spec, "%s/specs/default.lua", repo);
    result r = RUN("-q", "-o", "gen", spec);
    cr_assert_eq(r.status, 0, "%s", r.err);
    result_free(&r);
    char cmd[4 * PATH_MAX + 256];
    snprintf(cmd, sizeof cmd,
             "cd %s/gen && gcc -std=c11 -Wall -Wextra -Werror -I%s/runtime/include -I/usr/local/cuda/include -c *.c",
             work, repo);
    cr_assert_eq(system(cmd), 0, "the generated C does not compile cleanly");
    char gen[PATH_MAX];
    FMT(gen, "%s/gen", work);
    DIR *d = opendir(gen);
    int c_files = 0, objects = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        c_files += len > 2 && strcmp(e->d_name + len - 2, ".c") == 0;
        objects += len > 2 && strcmp(e->d_name + len - 2, ".o") == 0;
    }
    closedir(d);
    cr_assert(c_files > 0 && objects == c_files, "%d .c files, %d objects", c_files, objects);
}

/* A shell command in the work directory; its exit status. */
static int sh_at(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh_at(const char *fmt, ...)
{
    char cmd[8192];
    int n = snprintf(cmd, sizeof cmd, "cd %s && ", work);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(cmd + n, sizeof cmd - (size_t)n, fmt, ap);
    va_end(ap);
    cr_assert(m > 0 && (size_t)(n + m) < sizeof cmd, "command too long");
    return system(cmd);
}

static const char *cuda_home(void)
{
    const char *c = getenv("CUDA_HOME");
    return c && *c ? c : "/usr/local/cuda";
}

/* The stub of each variant declares what that variant takes and gives, with
 * its types: dispatch has x_scales only with fp8 dispatch and topk_weights
 * only with weights; NAME_recv_t has only the members the variant fills,
 * each typed. _Generic checks every signature and member type; each member
 * or argument a variant lacks must fail to compile. */
Test(cli, typed_stubs_declare_only_what_each_variant_has)
{
    write_at("s.lua",
             "layout { name = 'r', hidden = 1024, topk = 2, experts = 8, world = 2, max_tokens = 64 }\n"
             "layout { name = 'e', hidden = 1024, topk = 4, experts = 16, world = 4, max_tokens = 64,\n"
             "         layout = 'expert', align = 64, dtype = 'fp8_e4m3', weights = false }\n"
             "layout { name = 'p', hidden = 512, topk = 2, experts = 8, world = 2, max_tokens = 32,\n"
             "         dtype = 'fp16', combine = 'pull' }\n"
             "layout { name = 'f', hidden = 256, topk = 2, experts = 8, world = 2, max_tokens = 32,\n"
             "         layout = 'expert', dtype = 'fp32', combine_dtype = 'bf16' }\n");
    result r = RUN("-q", "-o", "gen", "s.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    result_free(&r);
    write_at("gen/types.c",
             "#include \"r.h\"\n#include \"e.h\"\n#include \"p.h\"\n#include \"f.h\"\n"
             "#define IS(x, T) _Generic((x), T: 1, default: 0)\n"
             "#define CHECK(x, T) _Static_assert(IS(x, T), #x \" is not \" #T)\n"
             "CHECK(&r_dispatch, symm_status (*)(r *, int, const int32_t *, const r_x_t *, const int32_t *,\n"
             "                                   const float *, CUstream));\n"
             "CHECK(&e_dispatch, symm_status (*)(e *, int, const int32_t *, const e_x_t *, const float *,\n"
             "                                   const int32_t *, CUstream));\n"
             "CHECK(&p_dispatch, symm_status (*)(p *, int, const int32_t *, const p_x_t *, const int32_t *,\n"
             "                                   const float *, CUstream));\n"
             "CHECK(&r_recv, symm_status (*)(const r *, r_recv_t *));\n"
             "CHECK(&r_combine, symm_status (*)(r *, const r_y_t *, r_y_t *, CUstream));\n"
             "CHECK(&f_profile, symm_status (*)(f *, CUstream, symm_variant_profile *));\n"
             "CHECK(&f_stats, symm_status (*)(f *, CUstream, symm_variant_stats *));\n"
             "CHECK(&f_describe, const symm_variant_desc *(*)(const f *));\n"
             "static r_recv_t rr; static e_recv_t er; static p_recv_t pr; static f_recv_t fr;\n"
             "CHECK(rr.x, uint16_t *); CHECK(er.x, uint8_t *); CHECK(pr.x, uint16_t *); CHECK(fr.x, float *);\n"
             "CHECK(rr.src, const int32_t *); CHECK(rr.topk_idx, const int32_t *); CHECK(rr.weights, const float *);\n"
             "CHECK(rr.expert_count, const int32_t *); CHECK(rr.rows, const int32_t *);\n"
             "CHECK(er.scales, const float *); CHECK(er.expert_offset, const int32_t *);\n"
             "CHECK(pr.y, p_y_t *); CHECK(fr.weights, const float *);\n"
             "int types_checked(void) { return (int)sizeof rr + (int)sizeof er + (int)sizeof pr + (int)sizeof fr; }\n");
    const char *cc = "gcc -std=c11 -Wall -Wextra -Werror -Wno-unused-variable";
    cr_assert_eq(sh_at("cd gen && %s -I%s/runtime/include -I%s/include -c types.c r.c e.c p.c f.c", cc, repo,
                       cuda_home()),
                 0, "the typed stubs do not have the expected types");
    /* What a variant lacks. */
    static const char *const lacking[] = {
        "r_recv_t b; (void)b.scales;",        "r_recv_t b; (void)b.expert_offset;",
        "r_recv_t b; (void)b.y;",             "e_recv_t b; (void)b.topk_idx;",
        "e_recv_t b; (void)b.weights;",       "f_recv_t b; (void)b.topk_idx;",
        "(void)r_dispatch(0, 0, 0, 0, 0, 0, 0, 0);", /* with x_scales */
        "(void)e_dispatch(0, 0, 0, 0, 0, 0, 0, 0);", /* with topk_weights */
    };
    for (size_t i = 0; i < sizeof lacking / sizeof lacking[0]; i++) {
        char text[512];
        FMT(text, "#include \"r.h\"\n#include \"e.h\"\n#include \"f.h\"\nvoid lacking(void) { %s }\n", lacking[i]);
        write_at("gen/lacking.c", text);
        cr_assert_neq(sh_at("cd gen && %s -I%s/runtime/include -I%s/include -c lacking.c 2>/dev/null", cc, repo,
                            cuda_home()),
                      0, "compiled, but the variant lacks it: %s", lacking[i]);
    }
}

/* The stubs link with libsymm and their wrappers reach the runtime, which
 * says what is wrong, without a GPU. */
Test(cli, typed_stubs_link_and_report_through_the_runtime)
{
    write_at("s.lua", "layout { name = 'r', hidden = 1024, topk = 2, experts = 8, world = 2, max_tokens = 64 }\n");
    result r = RUN("-q", "-o", "gen", "s.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    result_free(&r);
    write_at("gen/main.c",
             "#include <stdio.h>\n#include <string.h>\n#include \"r.h\"\n"
             "#define EXPECT(c) do { if (!(c)) { printf(\"%s\\n%s\\n\", #c, symm_last_error()); return 1; } } while (0)\n"
             "int main(void)\n{\n"
             "    r_recv_t rb;\n    symm_variant_profile prof;\n"
             "    EXPECT(r_desc()->hidden == R_HIDDEN && r_desc()->layout == SYMM_LAYOUT_RANK);\n"
             "    EXPECT(r_describe(NULL) == NULL);\n"
             "    EXPECT(r_recv(NULL, &rb) == SYMM_ERR_INVALID_ARG && strstr(symm_last_error(), \"variant is NULL\"));\n"
             "    EXPECT(r_profile(NULL, NULL, &prof) == SYMM_ERR_INVALID_ARG);\n"
             "    EXPECT(r_stats(NULL, NULL, NULL) == SYMM_ERR_INVALID_ARG);\n"
             "    EXPECT(r_create(NULL, NULL, NULL) == SYMM_ERR_INVALID_ARG);\n"
             "    EXPECT(r_destroy(NULL) == SYMM_OK);\n"
             "    return 0;\n}\n");
    char lib[PATH_MAX];
    FMT(lib, "%s", symmgen);
    *strrchr(lib, '/') = '\0';
    *strrchr(lib, '/') = '\0';
    cr_assert_eq(sh_at("cd gen && gcc -std=c11 -Wall -Wextra -Werror " SAN_FLAGS " -I%s/runtime/include -I%s/include "
                       "main.c r.c %s/lib/libsymm.a -ldl -lpthread -lm -o main && ./main",
                       repo, cuda_home(), lib),
                 0, "the stub's wrappers did not report as expected");
}

/* The README's example compiles as written: its spec's variant is
 * generated, and its C block compiles with every warning an error. */
Test(cli, readme_example_compiles_as_written)
{
    char path[PATH_MAX + 16];
    FMT(path, "%s/README.md", repo);
    char *readme = read_file(path, NULL);
    cr_assert(readme, "%s", path);
    const char *lua = strstr(readme, "```lua\n"), *c = strstr(readme, "```c\n");
    cr_assert(lua && c, "README.md has no ```lua or no ```c block");
    lua += strlen("```lua\n");
    c += strlen("```c\n");
    const char *lua_end = strstr(lua, "```"), *c_end = strstr(c, "```");
    cr_assert(lua_end && c_end);
    char *spec = strndup(lua, (size_t)(lua_end - lua)), *code = strndup(c, (size_t)(c_end - c));
    write_at("readme.lua", spec);
    write_at("readme.c", code);
    result r = RUN("-q", "-o", "gen", "readme.lua");
    cr_assert_eq(r.status, 0, "the README's spec: %s", r.err);
    result_free(&r);
    cr_assert_eq(sh_at("gcc -std=c11 -Wall -Wextra -Werror -Igen -I%s/runtime/include -I%s/include -c readme.c "
                       "gen/*.c",
                       repo, cuda_home()),
                 0, "the README's C example does not compile:\n%s", code);
    free(spec);
    free(code);
    free(readme);
}

/* Names whose generated C would not compile (the headers of the stub
 * declare them) are refused; names next to them are accepted, and their
 * headers compile together, in C and C++. */
Test(cli, reserved_names_are_refused_and_near_misses_compile_together)
{
    static const char *const reserved[] = {"int32_t", "size_t", "uint16_t", "CUstream", "NULL", "free", "cuInit",
                                           "INT8_MAX", "_x"};
    static const char *const near[] = {"int32", "sizes", "Null", "Free", "Cu", "stream", "t_", "x_", "cUx",
                                       "Uint16", "nul", "malloc_"};
    const char *bad = reserved[rnd() % (sizeof reserved / sizeof reserved[0])];
    sg_buf spec = {0};
    variant_line(&spec, bad, rnd_in(1, 64));
    write_at("bad.lua", spec.data);
    result r = RUN("bad.lua");
    char want[128];
    FMT(want, "variant %s: field name: got \"%s\", expected a name that ", bad, bad);
    cr_assert(r.status == 1 && strstr(r.err, want), "name %s: exit %d, expected 1 with \"%s\": %s", bad,
              r.status, want, r.err);
    cr_assert(!exists_at("out"), "a refused name wrote out/");
    result_free(&r);

    spec.len = 0;
    int n = rnd_in(3, 6), first = rnd_in(0, 11);
    for (int i = 0; i < n; i++)
        variant_line(&spec, near[(first + i) % 12], rnd_in(1, 64));
    write_at("near.lua", spec.data);
    r = RUN("-q", "-o", "gen", "near.lua");
    cr_assert_eq(r.status, 0, "near misses were refused: %s", r.err);
    result_free(&r);
    sg_buf all = {0};
    for (int i = 0; i < n; i++)
        sg_buf_printf(&all, "#include \"%s.h\"\n", near[(first + i) % 12]);
    write_at("gen/all.c", all.data);
    write_at("gen/all.cc", all.data);
    char cmd[4 * PATH_MAX + 512];
    FMT(cmd, "cd %s/gen && gcc -std=c11 -Wall -Wextra -Werror -I%s/runtime/include -I/usr/local/cuda/include -c *.c && "
             "gcc -std=gnu11 -D_GNU_SOURCE -Wall -Werror -I%s/runtime/include -I/usr/local/cuda/include -c all.c && "
             "g++ -std=c++17 -D_GNU_SOURCE -Wall -Werror -I%s/runtime/include -I/usr/local/cuda/include -c all.cc",
        work, repo, repo, repo);
    cr_assert_eq(system(cmd), 0, "the C of variants named %s... does not compile: %s", near[first], cmd);
    sg_buf_free(&all);
    sg_buf_free(&spec);
}

/* make test QUICK=1 (SYMM_TEST_QUICK=1), the developer's loop: the tests
 * that NVRTC-compile specs compile a few variants instead of all (the full
 * run, which CI makes, compiles every variant of every spec once). */
static bool quick(void)
{
    const char *q = getenv("SYMM_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

/* Under the sanitizers and with QUICK=1 a small spec with one variant of
 * each layout and an fp8 one stands in for the default spec's. */
Test(cli, compile_of_the_default_spec_reports_a_time_per_variant)
{
    wf_watchdog(300);
    char spec[PATH_MAX + 32];
    if (sanitized || quick()) {
        write_at("small.lua",
                 "layout { name = 'r', hidden = 1024, topk = 2, experts = 8, world = 2, max_tokens = 64 }\n"
                 "layout { name = 'e', hidden = 1024, topk = 2, experts = 8, world = 4, max_tokens = 64,\n"
                 "         layout = 'expert', align = 64, dtype = 'fp8_e4m3' }\n");
        FMT(spec, "%s/small.lua", work);
    } else {
        FMT(spec, "%s/specs/default.lua", repo);
    }
    result list = RUN("--list", spec);
    cr_assert_eq(list.status, 0);
    result r = RUN("--compile", spec);
    cr_assert_eq(r.status, 0, "status %d: %s", r.status, r.err);
    int variants = 0, both_forms = 0;
    for (char *line = list.out, *nl; (nl = strchr(line, '\n')); line = nl + 1, variants++) {
        char name[SG_NAME_MAX + 1], want[SG_NAME_MAX + 64];
        FMT(name, "%.*s", (int)strcspn(line, " "), line);
        FMT(want, "compiled %s for sm_90a in ", name);
        const char *at = strstr(r.err, want);
        cr_assert(at, "no compile time for %s: %s", name, r.err);
        /* Each program the runtime compiles, with its own time: with
         * combine = "auto" a fourth, the pulling combine. */
        double total, part[4] = {0};
        int used = 0;
        cr_assert_eq(sscanf(at + strlen(want), "%lf ms (dispatch %lf, combine %lf, NCCL and hybrid backends %lf%n",
                            &total, &part[0], &part[1], &part[2], &used),
                     4, "%s", at);
        const char *rest = at + strlen(want) + used;
        const bool pulling = sscanf(rest, ", pulling combine %lf ms)\n", &part[3]) == 1;
        cr_assert(pulling || strncmp(rest, " ms)\n", 5) == 0, "%s: %s", name, at);
        both_forms += pulling;
        cr_assert(part[0] > 0 && part[1] > 0 && part[2] > 0 && (!pulling || part[3] > 0) &&
                      fabs(total - part[0] - part[1] - part[2] - part[3]) < 3,
                  "%s: %g ms in all, parts %g %g %g %g", name, total, part[0], part[1], part[2], part[3]);
    }
    /* The default spec has combines of both forms (combine = "auto"). */
    cr_assert(both_forms > 0 || sanitized || quick(), "no variant with a pulling combine program: %s", r.err);
    char total[64];
    FMT(total, "compiled %d variants for sm_90a in ", variants);
    cr_assert(strstr(r.err, total), "no total: %s", r.err);
    FMT(total, "%d programs over ", 3 * variants + both_forms);
    cr_assert(strstr(r.err, total), "not 3 programs a variant (4 with combine = \"auto\"): %s", r.err);
    cr_assert(!strstr(r.err, "warning"), "NVRTC warns: %s", r.err);
    cr_assert(exists_at("out/default/manifest.json") || exists_at("out/small/manifest.json"));
    printf("symmgen --compile: %d variants in %.0f ms\n", variants, r.ms);
    result_free(&r);
    result_free(&list);
}

/* A guard against a generator grown ten times slower: the limit leaves room
 * for a loaded machine and the sanitizers. The goal of 1 s for 100 variants
 * is measured quietly by scripts/bench-gen.sh (bench/RESULTS.md). */
#define HUNDRED_VARIANTS_LIMIT_MS 10000

Test(cli, a_hundred_variants_generate_quickly)
{
    write_at("many.lua",
             "local dtypes = { 'bf16', 'fp16', 'fp32', 'fp8_e4m3' }\n"
             "for i = 1, 100 do\n"
             "  local w = ({ 2, 4, 8 })[1 + i % 3]\n"
             "  layout { name = 'v' .. i, hidden = 1024 * (1 + i % 7), topk = 1 + i % 8, experts = 8 * w,\n"
             "           world = w, max_tokens = 64 + i, dtype = dtypes[1 + i % 4],\n"
             "           layout = (i % 2 == 0) and 'rank' or 'expert' }\n"
             "end\n");
    result r = RUN("-q", "many.lua");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(exists_at("out/many/v100.c"));
    printf("symmgen: 100 variants generated in %.0f ms (limit %d ms)\n", r.ms, HUNDRED_VARIANTS_LIMIT_MS);
    cr_assert(r.ms < HUNDRED_VARIANTS_LIMIT_MS, "100 variants took %.0f ms, the limit is %d ms", r.ms,
              HUNDRED_VARIANTS_LIMIT_MS);
    result_free(&r);
}

/* A separate -D argument is read as a whole: an unknown field in it is a
 * usage error with a suggestion, not one about a missing value. */
Test(cli, separate_d_argument_with_unknown_field_suggests_the_field)
{
    write_spec("s.lua", "v", 1);
    char define[64];
    FMT(define, "hiden=%d", rnd_in(1, 9) * 16);
    result r = RUN("--check", "-D", define, "s.lua");
    cr_assert_eq(r.status, 2, "exit %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "did you mean \"hidden\"") && strstr(r.err, "symmgen --help"), "stderr: %s", r.err);
    result_free(&r);
}

/* A -D that no spec can make right (an unknown field, a value of the wrong
 * type or range) is a usage error (exit 2), reported once however many specs
 * and variants there are, before any spec runs; its text is escaped. */
Test(cli, bad_define_is_a_usage_error_reported_once)
{
    int n = rnd_in(2, 6);
    write_spec("s.lua", "v", n);
    write_spec("t.lua", "w", n);
    write_at("never.lua", "error(\"this spec must not run\")\n");
    static const char *const defines[][2] = {
        {"frob=1", "-D frob=1: unknown field"},
        {"topk=99", "-D topk=99: got 99, expected 1..16"},
        {"combine=pul", "-D combine=pul: got \"pul\", expected \"push\", \"pull\" or \"auto\""},
        {"dtype=\x1b[31mred", "-D dtype=\\x1b[31mred: got \"\\x1b[31mred\", expected"},
    };
    size_t k = (size_t)rnd_in(0, 3);
    result r = RUN("--check", "-D", defines[k][0], "s.lua", "t.lua", "never.lua");
    cr_assert_eq(r.status, 2, "-D %s: exit %d: %s", defines[k][0], r.status, r.err);
    const char *at = strstr(r.err, defines[k][1]);
    cr_assert(at, "-D %s: stderr lacks %s: %s", defines[k][0], defines[k][1], r.err);
    cr_assert(!strstr(at + 1, defines[k][1]), "-D %s reported more than once: %s", defines[k][0], r.err);
    cr_assert(!strstr(r.err, "must not run") && !strchr(r.err, '\x1b'), "stderr: %s", r.err);
    result_free(&r);
}

/* symmgen --check --compile of spec (a path) passes, with a total for all
 * its variants and no warning. */
static void expect_compiles(const char *spec, const char *label)
{
    result list = RUN("--list", spec);
    cr_assert_eq(list.status, 0, "%s: %s", label, list.err);
    int variants = 0;
    for (const char *p = list.out; (p = strchr(p, '\n')); p++)
        variants++;
    result r = RUN("--check", "--compile", spec);
    cr_assert_eq(r.status, 0, "%s: status %d: %s", label, r.status, r.err);
    char total[64];
    FMT(total, "compiled %d variants for sm_90a in ", variants);
    cr_assert(variants > 0 && strstr(r.err, total), "%s: %s", label, r.err);
    /* Warnings are errors, in the kernels we generate too. */
    cr_assert(!strstr(r.err, "warning"), "%s: NVRTC warns: %s", label, r.err);
    printf("symmgen --check --compile %s: %d variants in %.0f ms\n", label, variants, r.ms);
    result_free(&r);
    result_free(&list);
}

/* A spec of one variant per kind of kernel among every variant of every
 * spec in specs/: per (layout, dtype, combine_dtype, weights, combine), the
 * first such variant, with all its fields (QUICK=1). */
static void write_one_per_kernel_kind(const char *dir, const char *rel)
{
    sg_buf spec = {0}, kinds = {0};
    sg_buf_puts(&kinds, "\n");
    DIR *d = opendir(dir);
    cr_assert(d, "opendir %s", dir);
    int count = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".lua") != 0)
            continue;
        char path[PATH_MAX + 300];
        FMT(path, "%s/%s", dir, e->d_name);
        result r = RUN("--list", "--json", path);
        cr_assert_eq(r.status, 0, "%s: %s", e->d_name, r.err);
        symm_json_doc *doc = NULL;
        int line, col;
        char why[128];
        cr_assert_eq(symm_json_parse(r.out, strlen(r.out), &doc, &line, &col, why, sizeof why), SYMM_JSON_OK,
                     "%s --list --json: %d:%d: %s", e->d_name, line, col, why);
        for (const symm_json *v = symm_json_root(doc)->first; v; v = v->next) {
#define FIELD(name) symm_json_member(v, name, NULL)
            char kind[256];
            FMT(kind, "\n%s %s %s %d %s\n", FIELD("layout")->str, FIELD("dtype")->str, FIELD("combine_dtype")->str,
                FIELD("weights")->boolean, FIELD("combine")->str);
            if (strstr(kinds.data, kind))
                continue;
            sg_buf_puts(&kinds, kind + 1);
            sg_buf_printf(&spec,
                          "layout { name = 'k%d', hidden = %lld, topk = %lld, experts = %lld, world = %lld,\n"
                          "         max_tokens = %lld, dtype = '%s', combine_dtype = '%s', layout = '%s',\n"
                          "         weights = %s, combine = '%s', capacity = %lld, align = %lld, sms = %lld }\n",
                          count++, (long long)FIELD("hidden")->integer, (long long)FIELD("topk")->integer,
                          (long long)FIELD("experts")->integer, (long long)FIELD("world")->integer,
                          (long long)FIELD("max_tokens")->integer, FIELD("dtype")->str, FIELD("combine_dtype")->str,
                          FIELD("layout")->str, FIELD("weights")->boolean ? "true" : "false", FIELD("combine")->str,
                          (long long)FIELD("capacity")->integer, (long long)FIELD("align")->integer,
                          (long long)FIELD("sms")->integer);
#undef FIELD
        }
        symm_json_free(doc);
        result_free(&r);
    }
    closedir(d);
    cr_assert(count >= 8, "only %d kinds of kernel in %s", count, dir);
    write_at(rel, spec.data);
    sg_buf_free(&spec);
    sg_buf_free(&kinds);
}

/* Every variant of every spec we ship NVRTC-compiles for sm_90a (NVRTC needs
 * no GPU), each once: default.lua's are compiled by
 * compile_of_the_default_spec_reports_a_time_per_variant. --check --compile
 * writes nothing. Under the sanitizers, where NVRTC runs several times
 * slower, one spec stands for all: the plain build of the same CI run
 * compiles them all. With QUICK=1, one variant of each kind of kernel. */
Test(cli, every_variant_of_every_spec_in_specs_compiles)
{
    wf_watchdog(1200);
    char dir[PATH_MAX + 16];
    FMT(dir, "%s/specs", repo);
    if (quick()) {
        write_one_per_kernel_kind(dir, "kinds.lua");
        char spec[PATH_MAX + 16];
        FMT(spec, "%s/kinds.lua", work);
        expect_compiles(spec, "one variant per kind of kernel in specs/");
        return;
    }
    DIR *d = opendir(dir);
    cr_assert(d, "opendir %s", dir);
    int specs = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".lua") != 0)
            continue;
        if (sanitized ? strcmp(e->d_name, "worlds.lua") != 0 : strcmp(e->d_name, "default.lua") == 0)
            continue;
        char spec[PATH_MAX + 300];
        FMT(spec, "%s/%s", dir, e->d_name);
        expect_compiles(spec, e->d_name);
        specs++;
    }
    closedir(d);
    cr_assert(specs >= 1);
}

/* The largest capacities compile: dispatch's word per token holds a row
 * and how many follow, capacity x min(topk, experts/world) within int32
 * (generator/spec.c), and at that bound the variant compiles: world 8,
 * top-16 of 128 experts, a worst case of 134217600 rows at max_tokens
 * 2^20 - 1, and a capacity set to 2^27 - 1 (int32 / 16) at max_tokens 2^20
 * (whose worst case, 2^27 rows, would not fit). Both with DEDUP. */
Test(cli, layout_expert_at_the_largest_capacities_compiles)
{
    wf_watchdog(600);
    write_at("big.lua", "layout { name = 'big_expert', hidden = 64, topk = 16, experts = 128, world = 8,\n"
                        "         max_tokens = 1048575, dtype = 'bf16', layout = 'expert' }\n"
                        "layout { name = 'below_expert', hidden = 64, topk = 16, experts = 128, world = 8,\n"
                        "         max_tokens = 1048576, dtype = 'bf16', layout = 'expert',\n"
                        "         capacity = 134217727 }\n");
    char spec[PATH_MAX + 16];
    FMT(spec, "%s/big.lua", work);
    result list = RUN("--list", "--json", spec);
    cr_assert_eq(list.status, 0, "%s", list.err);
    cr_assert((strstr(list.out, "\"capacity\":134217600") || strstr(list.out, "\"capacity\": 134217600")) &&
                  (strstr(list.out, "\"capacity\":134217727") || strstr(list.out, "\"capacity\": 134217727")),
              "the capacities are not 134217600 and 2^27 - 1: %s", list.out);
    result_free(&list);
    expect_compiles(spec, "layout expert at capacities 134217600 and 2^27 - 1");
}
