/* test_emit.c: symmgen's output machinery without the command line: template
 * expansion ({{holes}}, #line numbering checked through NVRTC), the C array
 * that carries the CUDA source (round trip through gcc), SHA-256, and the
 * all-or-nothing output directory (sg_output_write), compile failures
 * included. Templates here are small fixtures, not templates/. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nvrtc.h>

#include "json.h"
#include "moe_inputs.h"
#include "sg.h"
#include "sha256.h"
#include "world_fork.h"

/* ---- helpers ------------------------------------------------------------ */

/* snprintf into an array, failing the test rather than truncating. */
#define FMT(buf, ...) cr_assert(snprintf(buf, sizeof buf, __VA_ARGS__) < (int)sizeof buf, "%s: too long", #buf)

static char tmp_root[PATH_MAX];
static moe_rng rng; /* fresh each test */

static uint32_t rnd(void) { return (uint32_t)(moe_rng_next(&rng) >> 32); }

static int rnd_in(int lo, int hi) { return lo + moe_rng_int(&rng, hi - lo + 1); }

static void setup(void)
{
    wf_random(&rng.s, sizeof rng.s);
    FMT(tmp_root, "/tmp/sg-emit-XXXXXX");
    cr_assert(mkdtemp(tmp_root) != NULL, "mkdtemp: %s", strerror(errno));
}

static void teardown(void)
{
    wf_rmtree(tmp_root);
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
    *len = b.len;
    return b.data;
}

static void write_text(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f != NULL, "fopen %s: %s", path, strerror(errno));
    cr_assert(fwrite(data, 1, len, f) == len);
    cr_assert(fclose(f) == 0);
}

/* Every entry under dir (sorted "name size mode sha" lines), to compare trees
 * byte for byte. */
static void snapshot(const char *dir, sg_buf *out)
{
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    cr_assert(n >= 0, "scandir %s: %s", dir, strerror(errno));
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
            sg_buf_printf(out, "%s %lld %o %s\n", names[i]->d_name, (long long)st.st_size,
                          (unsigned)st.st_mode, hex);
            if (S_ISDIR(st.st_mode))
                snapshot(path, out);
        }
        free(names[i]);
    }
    free(names);
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert(d != NULL, "opendir %s", dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static void random_variant(sg_variant *v, int index)
{
    static const int worlds[] = {2, 4, 8};
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "v%d_%u", index, rnd() % 100000);
    v->line = rnd_in(1, 500);
    v->world = worlds[rnd() % 3];
    v->experts = v->world * rnd_in(1, 8);
    v->topk = rnd_in(1, v->experts < 8 ? v->experts : 8);
    v->hidden = 128 * rnd_in(1, 16);
    v->max_tokens = rnd_in(1, 512);
    v->dtype = (symm_dtype)rnd_in(0, 3);
    v->combine_dtype = (symm_dtype)rnd_in(0, 2);
    v->layout = (symm_layout)rnd_in(0, 1);
    v->weights = rnd() & 1;
    v->align = v->layout == SYMM_LAYOUT_EXPERT ? 1 << rnd_in(0, 7) : 1;
    v->sms = rnd_in(1, 32);
    v->capacity = sg_worst_capacity(v);
}

/* ---- expansion ---------------------------------------------------------- */

TestSuite(expand, .init = setup, .fini = teardown);

Test(expand, holes_take_their_values_and_other_braces_stay)
{
    char a[32], b[32];
    FMT(a, "%u", rnd());
    FMT(b, "x%u", rnd());
    sg_vars vars = {0};
    sg_vars_set(&vars, "A", "%s", a);
    sg_vars_set(&vars, "B_2", "%s", b);
    const char text[] = "int a = {{A}};\nint m[1][1] = {{1}}; // {{lower}} {{A {{ }}\n{{B_2}}{{A}}{{{A}}}";
    sg_template t = {"templates/x.in", text, sizeof text - 1};
    sg_buf out = {0};
    sg_diag diag = {0};
    cr_assert_eq(sg_expand(&t, &vars, true, &out, &diag), SG_EXIT_OK);
    char want[256];
    FMT(want, "int a = %s;\nint m[1][1] = {{1}}; // {{lower}} {{A {{ }}\n%s%s{%s}", a, b, a, a);
    cr_assert_str_eq(out.data, want, "expanded:\n%s\nwanted:\n%s", out.data, want);
    cr_assert_eq(diag.count, 0);
    sg_buf_free(&out);
    sg_vars_free(&vars);
}

Test(expand, unknown_hole_is_an_internal_error_naming_template_and_line)
{
    int line = rnd_in(1, 40);
    sg_buf text = {0};
    for (int i = 1; i < line; i++)
        sg_buf_printf(&text, "// line %d {{KNOWN}}\n", i);
    sg_buf_puts(&text, "int x = {{MISSING_ONE}};\n// after\n");
    sg_vars vars = {0};
    sg_vars_set(&vars, "KNOWN", "%d", line);
    sg_template t = {"templates/fixture.cu.in", text.data, text.len};
    sg_buf out = {0};
    sg_diag diag = {0};
    cr_assert_eq(sg_expand(&t, &vars, false, &out, &diag), SG_EXIT_INTERNAL);
    cr_assert_eq(diag.count, 1);
    char want[128];
    FMT(want, "internal error: templates/fixture.cu.in:%d: hole {{MISSING_ONE}}", line);
    cr_assert(strstr(diag.messages[0], want), "message \"%s\" lacks \"%s\"", diag.messages[0], want);
    sg_diag_free(&diag);
    sg_buf_free(&out);
    sg_buf_free(&text);
    sg_vars_free(&vars);
}

/* A template of random plain lines, one-line holes and multi-line holes (one
 * inside a continued macro), with a deliberate error at a known line: NVRTC
 * must report that template line. */
Test(expand, line_directives_make_nvrtc_name_the_template_line)
{
    for (int round = 0; round < 3; round++) {
        sg_buf text = {0}, out = {0};
        sg_vars vars = {0};
        sg_diag diag = {0};
        sg_buf_puts(&text, "{{HEADER}}\n");
        sg_vars_set(&vars, "HEADER", "/* fixture\n * header %u\n */", rnd());
        int line = 2, lines_before_error = rnd_in(2, 12), holes = 0;
        for (int i = 0; i < lines_before_error; i++, line++) {
            int kind = rnd_in(0, 3);
            if (kind == 0) {
                sg_buf_printf(&text, "// plain line %d\n", line);
            } else if (kind == 1) {
                sg_buf_printf(&text, "constexpr int c%d = {{ONE_%d}};\n", line, holes);
                char name[16];
                FMT(name, "ONE_%d", holes++);
                sg_vars_set(&vars, strdup(name), "%u", rnd() % 1000);
            } else if (kind == 2) {
                sg_buf_printf(&text, "{{BLOCK_%d}}\n", holes);
                char name[16];
                FMT(name, "BLOCK_%d", holes++);
                sg_buf value = {0};
                int n = rnd_in(2, 9);
                for (int k = 0; k < n; k++)
                    sg_buf_printf(&value, "%sconstexpr int b%d_%d = %d;", k ? "\n" : "", line, k, k);
                sg_vars_set(&vars, strdup(name), "%s", value.data);
                sg_buf_free(&value);
            } else {
                /* A multi-line value inside a macro: the #line must wait for
                 * the macro's end. */
                sg_buf_printf(&text, "#define SUM%d (0 \\\n  {{TERMS_%d}} \\\n  )\n", line, holes);
                char name[16];
                FMT(name, "TERMS_%d", holes++);
                sg_vars_set(&vars, strdup(name), "+ 1 \\\n  + 2 \\\n  + %d", rnd_in(3, 9));
                line += 2;
            }
        }
        sg_buf_printf(&text, "__global__ void broken() { int x = ; }\n// tail\n");
        sg_template t = {"templates/fixture.cu.in", text.data, text.len};
        cr_assert_eq(sg_expand(&t, &vars, true, &out, &diag), SG_EXIT_OK);

        double ms;
        char *log = NULL;
        cr_assert_eq(sg_nvrtc_compile("fixture.cu", out.data, out.len, "sm_90a", 0, &ms, &log), -1,
                     "the broken fixture compiled:\n%s", out.data);
        char want[64];
        FMT(want, "templates/fixture.cu.in(%d): error", line);
        cr_assert(log && strstr(log, want), "NVRTC log does not name line %d:\n%s\n--- expanded:\n%s\n--- template:\n%s",
                  line, log ? log : "(none)", out.data, text.data);
        free(log);
        for (size_t i = 0; i < vars.count; i++)
            if (strcmp(vars.items[i].name, "HEADER"))
                free((char *)vars.items[i].name);
        sg_vars_free(&vars);
        sg_buf_free(&text);
        sg_buf_free(&out);
    }
}

