/* main.c: the symmgen command line. Parses options, loads every spec, then
 * lists, checks or generates (and with --compile NVRTC-compiles) them. The
 * exit status says what kind of failure happened: 1 a spec or output error, 2
 * a usage error, 3 an NVRTC error, 70 a bug in symmgen. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sg.h"

#define DEFAULT_OUT_PARENT "out"

static const char usage_text[] =
    "usage: symmgen [options] SPEC.lua...\n"
    "Generates MoE dispatch/combine CUDA kernels and their C stubs from Lua specs:\n"
    "for every variant NAME, DIR/NAME.cu, DIR/NAME.h and DIR/NAME.c, and DIR/manifest.json.\n"
    "\n"
    "  -o DIR, --output=DIR\n"
    "                   output directory (default out/<spec file name without .lua>;\n"
    "                   only with a single SPEC); replaced as a whole, atomically, and\n"
    "                   only if empty or holding nothing but a previous symmgen output\n"
    "  -D FIELD=VALUE, --define=FIELD=VALUE\n"
    "                   set FIELD to VALUE in every variant (repeatable); an unknown\n"
    "                   FIELD or a VALUE no variant can take is a usage error\n"
    "  --list           print the variants, one per line; write nothing\n"
    "  --list --json    the same as a JSON array of the manifest's variant objects\n"
    "  --check          validate the specs; write nothing (with --compile: compile too)\n"
    "  --compile        also NVRTC-compile every variant, as the runtime will\n"
    "  --arch ARCH      GPU architecture for --compile: sm_NN with an optional a or f\n"
    "                   suffix (default " SG_DEFAULT_ARCH ")\n"
    "  -q, --quiet      print errors only\n"
    "  -h, --help       this text\n"
    "  --version        print the version\n"
    "\n"
    "A spec runs in a process of its own, stopped after SYMM_SPEC_TIMEOUT seconds\n"
    "(default 10).\n"
    "\n"
    "Exit status: 0 success, 1 spec or output error, 2 usage error, 3 NVRTC error.\n";

typedef struct options {
    const char *out_dir;
    const char *arch;
    bool list, json, check, compile, quiet;
    sg_override *overrides;
    size_t n_overrides;
    const char **specs;
    size_t n_specs;
} options;

/* arg comes from the command line: shown with control bytes escaped. */
static int usage_error(const char *fmt, const char *arg)
{
    char *shown = sg_printable(arg);
    fputs("symmgen: ", stderr);
    fprintf(stderr, fmt, shown ? shown : "(out of memory)");
    fputs("\nTry 'symmgen --help'.\n", stderr);
    free(shown);
    return SG_EXIT_USAGE;
}

/* Every -D is checked once, before any spec runs: an unknown field, or a
 * value wrong whatever the spec says, is a usage error reported once. */
static int check_overrides(const options *o)
{
    sg_diag diag = {0};
    int status = SG_EXIT_OK;
    if (o->n_overrides && sg_overrides_check(o->overrides, o->n_overrides, &diag) != 0) {
        for (size_t i = 0; i < diag.count; i++)
            fprintf(stderr, "symmgen: %s\n", diag.messages[i]);
        fputs("Try 'symmgen --help'.\n", stderr);
        status = SG_EXIT_USAGE;
    }
    sg_diag_free(&diag);
    return status;
}

/* The value of an option given as "-o DIR", "-oDIR", "--output DIR" or
 * "--output=DIR"; NULL when arg is not that option. */
static const char *option_value(char **argv, int argc, int *i, const char *short_name,
                                const char *long_name, bool *missing)
{
    const char *arg = argv[*i];
    size_t ln = long_name ? strlen(long_name) : 0;
    const char *attached = NULL;
    bool long_with_equals = false;
    if (short_name && strncmp(arg, short_name, 2) == 0) {
        attached = arg + 2;
    } else if (long_name && strncmp(arg, long_name, ln) == 0 && (arg[ln] == '=' || arg[ln] == '\0')) {
        long_with_equals = arg[ln] == '=';
        attached = long_with_equals ? arg + ln + 1 : arg + ln;
    } else {
        return NULL;
    }
    if (*attached || long_with_equals)
        return attached;
    if (*i + 1 >= argc) {
        *missing = true;
        return "";
    }
    return argv[++*i];
}

static int parse_override(const char *text, options *o)
{
    const char *eq = strchr(text, '=');
    if (!eq || eq == text)
        return usage_error("-D %s: expected FIELD=VALUE", text);
    sg_override *grown = realloc(o->overrides, (o->n_overrides + 1) * sizeof *grown);
    char *field = strndup(text, (size_t)(eq - text));
    if (!grown || !field) {
        free(field);
        fputs("symmgen: internal error: out of memory\n", stderr);
        exit(SG_EXIT_INTERNAL);
    }
    o->overrides = grown;
    o->overrides[o->n_overrides++] = (sg_override){.field = field, .value = eq + 1};
    return SG_EXIT_OK;
}

static int parse_args(int argc, char **argv, options *o)
{
    bool options_done = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *value;
        bool missing = false;
        if (options_done || arg[0] != '-' || strcmp(arg, "-") == 0) {
            if (strcmp(arg, "-") == 0 && !options_done)
                return usage_error("%s: specs are read from files, not from standard input", arg);
            o->specs[o->n_specs++] = arg;
        } else if (strcmp(arg, "--") == 0) {
            options_done = true;
        } else if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(usage_text, stdout);
            exit(SG_EXIT_OK);
        } else if (strcmp(arg, "--version") == 0) {
            printf("symmgen %s\n", SYMM_VERSION);
            exit(SG_EXIT_OK);
        } else if (strcmp(arg, "--list") == 0) {
            o->list = true;
        } else if (strcmp(arg, "--json") == 0) {
            o->json = true;
        } else if (strcmp(arg, "--check") == 0) {
            o->check = true;
        } else if (strcmp(arg, "--compile") == 0) {
            o->compile = true;
        } else if (strcmp(arg, "-q") == 0 || strcmp(arg, "--quiet") == 0) {
            o->quiet = true;
        } else if ((value = option_value(argv, argc, &i, "-o", "--output", &missing))) {
            if (missing || !*value)
                return usage_error("%s: expected an output directory", arg);
            if (o->out_dir)
                return usage_error("%s: the output directory is given twice", arg);
            o->out_dir = value;
        } else if ((value = option_value(argv, argc, &i, "-D", "--define", &missing))) {
            if (missing)
                return usage_error("%s: expected FIELD=VALUE", arg);
            if (parse_override(value, o) != SG_EXIT_OK)
                return SG_EXIT_USAGE;
        } else if ((value = option_value(argv, argc, &i, NULL, "--arch", &missing))) {
            if (missing)
                return usage_error("%s: expected an architecture such as " SG_DEFAULT_ARCH, arg);
            if (!sg_arch_valid(value))
                return usage_error("--arch %s: expected sm_ followed by digits and an optional "
                                   "'a' or 'f' (for example " SG_DEFAULT_ARCH ")", value);
            o->arch = value;
        } else {
            return usage_error("unknown option %s", arg);
        }
    }
    return SG_EXIT_OK;
}

static int check_combination(const options *o)
{
    if (o->n_specs == 0)
        return usage_error("%s", "no spec file given");
    if (o->json && !o->list)
        return usage_error("%s", "--json goes with --list");
    if (o->list && (o->check || o->compile))
        return usage_error("--list %s: --list only prints; use one or the other",
                           o->check ? "with --check" : "with --compile");
    if (o->out_dir && o->n_specs > 1)
        return usage_error("-o %s: one output directory cannot take several specs; "
                           "run symmgen once per spec, or leave -o out", o->out_dir);
    return SG_EXIT_OK;
}

/* out/<spec file name without .lua>, or -o. */
static char *target_dir(const options *o, const char *spec)
{
    if (o->out_dir) {
        /* "-o out/x/" names out/x: the swap works on the name, not the slash. */
        char *dir = strdup(o->out_dir);
        for (size_t n = dir ? strlen(dir) : 0; n > 1 && dir[n - 1] == '/'; n--)
            dir[n - 1] = '\0';
        return dir;
    }
    const char *base = strrchr(spec, '/');
    base = base ? base + 1 : spec;
    size_t n = strlen(base);
    if (n > 4 && strcmp(base + n - 4, ".lua") == 0)
        n -= 4;
    char *dir = NULL;
    if (asprintf(&dir, "%s/%.*s", DEFAULT_OUT_PARENT, (int)n, base) < 0)
        return NULL;
    return dir;
}

static int check_targets(const options *o, char **targets)
{
    for (size_t i = 0; i < o->n_specs; i++) {
        if (!targets[i]) {
            fputs("symmgen: internal error: out of memory\n", stderr);
            return SG_EXIT_INTERNAL;
        }
        const char *base = strrchr(targets[i], '/');
        if (strcmp(base ? base + 1 : targets[i], "") == 0 || strcmp(base ? base + 1 : targets[i], ".") == 0)
            return o->out_dir ? usage_error("-o %s: expected a directory with a name", o->out_dir)
                              : usage_error("%s: cannot name an output directory after this spec; use -o",
                                            o->specs[i]);
        for (size_t j = 0; j < i; j++)
            if (strcmp(targets[i], targets[j]) == 0) {
                char *a = sg_printable(o->specs[j]), *b = sg_printable(o->specs[i]), *t = sg_printable(targets[i]);
                fprintf(stderr, "symmgen: %s and %s would both write %s: rename one, or run symmgen "
                        "once per spec with -o\nTry 'symmgen --help'.\n", a ? a : "?", b ? b : "?", t ? t : "?");
                free(a);
                free(b);
                free(t);
                return SG_EXIT_USAGE;
            }
    }
    return SG_EXIT_OK;
}