Test(expand, one_line_values_add_no_line_directive)
{
    sg_vars vars = {0};
    sg_vars_set(&vars, "X", "%u", rnd());
    const char text[] = "a {{X}}\nb {{X}}\n";
    sg_template t = {"templates/x.in", text, sizeof text - 1};
    sg_buf out = {0};
    sg_diag diag = {0};
    cr_assert_eq(sg_expand(&t, &vars, true, &out, &diag), SG_EXIT_OK);
    cr_assert_null(strstr(out.data, "#line"), "%s", out.data);
    sg_buf_free(&out);
    sg_vars_free(&vars);
}

/* ---- the C array carrying the source ------------------------------------ */

/* Compile a program printing the array, run it, compare with data. */
static void round_trip(const char *data, size_t len, const char *compiler)
{
    sg_buf c = {0};
    sg_buf_puts(&c, "#include <stdio.h>\n");
    sg_c_source_array("payload_source", data, len, &c);
    sg_buf_printf(&c, "\n_Static_assert(sizeof payload_source == %zuu + 1, \"length\");\n"
                      "int main(void) { fwrite(payload_source, 1, sizeof payload_source - 1, stdout);"
                      " return payload_source[sizeof payload_source - 1]; }\n", len);
    char src[PATH_MAX], exe[PATH_MAX], got_path[PATH_MAX], cmd[4 * PATH_MAX];
    FMT(src, "%s/payload.c", tmp_root);
    FMT(exe, "%s/payload", tmp_root);
    FMT(got_path, "%s/payload.out", tmp_root);
    write_text(src, c.data, c.len);
    FMT(cmd, "%s -std=c11 -pedantic -Wall -Wextra -Werror %s -o %s", compiler, src, exe);
    int rc = system(cmd);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s failed on the generated array", compiler);
    FMT(cmd, "%s > %s", exe, got_path);
    rc = system(cmd);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "the array is not NUL-terminated");
    size_t got_len;
    char *got = read_file(got_path, &got_len);
    cr_assert_eq(got_len, len, "%s: %zu bytes back, %zu in", compiler, got_len, len);
    cr_assert(memcmp(got, data, len) == 0, "%s: the bytes differ", compiler);
    free(got);
    sg_buf_free(&c);
}

Test(source_array, every_byte_survives_gcc_and_clang_with_pedantic, .init = setup,
     .fini = teardown)
{
    /* Bytes that need care, densely: quotes, backslashes, trigraph starts,
     * octal escapes followed by digits, NUL, high bytes; and lines longer than
     * one literal. */
    static const char tricky[] = "\"\\?\?/?\?=?\?'?\0" "0123\n\t\r\x7f\x80\xff{}%";
    size_t len = 20000 + rnd() % 20000;
    char *data = malloc(len);
    for (size_t i = 0; i < len; i++) {
        uint32_t r = rnd();
        data[i] = (r & 3) ? tricky[(r >> 2) % (sizeof tricky - 1)] : (char)(r >> 8);
    }
    memset(data + len / 2, 'x', 9000); /* one line of 9000 bytes */
    round_trip(data, len, "gcc");
    if (system("clang --version > /dev/null 2>&1") == 0)
        round_trip(data, len, "clang");
    round_trip("", 0, "gcc");
    free(data);
}

/* ---- generating a variant with fixture templates ------------------------ */

static const char fixture_cu[] =
    "{{HEADER}}\n"
    "constexpr int HIDDEN = {{HIDDEN}};\n"
    "__global__ void k_{{NAME}}(float *p) { p[threadIdx.x] = HIDDEN; }\n";
static const char fixture_h[] = "{{HEADER}}\n#include <stddef.h>\nextern const size_t {{NAME}}_len;\n";
static const char fixture_c[] =
    "{{HEADER}}\n"
    "#include <stdio.h>\n"
    "{{CUDA_SOURCE}}\n"
    "const size_t {{NAME}}_len = {{CUDA_SOURCE_LEN}};\n"
    "const char {{NAME}}_sha[] = \"{{SOURCE_SHA256}}\";\n";
/* The parts that follow variant.cu.in (generator/emit.c, CU_PARTS). */
#define FIXTURE_PART(name) "__global__ void " name "_{{NAME}}() {}\n"
static const char part_primitives[] = FIXTURE_PART("primitives"), part_routing[] = FIXTURE_PART("routing"),
                  part_dispatch[] = FIXTURE_PART("dispatch"), part_combine[] = FIXTURE_PART("combine"),
                  part_combine_parts[] = FIXTURE_PART("combine_parts"),
                  part_combine_sums[] = FIXTURE_PART("combine_sums"), part_nccl[] = FIXTURE_PART("nccl"),
                  part_hybrid[] = FIXTURE_PART("hybrid");
/* The description's fields (a stub's, and each companion's). */
static const char fixture_desc[] = "    .name = \"{{NAME}}\",\n";
static const sg_template fixture_table[] = {
    {"templates/desc.c.in", fixture_desc, sizeof fixture_desc - 1},
    {"templates/variant.cu.in", fixture_cu, sizeof fixture_cu - 1},
    {"templates/variant.h.in", fixture_h, sizeof fixture_h - 1},
    {"templates/variant.c.in", fixture_c, sizeof fixture_c - 1},
    {"templates/cu/primitives.cu.in", part_primitives, sizeof part_primitives - 1},
    {"templates/cu/routing.cu.in", part_routing, sizeof part_routing - 1},
    {"templates/cu/dispatch.cu.in", part_dispatch, sizeof part_dispatch - 1},
    {"templates/cu/combine.cu.in", part_combine, sizeof part_combine - 1},
    {"templates/cu/combine_parts.cu.in", part_combine_parts, sizeof part_combine_parts - 1},
    {"templates/cu/combine_sums.cu.in", part_combine_sums, sizeof part_combine_sums - 1},
    {"templates/cu/nccl.cu.in", part_nccl, sizeof part_nccl - 1},
    {"templates/cu/hybrid.cu.in", part_hybrid, sizeof part_hybrid - 1},
    {NULL, NULL, 0},
};

TestSuite(generate, .init = setup, .fini = teardown);

Test(generate, header_hashes_and_embedded_source_agree)
{
    sg_variant v;
    random_variant(&v, 1);
    const char *spec = "specs/some */ odd.lua";
    sg_generated g;
    sg_diag diag = {0};
    cr_assert_eq(sg_generate_variant(fixture_table, &v, spec, &g, &diag), SG_EXIT_OK);

    char want[256];
    FMT(want, "/* Generated by symmgen %s from specs/some *\\/ odd.lua, variant %s. Do not edit.\n",
             SYMM_VERSION, v.name);
    const sg_buf *files[] = {&g.cu, &g.h, &g.c};
    for (int i = 0; i < 3; i++)
        cr_assert(strncmp(files[i]->data, want, strlen(want)) == 0, "file %d starts:\n%.200s", i, files[i]->data);
    char line[64];
    FMT(line, " *   hidden         %d\n", v.hidden);
    cr_assert(strstr(g.cu.data, line), "header lacks %s", line);
    FMT(line, " *   max_tokens     %d\n", v.max_tokens);
    cr_assert(strstr(g.cu.data, line), "header lacks %s", line);
    cr_assert(strstr(g.cu.data, " */\n#line 2 \"templates/variant.cu.in\"\nconstexpr int HIDDEN"),
              "no #line after the header:\n%s", g.cu.data);
    /* The parts follow in their order, each after a #line naming it. */
    const char *at = g.cu.data;
    static const char *const parts[] = {"primitives",   "routing", "dispatch", "combine", "combine_parts",
                                        "combine_sums", "nccl",    "hybrid"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        FMT(want, "#line 1 \"templates/cu/%s.cu.in\"\n__global__ void %s_%s() {}\n", parts[i], parts[i], v.name);
        const char *found = strstr(at, want);
        cr_assert(found, "part %s missing or out of order:\n%s", parts[i], g.cu.data);
        at = found + strlen(want);
    }

    char hex[SYMM_SHA256_HEX_SIZE];
    symm_sha256_hex_of(g.cu.data, g.cu.len, hex);
    cr_assert_str_eq(g.source_sha256, hex);
    cr_assert(strstr(g.c.data, hex), "the stub does not carry the source hash");
    char len_line[64];
    FMT(len_line, "_len = %zu;", g.cu.len);
    cr_assert(strstr(g.c.data, len_line), "the stub lacks %s", len_line);

    sg_buf all = {0};
    sg_buf_append(&all, g.cu.data, g.cu.len);
    sg_buf_append(&all, g.h.data, g.h.len);
    sg_buf_append(&all, g.c.data, g.c.len);
    symm_sha256_hex_of(all.data, all.len, hex);
    cr_assert_str_eq(g.content_sha256, hex);

    /* The stub compiles cleanly and holds exactly the .cu. */
    sg_buf prog = {0};
    sg_buf_append(&prog, g.c.data, g.c.len);
    sg_buf_printf(&prog, "int main(void) { fwrite(%s_source, 1, %s_len, stdout); return 0; }\n", v.name, v.name);
    char src[PATH_MAX], cmd[4 * PATH_MAX], outp[PATH_MAX];
    FMT(src, "%s/stub.c", tmp_root);
    FMT(outp, "%s/stub.out", tmp_root);
    write_text(src, prog.data, prog.len);
    FMT(cmd, "gcc -std=c11 -Wall -Wextra -Werror %s -o %s/stub && %s/stub > %s", src, tmp_root,
             tmp_root, outp);
    cr_assert_eq(system(cmd), 0, "the stub did not compile or run");
    size_t n;
    char *back = read_file(outp, &n);
    cr_assert(n == g.cu.len && memcmp(back, g.cu.data, n) == 0, "the stub's source differs from the .cu");
    free(back);
    sg_buf_free(&prog);
    sg_buf_free(&all);
    sg_generated_free(&g);
}

Test(generate, missing_template_is_an_internal_error)
{
    sg_variant v;
    random_variant(&v, 2);
    /* Everything but variant.h.in. */
    sg_template partial[(sizeof fixture_table / sizeof fixture_table[0])];
    size_t n = 0;
    for (size_t i = 0; i < (sizeof fixture_table / sizeof fixture_table[0]); i++)
        if (!fixture_table[i].name || strcmp(fixture_table[i].name, "templates/variant.h.in") != 0)
            partial[n++] = fixture_table[i];
    sg_generated g;
    sg_diag diag = {0};
    cr_assert_eq(sg_generate_variant(partial, &v, "s.lua", &g, &diag), SG_EXIT_INTERNAL);
    cr_assert(diag.count >= 1 && strstr(diag.messages[0], "internal error: template templates/variant.h.in"),
              "%s", diag.count ? diag.messages[0] : "(no message)");
    sg_diag_free(&diag);
    /* A part of the CUDA source missing too. */
    n = 0;
    for (size_t i = 0; i < (sizeof fixture_table / sizeof fixture_table[0]); i++)
        if (!fixture_table[i].name || strcmp(fixture_table[i].name, "templates/cu/combine.cu.in") != 0)
            partial[n++] = fixture_table[i];
    sg_diag diag2 = {0};
    cr_assert_eq(sg_generate_variant(partial, &v, "s.lua", &g, &diag2), SG_EXIT_INTERNAL);
    cr_assert(diag2.count >= 1 && strstr(diag2.messages[0], "internal error: template templates/cu/combine.cu.in"),
              "%s", diag2.count ? diag2.messages[0] : "(no message)");
    sg_diag_free(&diag2);
}

Test(generate, same_variant_gives_identical_bytes)
{
    sg_variant v;
    random_variant(&v, 3);
    sg_generated a, b;
    sg_diag diag = {0};
    cr_assert_eq(sg_generate_variant(sg_embedded_templates, &v, "x.lua", &a, &diag), SG_EXIT_OK,
                 "%s", diag.count ? diag.messages[0] : "");
    cr_assert_eq(sg_generate_variant(sg_embedded_templates, &v, "x.lua", &b, &diag), SG_EXIT_OK);
    cr_assert(a.cu.len == b.cu.len && memcmp(a.cu.data, b.cu.data, a.cu.len) == 0);
    cr_assert(a.c.len == b.c.len && memcmp(a.c.data, b.c.data, a.c.len) == 0);
    cr_assert_str_eq(a.content_sha256, b.content_sha256);
    sg_generated_free(&a);
    sg_generated_free(&b);
}

/* The element of a JSON array whose "name" is name, or NULL. */
static const symm_json *named(const symm_json *array, const char *name)
{
    cr_assert(array && array->type == SYMM_JSON_ARRAY, "expected an array holding %s", name);
    for (const symm_json *e = array->first; e; e = e->next) {
        const symm_json *n = symm_json_member(e, "name", NULL);
        if (n && n->type == SYMM_JSON_STRING && strcmp(n->str, name) == 0)
            return e;
    }
    return NULL;
}

static int64_t json_int(const symm_json *obj, const char *key)
{
    const symm_json *v = symm_json_member(obj, key, NULL);
    cr_assert(v && v->type == SYMM_JSON_NUMBER && v->is_int, "no integer \"%s\"", key);
    return v->integer;
}

static bool json_bool(const symm_json *obj, const char *key)
{
    const symm_json *v = symm_json_member(obj, key, NULL);
    cr_assert(v && v->type == SYMM_JSON_BOOL, "no boolean \"%s\"", key);
    return v->boolean;
}

/* combine = "pull": the peers read y, so y lives in the symmetric buffer.
 * For a random shape and its pulling twin, the manifest says so ("combine",
 * the y argument's "symmetric", a region y of [capacity, hidden] combine
 * dtype, no combine_flags, three signals per rank instead of one), the .cu
 * declares COMBINE_PULL and Y as the runtime checks them, and the stub sets
 * combine. The pushing variant keeps y anywhere and has no region y. Its
 * "auto" twin (layout rank) has both forms' regions: y where it may pull,
 * COMBINE_IN and its flags where it pushes (where the NCCL backend lands
 * its rows too), three signals per rank, y anywhere ("symmetric": false),
 * and a source whose form is the program's (COMBINE_PULL = SYMM_PART == 4). */