/* Every message, one per line; spec errors already start with "file:line:". */
static void print_diag(const sg_diag *d, bool prefix)
{
    for (size_t i = 0; i < d->count; i++)
        fprintf(stderr, "%s%s\n", prefix ? "symmgen: " : "", d->messages[i]);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* --list: the text needs no generated files; --json needs each variant's
 * (its hashes), generated one at a time and freed, so that a spec of many
 * variants lists in the memory of one. */
static int list(const options *o, const sg_spec *specs)
{
    sg_buf out = {0};
    sg_diag diag = {0};
    int status = SG_EXIT_OK;
    if (o->json) {
        sg_buf_puts(&out, "[");
        bool first = true;
        for (size_t s = 0; s < o->n_specs && status == SG_EXIT_OK; s++)
            for (size_t i = 0; i < specs[s].count && status == SG_EXIT_OK; i++) {
                sg_generated gen = {0};
                status = sg_generate_variant(sg_embedded_templates, &specs[s].variants[i], o->specs[s], &gen,
                                             &diag);
                if (status == SG_EXIT_OK) {
                    sg_buf_puts(&out, first ? "\n  " : ",\n  ");
                    sg_manifest_variant(&specs[s].variants[i], &gen, 2, &out);
                    first = false;
                }
                sg_generated_free(&gen);
            }
        sg_buf_puts(&out, first ? "]\n" : "\n]\n");
    } else {
        for (size_t s = 0; s < o->n_specs; s++) {
            if (o->n_specs > 1)
                sg_buf_printf(&out, "%s%s:\n", s ? "\n" : "", specs[s].path);
            sg_list_text(&specs[s], &out);
        }
    }
    print_diag(&diag, true);
    sg_diag_free(&diag);
    if (status == SG_EXIT_OK && out.len)
        fwrite(out.data, 1, out.len, stdout);
    sg_buf_free(&out);
    return status;
}

/* The end of --check: its diagnostics, then a line per spec when all is well. */
static int report_check(const options *o, const sg_spec *specs, sg_diag *diag, int status)
{
    print_diag(diag, true);
    sg_diag_free(diag);
    for (size_t s = 0; s < o->n_specs && status == SG_EXIT_OK && !o->quiet; s++)
        fprintf(stderr, "%s: %zu variant%s OK\n", o->specs[s], specs[s].count, specs[s].count == 1 ? "" : "s");
    return status;
}

/* --check without --compile: every variant generated (its templates
 * expanded and checked), one at a time. */
static int check_generation(const options *o, const sg_spec *specs)
{
    sg_diag diag = {0};
    int status = SG_EXIT_OK;
    for (size_t s = 0; s < o->n_specs && status == SG_EXIT_OK; s++)
        for (size_t i = 0; i < specs[s].count && status == SG_EXIT_OK; i++) {
            sg_generated gen = {0};
            status = sg_generate_variant(sg_embedded_templates, &specs[s].variants[i], o->specs[s], &gen, &diag);
            sg_generated_free(&gen);
        }
    return report_check(o, specs, &diag, status);
}

static int generate(const options *o, const sg_spec *specs, sg_generated **gens)
{
    sg_diag diag = {0};
    int status = SG_EXIT_OK;
    for (size_t s = 0; s < o->n_specs && status == SG_EXIT_OK; s++) {
        gens[s] = calloc(specs[s].count ? specs[s].count : 1, sizeof *gens[s]);
        if (!gens[s]) {
            sg_diag_add(&diag, "internal error: out of memory");
            status = SG_EXIT_INTERNAL;
            break;
        }
        for (size_t i = 0; i < specs[s].count && status == SG_EXIT_OK; i++)
            status = sg_generate_variant(sg_embedded_templates, &specs[s].variants[i], o->specs[s],
                                         &gens[s][i], &diag);
    }
    print_diag(&diag, true);
    sg_diag_free(&diag);
    return status;
}

static int load_specs(const options *o, sg_spec *specs)
{
    sg_diag diag = {0};
    int status = SG_EXIT_OK;
    for (size_t s = 0; s < o->n_specs; s++)
        if (sg_spec_load(o->specs[s], o->overrides, o->n_overrides, &specs[s], &diag) != 0)
            status = SG_EXIT_ERROR;
    print_diag(&diag, false);
    sg_diag_free(&diag);
    return status;
}

/* --check: nothing is written; with --compile every variant is compiled. */
/* --check --compile: every variant, generated in gens, compiled. */
static int check(const options *o, const sg_spec *specs, sg_generated **gens,
                 const sg_compile_opts *copts)
{
    sg_diag diag = {0};
    int status = SG_EXIT_OK;
    for (size_t s = 0; s < o->n_specs && status == SG_EXIT_OK; s++) {
        const sg_generated **list = calloc(specs[s].count + 1, sizeof *list);
        for (size_t i = 0; list && i < specs[s].count; i++)
            list[i] = &gens[s][i];
        status = list ? sg_compile_all(list, specs[s].count, copts, &diag) : SG_EXIT_INTERNAL;
        free(list);
    }
    return report_check(o, specs, &diag, status);
}

static int write_outputs(const options *o, const sg_spec *specs, sg_generated **gens, char **targets,
                         const sg_compile_opts *copts, double start)
{
    sg_output *outs = calloc(o->n_specs, sizeof *outs);
    if (!outs) {
        fputs("symmgen: internal error: out of memory\n", stderr);
        return SG_EXIT_INTERNAL;
    }
    size_t variants = 0;
    for (size_t s = 0; s < o->n_specs; s++) {
        outs[s] = (sg_output){.dir = targets[s], .spec_path = o->specs[s], .variants = gens[s],
                              .count = specs[s].count};
        variants += specs[s].count;
    }
    sg_diag diag = {0};
    int status = sg_output_write(outs, o->n_specs, o->compile ? copts : NULL, &diag);
    print_diag(&diag, true);
    sg_diag_free(&diag);
    free(outs);
    if (status != SG_EXIT_OK || o->quiet)
        return status;
    for (size_t s = 0; s < o->n_specs; s++) {
        char *shown = sg_printable(targets[s]);
        fprintf(stderr, "wrote %s (%zu variant%s, %zu files)\n", shown ? shown : targets[s], specs[s].count,
                specs[s].count == 1 ? "" : "s", 3 * specs[s].count + 1);
        free(shown);
    }
    fprintf(stderr, "symmgen: %zu variant%s in %.0f ms\n", variants, variants == 1 ? "" : "s", now_ms() - start);
    return status;
}

static int run(const options *o, sg_spec *specs, sg_generated **gens, char **targets)
{
    int status = load_specs(o, specs);
    if (status != SG_EXIT_OK)
        return status;
    double start = now_ms();
    if (o->list)
        return list(o, specs);
    if (o->check && !o->compile)
        return check_generation(o, specs);
    status = generate(o, specs, gens);
    if (status != SG_EXIT_OK)
        return status;
    sg_compile_opts copts = {
        .arch = o->arch ? o->arch : SG_DEFAULT_ARCH,
        .verbosity = o->quiet ? 0 : isatty(STDERR_FILENO) ? 2 : 1,
    };
    if (o->check)
        return check(o, specs, gens, &copts);
    return write_outputs(o, specs, gens, targets, &copts, start);
}

int main(int argc, char **argv)
{
    options o = {0};
    o.specs = calloc((size_t)argc, sizeof *o.specs);
    if (!o.specs)
        return SG_EXIT_INTERNAL;
    int status = parse_args(argc, argv, &o);
    if (status == SG_EXIT_OK)
        status = check_combination(&o);
    if (status == SG_EXIT_OK)
        status = check_overrides(&o);

    char **targets = calloc(o.n_specs + 1, sizeof *targets);
    sg_spec *specs = calloc(o.n_specs + 1, sizeof *specs);
    sg_generated **gens = calloc(o.n_specs + 1, sizeof *gens);
    if (status == SG_EXIT_OK && (!targets || !specs || !gens)) {
        fputs("symmgen: internal error: out of memory\n", stderr);
        status = SG_EXIT_INTERNAL;
    }
    if (status == SG_EXIT_OK) {
        for (size_t s = 0; s < o.n_specs; s++)
            targets[s] = target_dir(&o, o.specs[s]);
        status = check_targets(&o, targets);
    }
    if (status == SG_EXIT_OK)
        status = run(&o, specs, gens, targets);

    for (size_t s = 0; s < o.n_specs && targets && specs && gens; s++) {
        for (size_t i = 0; gens[s] && i < specs[s].count; i++)
            sg_generated_free(&gens[s][i]);
        free(gens[s]);
        free(targets[s]);
        sg_spec_free(&specs[s]);
    }
    for (size_t i = 0; i < o.n_overrides; i++)
        free((char *)o.overrides[i].field);
    free(o.overrides);
    free(targets);
    free(specs);
    free(gens);
    free(o.specs);
    return status;
}