Test(generate, combine_pull_puts_y_in_the_symmetric_buffer)
{
    sg_variant vs[3];
    random_variant(&vs[0], 4);
    vs[1] = vs[0];
    FMT(vs[1].name, "%s_pull", vs[0].name);
    vs[1].combine = SYMM_COMBINE_PULL;
    vs[2] = vs[0];
    FMT(vs[2].name, "%s_auto", vs[0].name);
    vs[2].combine = SYMM_COMBINE_AUTO;
    vs[2].layout = SYMM_LAYOUT_RANK;
    vs[2].align = 1;
    vs[2].capacity = sg_worst_capacity(&vs[2]);
    sg_generated g[3];
    sg_diag diag = {0};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sg_generate_variant(sg_embedded_templates, &vs[i], "s.lua", &g[i], &diag), SG_EXIT_OK, "%s",
                     diag.count ? diag.messages[0] : "");
    sg_buf text = {0};
    sg_manifest("s.lua", g, 3, &text);
    symm_json_doc *doc;
    int line, col;
    char why[256];
    cr_assert_eq(symm_json_parse(text.data, text.len, &doc, &line, &col, why, sizeof why), SYMM_JSON_OK,
                 "%d:%d: %s", line, col, why);
    const symm_json *variants = symm_json_member(symm_json_root(doc), "variants", NULL);
    static const char *const modes[] = {"push", "pull", "auto"};
    for (int i = 0; i < 3; i++) {
        const sg_variant *v = &vs[i];
        const bool pull = v->combine == SYMM_COMBINE_PULL, automatic = v->combine == SYMM_COMBINE_AUTO;
        const uint64_t W = (uint64_t)v->world, T = (uint64_t)v->max_tokens, K = (uint64_t)v->topk;
        const uint64_t slots = v->layout == SYMM_LAYOUT_RANK ? W * T : T * K;
        const uint64_t y_bytes = (uint64_t)v->capacity * (uint64_t)v->hidden * (uint64_t)symm_dtype_size(v->combine_dtype);
        const uint64_t in_bytes = slots * (uint64_t)v->hidden * (uint64_t)symm_dtype_size(v->combine_dtype);
        const symm_json *obj = named(variants, v->name);
        cr_assert(obj, "the manifest has no variant %s:\n%s", v->name, text.data);

        const symm_json *combine = symm_json_member(obj, "combine", NULL);
        cr_assert(combine && combine->type == SYMM_JSON_STRING && strcmp(combine->str, modes[v->combine]) == 0,
                  "%s: \"combine\" is not \"%s\"", v->name, modes[v->combine]);
        const symm_json *args = symm_json_member(symm_json_member(obj, "arguments", NULL), "combine", NULL);
        const symm_json *y = named(args, "y"), *out = named(args, "out");
        cr_assert(y && out, "%s: combine lacks y or out", v->name);
        cr_assert_eq(json_bool(y, "symmetric"), pull, "%s: combine's y: \"symmetric\" must be %s", v->name,
                     pull ? "true" : "false");
        cr_assert(!json_bool(out, "symmetric"), "%s: combine's out is never symmetric", v->name);

        const symm_json *regions = symm_json_member(obj, "regions", NULL);
        const symm_json *ry = named(regions, "y"), *flags = named(regions, "combine_flags");
        const symm_json *in = named(regions, "combine_in");
        const symm_json *signals = named(regions, "signals");
        cr_assert(signals, "%s: no region signals", v->name);
        /* A pushing combine of layout expert by rank: a second kind, the
         * peers' warps that have stored their partial sums (PARTIAL_GRID). */
        const bool grouped = v->layout == SYMM_LAYOUT_EXPERT && v->combine_order == SYMM_COMBINE_ORDER_RANK;
        cr_assert_eq((uint64_t)json_int(signals, "bytes"), (pull || automatic ? 3 : grouped ? 2 : 1) * W * 128,
                     "%s: signals", v->name);
        sg_layout l;
        sg_layout_compute(v, &l);
        if (pull || automatic) {
            cr_assert(ry, "%s: no region y", v->name);
            cr_assert_eq((uint64_t)json_int(ry, "bytes"), y_bytes, "%s: region y has %lld bytes, expected %llu",
                         v->name, (long long)json_int(ry, "bytes"), (unsigned long long)y_bytes);
            cr_assert(json_bool(ry, "symmetric"), "%s: region y must be symmetric", v->name);
            cr_assert_eq((uint64_t)json_int(ry, "offset"), l.regions[SYMM_REGION_Y].offset);
            cr_assert_leq((uint64_t)json_int(ry, "offset") + y_bytes, (uint64_t)json_int(obj, "symmetric_bytes"));
        } else {
            cr_assert(!ry, "%s: a pushing combine has no region y", v->name);
        }
        if (pull) {
            cr_assert(!flags && !in, "%s: a pulling combine has no combine_flags nor combine_in", v->name);
        } else {
            cr_assert(flags && (uint64_t)json_int(flags, "bytes") == slots * 8, "%s: combine_flags", v->name);
            cr_assert(in && (uint64_t)json_int(in, "bytes") == in_bytes, "%s: combine_in", v->name);
        }

        /* What the runtime checks the descriptor against. */
        char want[128];
        FMT(want, "\nconstexpr bool COMBINE_AUTO = %s;\n", automatic ? "true" : "false");
        cr_assert(strstr(g[i].cu.data, want), "%s.cu lacks %s", v->name, want + 1);
        FMT(want, "\nconstexpr bool COMBINE_PULL = %s;\n", automatic ? "SYMM_PART == 4" : pull ? "true" : "false");
        cr_assert(strstr(g[i].cu.data, want), "%s.cu lacks %s", v->name, want + 1);
        FMT(want, "\nconstexpr u64 Y_OFF = %llu; // symmetric\nconstexpr u64 Y_BYTES = %llu;\n",
            (unsigned long long)l.regions[SYMM_REGION_Y].offset, pull || automatic ? (unsigned long long)y_bytes : 0ull);
        cr_assert(strstr(g[i].cu.data, want), "%s.cu lacks %s", v->name, want + 1);
        FMT(want, ".combine = %s,", automatic ? "SYMM_COMBINE_AUTO" : pull ? "SYMM_COMBINE_PULL" : "SYMM_COMBINE_PUSH");
        cr_assert(strstr(g[i].c.data, want), "%s.c lacks %s", v->name, want);
        FMT(want, " *   combine        %s\n", modes[v->combine]);
        cr_assert(strstr(g[i].cu.data, want), "%s.cu's header lacks %s", v->name, want);
    }
    symm_json_free(doc);
    sg_buf_free(&text);
    for (int i = 0; i < 3; i++)
        sg_generated_free(&g[i]);
    sg_diag_free(&diag);
}

/* The PTX of source with -DSYMM_PART=part (the options of
 * SG_NVRTC_OPTIONS, for compute_90a: no cubin needed to see the entries). */
static char *ptx_of(const char *name, const char *source, int part)
{
    nvrtcProgram prog;
    cr_assert_eq(nvrtcCreateProgram(&prog, source, name, 0, NULL, NULL), NVRTC_SUCCESS);
    char define[32];
    FMT(define, "-DSYMM_PART=%d", part);
    const char *options[] = {"--gpu-architecture=compute_90a", SG_NVRTC_OPTIONS, define};
    nvrtcResult rc = nvrtcCompileProgram(prog, (int)(sizeof options / sizeof options[0]), options);
    if (rc != NVRTC_SUCCESS) {
        size_t n = 0;
        nvrtcGetProgramLogSize(prog, &n);
        char *log = calloc(1, n + 1);
        nvrtcGetProgramLog(prog, log);
        cr_assert_fail("%s part %d: %s\n%s", name, part, nvrtcGetErrorString(rc), log);
    }
    size_t n = 0;
    cr_assert_eq(nvrtcGetPTXSize(prog, &n), NVRTC_SUCCESS);
    char *ptx = calloc(1, n + 1);
    cr_assert_eq(nvrtcGetPTX(prog, ptx), NVRTC_SUCCESS);
    nvrtcDestroyProgram(&prog);
    return ptx;
}

/* combine = "auto" compiles as the runtime compiles it: parts 1, 2 (the
 * pushing combine, symm_combine) and 4 (the pulling one, symm_combine_pull),
 * and 3 for the NCCL backend; each program holds its own entry point and
 * its shared-memory size, and not the other's (their PTX says so). */
Test(generate, combine_auto_compiles_both_forms_each_in_its_program, .timeout = 240)
{
    sg_variant v;
    random_variant(&v, 7);
    v.layout = SYMM_LAYOUT_RANK;
    v.align = 1;
    v.combine = SYMM_COMBINE_AUTO;
    v.capacity = sg_worst_capacity(&v);
    sg_generated g;
    sg_diag diag = {0};
    cr_assert_eq(sg_generate_variant(sg_embedded_templates, &v, "s.lua", &g, &diag), SG_EXIT_OK, "%s",
                 diag.count ? diag.messages[0] : "");
    for (int part = 1; part <= SG_PARTS; part++) {
        cr_assert(sg_part_applies(&v, part), "part %d of an auto variant", part);
        char *ptx = ptx_of(v.name, g.cu.data, part);
        const bool has_push = strstr(ptx, ".entry symm_combine(") != NULL;
        const bool has_pull = strstr(ptx, ".entry symm_combine_pull(") != NULL;
        cr_assert(has_push == (part == 2) && has_pull == (part == 4),
                  "%s part %d (%s): symm_combine %s, symm_combine_pull %s", v.name, part, sg_part_name(part),
                  has_push ? "present" : "absent", has_pull ? "present" : "absent");
        /* The int each form's launch reads its dynamic shared memory from
         * (runtime/variant.c, dynamic_smem): a module without it would be
         * launched with none. */
        const bool push_smem = strstr(ptx, " symm_combine_smem") != NULL;
        const bool pull_smem = strstr(ptx, " symm_combine_pull_smem") != NULL;
        cr_assert(push_smem == (part == 2) && pull_smem == (part == 4),
                  "%s part %d (%s): symm_combine_smem %s, symm_combine_pull_smem %s", v.name, part,
                  sg_part_name(part), push_smem ? "present" : "absent", pull_smem ? "present" : "absent");
        free(ptx);
    }
    /* A variant of another mode has no part 4. */
    v.combine = (symm_combine_mode)rnd_in(0, 1);
    cr_assert(!sg_part_applies(&v, 4), "part 4 of a %s variant", v.combine ? "pull" : "push");
    sg_generated_free(&g);
    sg_diag_free(&diag);
}

/* ---- the output directory ------------------------------------------------ */

/* n variants generated from the fixture templates; broken: one .cu that
 * NVRTC rejects. */
static sg_generated *make_outputs(sg_variant *vs, size_t n, int broken)
{
    sg_generated *g = calloc(n, sizeof *g);
    sg_diag diag = {0};
    for (size_t i = 0; i < n; i++) {
        random_variant(&vs[i], (int)i);
        cr_assert_eq(sg_generate_variant(fixture_table, &vs[i], "spec.lua", &g[i], &diag), SG_EXIT_OK);
    }
    if (broken >= 0) {
        g[broken].cu.len = 0;
        sg_buf_printf(&g[broken].cu, "__global__ void k() { undeclared_%u = 1; }\n", rnd());
    }
    return g;
}

static void free_outputs(sg_generated *g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sg_generated_free(&g[i]);
    free(g);
}

/* An existing output directory as symmgen writes it: three variants' .cu,
 * .h and .c (random text) and a manifest listing them with their hashes. */
static void make_old_output(const char *dir)
{
    cr_assert_eq(mkdir(dir, 0755), 0);
    char path[PATH_MAX], text[3][64];
    static const char *const ext[3] = {"cu", "h", "c"};
    sg_buf manifest = {0};
    sg_buf_printf(&manifest, "{\n  \"format\": 1,\n  \"symmgen\": \"0.%u\",\n  \"spec\": \"old.lua\",\n"
                  "  \"variants\": [", rnd() % 100);
    for (int i = 0; i < 3; i++) {
        symm_sha256_ctx h;
        symm_sha256_init(&h);
        for (int k = 0; k < 3; k++) {
            FMT(path, "%s/old%d.%s", dir, i, ext[k]);
            FMT(text[k], "/* %s %u */\n", ext[k], rnd());
            write_text(path, text[k], strlen(text[k]));
            symm_sha256_update(&h, text[k], strlen(text[k]));
        }
        uint8_t digest[SYMM_SHA256_SIZE];
        char source[SYMM_SHA256_HEX_SIZE], content[SYMM_SHA256_HEX_SIZE];
        symm_sha256_final(&h, digest);
        symm_sha256_hex(digest, content);
        symm_sha256_hex_of(text[0], strlen(text[0]), source);
        sg_buf_printf(&manifest, "%s\n    {\"name\": \"old%d\", \"files\": {\"cu\": \"old%d.cu\", "
                      "\"h\": \"old%d.h\", \"c\": \"old%d.c\"}, \"source_sha256\": \"%s\", "
                      "\"content_sha256\": \"%s\"}", i ? "," : "", i, i, i, i, source, content);
    }
    sg_buf_puts(&manifest, "\n  ]\n}\n");
    FMT(path, "%s/manifest.json", dir);
    write_text(path, manifest.data, manifest.len);
    sg_buf_free(&manifest);
}

/* Test seams, linked over the C library's: remove() fails (EACCES) under
 * fail_remove_under, as for files another user protects; renameat2() runs
 * before_noreplace once, just before the first RENAME_NOREPLACE, as
 * another symmgen winning the race to a new output would. */
static char fail_remove_under[PATH_MAX];
static void (*before_noreplace)(void);

int remove(const char *path)
{
    if (fail_remove_under[0] && strncmp(path, fail_remove_under, strlen(fail_remove_under)) == 0) {
        errno = EACCES;
        return -1;
    }
    if (unlink(path) == 0)
        return 0;
    return errno == EISDIR ? rmdir(path) : -1;
}

int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags)
{
    if ((flags & RENAME_NOREPLACE) && before_noreplace) {
        void (*hook)(void) = before_noreplace;
        before_noreplace = NULL;
        hook();
    }
    return (int)syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags);
}

TestSuite(output, .init = setup, .fini = teardown);

Test(output, writes_every_file_with_fixed_modes_and_leaves_nothing_beside)
{
    umask(077); /* the modes must not depend on the umask */
    size_t n = (size_t)rnd_in(1, 4);
    sg_variant vs[4];
    sg_generated *g = make_outputs(vs, n, -1);
    char parent[PATH_MAX], dir[PATH_MAX];
    FMT(parent, "%s/deep/out", tmp_root);
    FMT(dir, "%s/spec", parent);
    sg_output o = {.dir = dir, .spec_path = "spec.lua", .variants = g, .count = n};
    sg_diag diag = {0};
    cr_assert_eq(sg_output_write(&o, 1, NULL, &diag), SG_EXIT_OK, "%s", diag.count ? diag.messages[0] : "");
    cr_assert_eq(count_entries(parent), 1, "something was left beside the output");
    cr_assert_eq(count_entries(dir), (int)(3 * n + 1));
    struct stat st;
    cr_assert_eq(stat(dir, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0755, "directory mode %o", st.st_mode & 07777);
    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX];
        FMT(path, "%s/%s.c", dir, vs[i].name);
        cr_assert_eq(stat(path, &st), 0, "%s missing", path);
        cr_assert_eq(st.st_mode & 07777, 0644, "file mode %o", st.st_mode & 07777);
        size_t len;
        char *text = read_file(path, &len);
        cr_assert(len == g[i].c.len && memcmp(text, g[i].c.data, len) == 0, "%s differs", path);
        free(text);
    }
    free_outputs(g, n);
}

Test(output, replaces_an_old_output_whole)
{
    char dir[PATH_MAX], stale[PATH_MAX];
    FMT(dir, "%s/out", tmp_root);
    make_old_output(dir);
    sg_variant vs[2];
    sg_generated *g = make_outputs(vs, 2, -1);
    sg_output o = {.dir = dir, .spec_path = "spec.lua", .variants = g, .count = 2};
    sg_diag diag = {0};
    cr_assert_eq(sg_output_write(&o, 1, NULL, &diag), SG_EXIT_OK, "%s", diag.count ? diag.messages[0] : "");
    FMT(stale, "%s/old0.c", dir);
    cr_assert_neq(access(stale, F_OK), 0, "a file of the old output survived");
    cr_assert_eq(count_entries(dir), 7);
    cr_assert_eq(count_entries(tmp_root), 1, "the old tree was left beside the new one");
    free_outputs(g, 2);
}

/* The review's reproducer: a manifest that names a file of the user's
 * under a key symmgen never writes. Replacing the directory would delete
 * it: refused, and the file stays. */
Test(output, forged_manifest_naming_a_user_file_is_refused)
{
    char dir[PATH_MAX], path[PATH_MAX], mine[64];
    FMT(dir, "%s/d", tmp_root);
    cr_assert_eq(mkdir(dir, 0755), 0);
    FMT(path, "%s/manifest.json", dir);
    const char *forged = "{\"format\":1,\"symmgen\":\"x\",\"variants\":[{\"files\":{\"a\":\"mydata.txt\"}}]}";
    write_text(path, forged, strlen(forged));
    FMT(path, "%s/mydata.txt", dir);
    FMT(mine, "precious %u\n", rnd());
    write_text(path, mine, strlen(mine));
    sg_buf before = {0}, after = {0};
    snapshot(tmp_root, &before);
    sg_variant vs[1];
    sg_generated *g = make_outputs(vs, 1, -1);
    sg_output o = {.dir = dir, .spec_path = "spec.lua", .variants = g, .count = 1};
    sg_diag diag = {0};
    cr_assert_eq(sg_output_write(&o, 1, NULL, &diag), SG_EXIT_ERROR, "the forged manifest was believed");
    cr_assert(diag.count == 1 && strstr(diag.messages[0], "lists a file symmgen does not write") &&
                  strstr(diag.messages[0], "nothing was written"),
              "message: %s", diag.count ? diag.messages[0] : "");
    snapshot(tmp_root, &after);
    cr_assert_str_eq(after.data, before.data, "the user's directory changed");
    /* Listed as a .cu, with hashes that are not its own: refused too. */
    sg_diag_free(&diag);
    FMT(path, "%s/manifest.json", dir);
    const char *claims = "{\"format\":1,\"symmgen\":\"x\",\"variants\":[{\"files\":{\"cu\":\"mydata.txt\"},"
                         "\"source_sha256\":\"0000000000000000000000000000000000000000000000000000000000000000\","
                         "\"content_sha256\":\"0000000000000000000000000000000000000000000000000000000000000000\"}]}";
    write_text(path, claims, strlen(claims));
    sg_buf_free(&before);
    snapshot(tmp_root, &before);
    cr_assert_eq(sg_output_write(&o, 1, NULL, &diag), SG_EXIT_ERROR, "a file whose hash does not match was deleted");
    cr_assert(diag.count == 1 && strstr(diag.messages[0], "mydata.txt was changed since symmgen wrote it"),
              "message: %s", diag.count ? diag.messages[0] : "");
    sg_buf_free(&after);
    snapshot(tmp_root, &after);
    cr_assert_str_eq(after.data, before.data, "the user's directory changed");
    sg_diag_free(&diag);
    sg_buf_free(&before);
    sg_buf_free(&after);
    free_outputs(g, 1);
}

/* A generated file edited by hand, or one whose .cu is gone (so its hash
 * cannot be checked), is not symmgen's to delete any more. */
Test(output, edited_or_unverifiable_files_are_not_deleted)
{
    static const char *const cases[][2] = {
        {"old1.h", "changed since symmgen wrote it"},
        {"old2.cu", "changed since symmgen wrote it"},
        {"old0.cu", "cannot be checked against its manifest's hash (old0.cu is missing)"},
    };
    sg_variant vs[1];
    sg_generated *g = make_outputs(vs, 1, -1);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[PATH_MAX], path[PATH_MAX];
        FMT(dir, "%s/out%zu", tmp_root, i);
        make_old_output(dir);
        FMT(path, "%s/%s", dir, cases[i][0]);
        if (i == 2) {
            cr_assert_eq(unlink(path), 0);
        } else {
            FILE *f = fopen(path, "a");
            cr_assert(f);
            fputs("// a change of mine\n", f);
            fclose(f);
        }
        sg_buf before = {0}, after = {0};
        snapshot(tmp_root, &before);
        sg_output o = {.dir = dir, .spec_path = "spec.lua", .variants = g, .count = 1};
        sg_diag diag = {0};
        cr_assert_eq(sg_output_write(&o, 1, NULL, &diag), SG_EXIT_ERROR, "case %zu: replaced", i);
        cr_assert(diag.count == 1 && strstr(diag.messages[0], cases[i][1]) && strstr(diag.messages[0], dir) &&
                      strstr(diag.messages[0], "nothing was written"),
                  "case %zu: message: %s", i, diag.count ? diag.messages[0] : "");
        snapshot(tmp_root, &after);
        cr_assert_str_eq(after.data, before.data, "case %zu: the tree changed", i);
        sg_diag_free(&diag);
        sg_buf_free(&before);
        sg_buf_free(&after);
    }
    free_outputs(g, 1);
}

/* Staging directories of writers that died (kill -9 while staging) are
 * removed by the next run; those of a live process, of another user, or
 * locked by a writer this system cannot see, stay. */
Test(output, staging_dirs_of_dead_writers_are_removed_by_the_next_run)
{
    char dir[PATH_MAX], path[PATH_MAX], file[PATH_MAX + 16];
    FMT(dir, "%s/out", tmp_root);
    pid_t dead = fork();
    if (dead == 0)
        _exit(0);
    cr_assert(dead > 0 && waitpid(dead, NULL, 0) == dead);
    const struct { long pid; const char *kind; bool stays; } cases[] = {
        {dead, "tmp", false}, {dead, "old", false}, {1, "tmp", true}, {dead, "tmp", true} /* locked */,
    };
    int lock = -1;
    char names[4][PATH_MAX];
    for (size_t i = 0; i < 4; i++) {
        FMT(names[i], "%s/.out.%s-%ld-a%04xz", tmp_root, cases[i].kind, cases[i].pid, rnd() & 0xffff);
        cr_assert_eq(mkdir(names[i], 0755), 0);
        FMT(file, "%s/half.cu", names[i]);
        write_text(file, "x", 1);
        if (i == 3) {
            lock = open(names[i], O_RDONLY | O_DIRECTORY);
            cr_assert(lock >= 0 && flock(lock, LOCK_EX) == 0);
        }
    }
    FMT(path, "%s/.out.tmp-XXXXXX", tmp_root); /* not a name symmgen writes now */
    cr_assert(mkdtemp(path));
    sg_variant vs[1];
    sg_generated *g = make_outputs(vs, 1, -1);
    sg_output o = {.dir = dir, .spec_path = "spec.lua", .variants = g, .count = 1};
    sg_diag diag = {0};
    cr_assert_eq(sg_output_write(&o, 1, NULL, &diag), SG_EXIT_OK, "%s", diag.count ? diag.messages[0] : "");
    for (size_t i = 0; i < 4; i++)
        cr_assert_eq(access(names[i], F_OK) == 0, cases[i].stays, "%s: %s", names[i],
                     cases[i].stays ? "removed, though its writer may be alive" : "left behind");
    cr_assert_eq(access(path, F_OK), 0, "a directory of another name was removed");
    close(lock);
    free_outputs(g, 1);
}

/* The old tree is swapped out, but cannot be deleted: the new output is in
 * place and a warning says where the old one is left. */
Test(output, old_tree_that_cannot_be_deleted_is_reported)
{
    char dir[PATH_MAX];
    FMT(dir, "%s/out", tmp_root);
    make_old_output(dir);
    FMT(fail_remove_under, "%s/.out.tmp-", tmp_root);
    sg_variant vs[1];
    sg_generated *g = make_outputs(vs, 1, -1);
    sg_output o = {.dir = dir, .spec_path = "spec.lua", .variants = g, .count = 1};
    sg_diag diag = {0};
    int rc = sg_output_write(&o, 1, NULL, &diag);
    fail_remove_under[0] = '\0';
    cr_assert_eq(rc, SG_EXIT_OK, "%s", diag.count ? diag.messages[0] : "");
    cr_assert(diag.count == 1 && strstr(diag.messages[0], "warning: ") && strstr(diag.messages[0], dir) &&
                  strstr(diag.messages[0], "could not all be deleted") && strstr(diag.messages[0], ".out.tmp-") &&
                  strstr(diag.messages[0], strerror(EACCES)),
              "message: %s", diag.count ? diag.messages[0] : "(none: the old tree is left without a word)");
    cr_assert_eq(count_entries(dir), 4, "the new output is not in place");
    sg_diag_free(&diag);
    free_outputs(g, 1);
}

/* Two first runs writing one output: the second finds it created since it
 * looked, and replaces it like any later run would. */
static const char *race_dir;
static sg_generated *race_other;

static void other_run_wins(void)
{
    sg_output o = {.dir = race_dir, .spec_path = "other.lua", .variants = race_other, .count = 1};
    sg_diag diag = {0};
    cr_assert_eq(sg_output_write(&o, 1, NULL, &diag), SG_EXIT_OK, "%s", diag.count ? diag.messages[0] : "");
    sg_diag_free(&diag);
}

Test(output, first_runs_racing_to_one_output_both_succeed)
{
    char dir[PATH_MAX];
    FMT(dir, "%s/fresh/out", tmp_root);
    sg_variant vs[2];
    sg_generated *g = make_outputs(vs, 2, -1);
    race_dir = dir;
    race_other = &g[1];
    before_noreplace = other_run_wins;
    sg_output o = {.dir = dir, .spec_path = "spec.lua", .variants = g, .count = 1};
    sg_diag diag = {0};
    int rc = sg_output_write(&o, 1, NULL, &diag);
    before_noreplace = NULL;
    cr_assert_eq(rc, SG_EXIT_OK, "the run that lost the race failed: %s", diag.count ? diag.messages[0] : "");
    char path[PATH_MAX + 80];
    FMT(path, "%s/%s.cu", dir, vs[0].name);
    cr_assert_eq(access(path, F_OK), 0, "the last run's output is not in place");
    cr_assert_eq(count_entries(dir), 4);
    FMT(path, "%s/fresh", tmp_root);
    cr_assert_eq(count_entries(path), 1, "something was left beside the output");
    sg_diag_free(&diag);
    free_outputs(g, 2);
}

Test(output, compile_failure_leaves_the_old_output_byte_identical)
{
    char dir[PATH_MAX];
    FMT(dir, "%s/out", tmp_root);
    make_old_output(dir);
    sg_buf before = {0}, after = {0};
    snapshot(tmp_root, &before);
    size_t n = 3;
    sg_variant vs[3];
    int broken = rnd_in(0, 2);
    sg_generated *g = make_outputs(vs, n, broken);
    sg_output o = {.dir = dir, .spec_path = "spec.lua", .variants = g, .count = n};
    sg_compile_opts copts = {.arch = "sm_90a", .verbosity = 0};
    sg_diag diag = {0};
    cr_assert_eq(sg_output_write(&o, 1, &copts, &diag), SG_EXIT_COMPILE);
    snapshot(tmp_root, &after);
    cr_assert_str_eq(after.data, before.data, "the tree changed after a compile failure");
    char want[SG_NAME_MAX + 8];
    FMT(want, "%s.cu", vs[broken].name);
    cr_assert(diag.count == 1 && strstr(diag.messages[0], want) && strstr(diag.messages[0], "undeclared_"),
              "the NVRTC log does not name the variant and the error: %s", diag.count ? diag.messages[0] : "");
    sg_diag_free(&diag);
    sg_buf_free(&before);
    sg_buf_free(&after);
    free_outputs(g, n);
}

Test(output, compiles_good_variants_then_writes)
{
    char dir[PATH_MAX];
    FMT(dir, "%s/out", tmp_root);
    sg_variant vs[2];
    sg_generated *g = make_outputs(vs, 2, -1);
    sg_output o = {.dir = dir, .spec_path = "spec.lua", .variants = g, .count = 2};
    sg_compile_opts copts = {.arch = "sm_90a", .verbosity = 0, .threads = 2};
    sg_diag diag = {0};
    cr_assert_eq(sg_output_write(&o, 1, &copts, &diag), SG_EXIT_OK, "%s", diag.count ? diag.messages[0] : "");
    cr_assert_eq(count_entries(dir), 7);
    free_outputs(g, 2);
}

Test(output, refuses_to_replace_what_is_not_ours)
{
    sg_variant vs[1];
    sg_generated *g = make_outputs(vs, 1, -1);
    char dir[PATH_MAX], file[PATH_MAX], link[PATH_MAX];
    FMT(dir, "%s/mine", tmp_root);
    FMT(file, "%s/notes.txt", dir);
    FMT(link, "%s/link", tmp_root);
    cr_assert_eq(mkdir(dir, 0755), 0);
    char text[32];
    FMT(text, "%u\n", rnd());
    write_text(file, text, strlen(text));
    cr_assert_eq(symlink("mine", link), 0);
    const char *targets[] = {dir, file, link};
    const char *why[] = {"(no manifest.json)", "(not a directory)", "(a symbolic link)"};
    sg_buf before = {0}, after = {0};
    snapshot(tmp_root, &before);
    for (int i = 0; i < 3; i++) {
        sg_output o = {.dir = targets[i], .spec_path = "spec.lua", .variants = g, .count = 1};
        sg_diag diag = {0};
        cr_assert_eq(sg_output_write(&o, 1, NULL, &diag), SG_EXIT_ERROR);
        cr_assert(diag.count == 1 && strstr(diag.messages[0], "is not a symmgen output directory") &&
                      strstr(diag.messages[0], why[i]) && strstr(diag.messages[0], targets[i]),
                  "message: %s", diag.count ? diag.messages[0] : "");
        sg_diag_free(&diag);
    }
    snapshot(tmp_root, &after);
    cr_assert_str_eq(after.data, before.data);

    /* An empty directory may be replaced. */
    char empty[PATH_MAX];
    FMT(empty, "%s/empty", tmp_root);
    cr_assert_eq(mkdir(empty, 0755), 0);
    sg_output o = {.dir = empty, .spec_path = "spec.lua", .variants = g, .count = 1};
    sg_diag diag = {0};
    cr_assert_eq(sg_output_write(&o, 1, NULL, &diag), SG_EXIT_OK);
    cr_assert_eq(count_entries(empty), 4);
    sg_buf_free(&before);
    sg_buf_free(&after);
    free_outputs(g, 1);
}

/* The whole directory is replaced: only one that symmgen wrote, holding
 * nothing else, may be. A manifest.json that merely mentions "format" is
 * someone else's. */
Test(output, refuses_a_foreign_manifest_or_files_symmgen_did_not_write)
{
    sg_variant vs[1];
    sg_generated *g = make_outputs(vs, 1, -1);
    char extra[32], sub[32];
    FMT(extra, "notes%u.txt", rnd() % 1000);
    FMT(sub, "build%u", rnd() % 1000);
    const struct {
        const char *manifest;  /* NULL: make_old_output's */
        const char *add;       /* a file (sub: a directory) put beside it */
        const char *why;
    } cases[] = {
        {"{\"format\":\"png\"}", NULL, "not a symmgen manifest"},
        {"{\"format\": 3, \"symmgen\": \"1.0\"}", NULL, "not a symmgen manifest"},
        {"{\"format\": 1}", NULL, "not a symmgen manifest"},
        {"{\"format\": 1, \"symmgen\": 1}", NULL, "not a symmgen manifest"},
        {"[{\"format\": 1, \"symmgen\": \"1.0\"}]", NULL, "not a symmgen manifest"},
        {"\"format\"", NULL, "not a symmgen manifest"},
        {"{\"format\": 1, \"symmgen\": \"1.0\",}", NULL, "manifest.json is not JSON: line 1"},
        /* A manifest of ours that does not list the old*.c beside it. */
        {"{\"format\": 1, \"symmgen\": \"1.0\", \"variants\": []}", NULL, ", which symmgen did not write"},
        {NULL, extra, extra},
        {NULL, sub, sub},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[PATH_MAX], path[PATH_MAX + 64];
        FMT(dir, "%s/proj%zu", tmp_root, i);
        make_old_output(dir);
        if (cases[i].manifest) {
            FMT(path, "%s/manifest.json", dir);
            write_text(path, cases[i].manifest, strlen(cases[i].manifest));
        }
        if (cases[i].add == sub) {
            FMT(path, "%s/%s", dir, sub);
            cr_assert_eq(mkdir(path, 0755), 0);
        } else if (cases[i].add) {
            FMT(path, "%s/%s", dir, cases[i].add);
            write_text(path, "x\n", 2);
        }
        sg_buf before = {0}, after = {0};
        snapshot(tmp_root, &before);
        sg_output o = {.dir = dir, .spec_path = "spec.lua", .variants = g, .count = 1};
        sg_diag diag = {0};
        cr_assert_eq(sg_output_write(&o, 1, NULL, &diag), SG_EXIT_ERROR,
                     "case %zu: %s was replaced, expected a refusal (%s)", i, dir, cases[i].why);
        cr_assert(diag.count == 1 && strstr(diag.messages[0], dir) &&
                      strstr(diag.messages[0], "is not a symmgen output directory") &&
                      strstr(diag.messages[0], cases[i].why) && strstr(diag.messages[0], "nothing was written"),
                  "case %zu: expected a refusal naming %s, \"%s\" and \"nothing was written\", got: %s", i, dir,
                  cases[i].why, diag.count ? diag.messages[0] : "(no message)");
        snapshot(tmp_root, &after);
        cr_assert_str_eq(after.data, before.data, "case %zu: the tree changed after a refusal", i);
        sg_diag_free(&diag);
        sg_buf_free(&before);
        sg_buf_free(&after);
    }
    free_outputs(g, 1);
}

Test(output, one_refused_target_stops_every_output)
{
    sg_variant vs[2];
    sg_generated *g = make_outputs(vs, 2, -1);
    char a[PATH_MAX], b[PATH_MAX], file[PATH_MAX];
    FMT(a, "%s/a", tmp_root);
    FMT(b, "%s/b", tmp_root);
    FMT(file, "%s/keep", b);
    make_old_output(a);
    cr_assert_eq(mkdir(b, 0755), 0);
    write_text(file, "x", 1);
    sg_buf before = {0}, after = {0};
    snapshot(tmp_root, &before);
    sg_output o[2] = {
        {.dir = a, .spec_path = "a.lua", .variants = g, .count = 1},
        {.dir = b, .spec_path = "b.lua", .variants = g + 1, .count = 1},
    };
    sg_diag diag = {0};
    cr_assert_eq(sg_output_write(o, 2, NULL, &diag), SG_EXIT_ERROR);
    snapshot(tmp_root, &after);
    cr_assert_str_eq(after.data, before.data, "an output changed although another was refused");
    sg_diag_free(&diag);
    sg_buf_free(&before);
    sg_buf_free(&after);
    free_outputs(g, 2);
}

Test(output, write_error_names_the_file_and_leaves_the_target)
{
    char dir[PATH_MAX];
    FMT(dir, "%s/out", tmp_root);
    make_old_output(dir);
    sg_buf before = {0}, after = {0};
    snapshot(tmp_root, &before);
    sg_variant vs[2];
    sg_generated *g = make_outputs(vs, 2, -1);
    /* A full disk, as far as this process can tell: files may not grow past
     * a size smaller than one generated file. */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, small = {.rlim_cur = (rlim_t)g[0].cu.len / 2, .rlim_max = RLIM_INFINITY};
    getrlimit(RLIMIT_FSIZE, &old);
    small.rlim_max = old.rlim_max;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
    sg_output o = {.dir = dir, .spec_path = "spec.lua", .variants = g, .count = 2};
    sg_diag diag = {0};
    int rc = sg_output_write(&o, 1, NULL, &diag);
    setrlimit(RLIMIT_FSIZE, &old);
    cr_assert_eq(rc, SG_EXIT_ERROR);
    cr_assert(diag.count == 1 && strstr(diag.messages[0], strerror(EFBIG)) && strstr(diag.messages[0], ".cu"),
              "message: %s", diag.count ? diag.messages[0] : "");
    snapshot(tmp_root, &after);
    cr_assert_str_eq(after.data, before.data);
    sg_diag_free(&diag);
    sg_buf_free(&before);
    sg_buf_free(&after);
    free_outputs(g, 2);
}

/* ---- --arch ---------------------------------------------------------------- */

Test(compile, arch_names_are_validated)
{
    const char *good[] = {"sm_90a", "sm_90", "sm_80", "sm_100f", "sm_120a", "sm_7"};
    const char *bad[] = {"", "sm_", "sm90", "compute_90", "sm_90b", "sm_90aa", "sm_9x", "SM_90", "sm_-1", NULL};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        cr_assert(sg_arch_valid(good[i]), "%s rejected", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert(!sg_arch_valid(bad[i]), "%s accepted", bad[i] ? bad[i] : "NULL");
}

/* --compile builds each program the runtime builds: the source with
 * -DSYMM_PART=1, 2, 3 and 4 (runtime/jit.c); a part that breaks only under
 * its own define is found, and its log names it. Part 0 is the whole source. */
Test(emit, nvrtc_compile_defines_the_part_as_the_runtime_does)
{
    const int broken = rnd_in(1, SG_PARTS);
    char source[512];
    FMT(source,
        "#ifndef SYMM_PART\n#define SYMM_PART 0\n#endif\n"
        "#if SYMM_PART == %d\n__global__ void broken() { int x = ; }\n#endif\n"
        "extern \"C\" __global__ void fine(int *p) { *p = SYMM_PART; }\n",
        broken);
    for (int part = 0; part <= SG_PARTS; part++) {
        double ms;
        char *log = NULL;
        int rc = sg_nvrtc_compile("parts.cu", source, strlen(source), "sm_90a", part, &ms, &log);
        if (part != broken) {
            cr_assert_eq(rc, 0, "part %d: %s", part, log ? log : "");
        } else {
            char want[64];
            FMT(want, "parts.cu, %s: NVRTC (sm_90a) failed", sg_part_name(part));
            cr_assert(rc == -1 && log && strstr(log, want), "part %d: rc %d, log %s", part, rc, log ? log : "(none)");
        }
        free(log);
    }
}
