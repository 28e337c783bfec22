/* sg.h: the generator's internal interfaces (sg_ prefix), shared by its
 * pieces: spec loading and validation (spec.c), the layout of a variant's
 * buffers (layout.c), template expansion and output (emit.c, manifest.c),
 * NVRTC compilation (compile.c) and the command line (main.c).
 *
 * Errors inside the generator are reported through sg_diag (a list of
 * messages, each already in the final "file:line: ..." shape); functions
 * return 0 on success and -1 on failure. */
#ifndef SG_H
#define SG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "symm_types.h"

#define SG_NAME_MAX 64
/* Most entries of a variant's hosts (distinct divisors > 1 of a world <= 128). */
#define SG_MAX_HOSTS 16

/* The default of field combine: "auto" for layout rank from this
 * max_tokens up (prefill-sized: there a pulling combine was the faster form,
 * 184 against 210 us at 4096 tokens, bench/NOTES.md 46), and at any
 * max_tokens from world SG_AUTO_MIN_WORLD up (at world 4 the pulling
 * combine was the faster at decode too: 26.3 against 28.1 us at 128
 * tokens, bench/NOTES.md 119); else "push" (world 2 and 3 at decode: 13.7
 * against 14.5 us at world 2), and for layout expert (push faster at
 * decode and for that layout). */
#define SG_AUTO_MIN_TOKENS 1024
#define SG_AUTO_MIN_WORLD 4

/* NVRTC options of every variant (besides --gpu-architecture): symmgen
 * --compile and the runtime's JIT use exactly these (vars.c writes them into
 * the stub). */
#define SG_NVRTC_OPTIONS "-std=c++17", "-default-device"

/* One variant, as declared by one layout { ... } call, after defaults are
 * applied and validation passed. */
typedef struct sg_variant {
    char name[SG_NAME_MAX];
    const char *file;       /* file of the layout { } call: the spec or a module it
                             * requires (owned by the sg_spec; NULL where no spec made it) */
    int line;               /* line of the layout { } call in that file */
    int hidden;             /* elements per token */
    int topk;               /* experts per token */
    int experts;            /* total experts */
    int world;              /* ranks */
    int max_tokens;         /* tokens per rank per call, upper bound */
    symm_dtype dtype;       /* dispatch payload */
    symm_dtype combine_dtype; /* combine payload and output (never fp8) */
    symm_layout layout;
    bool weights;
    int64_t capacity;       /* receive rows per rank; the worst case unless set */
    bool capacity_set;      /* capacity given in the spec (or by -D) */
    int align;              /* layout expert: segment alignment in rows (1 for rank) */
    int sms;                /* SM budget of the kernels */
    symm_combine_mode combine; /* "pull": each rank's combine reads the peers' rows of y,
                             * which then live in the symmetric buffer; "auto" (layout
                             * rank): both forms, chosen per call by where y lies */
    symm_combine_order combine_order; /* layout expert: partial sums per rank (default) or
                             * the ascending-k sum of every (token, expert) row */
    int hosts[SG_MAX_HOSTS]; /* field hosts: the host counts, ascending, each > 1 dividing world */
    int n_hosts;             /* 0: one host only */
    /* A companion (the native part of the hybrid backend on hosts H): the
     * variant of one host's ranks that spec.c adds after its parent, world
     * / H ranks, experts / H, H * max_tokens. 0 / "" for a spec's variant. */
    int companion_hosts;
    char companion_of[SG_NAME_MAX];
    /* A spec's variant with hosts: its companions (n_hosts of them, in the
     * order of hosts), in the same sg_spec's variants. */
    const struct sg_variant *companions;
    int n_companions;
} sg_variant;

/* A loaded spec: its path as given and its variants in declaration order. */
typedef struct sg_spec {
    char *path;
    sg_variant *variants;
    size_t count;
    char **files;           /* the spec and the modules it required; variants' file */
    size_t n_files;
} sg_spec;

/* Diagnostics: every message a failing step produced, in order. */
typedef struct sg_diag {
    char **messages;
    size_t count;
} sg_diag;

void sg_diag_add(sg_diag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sg_diag_free(sg_diag *d);

/* A -D field=value override, applied to every variant of every spec. */
typedef struct sg_override {
    const char *field;
    const char *value;
} sg_override;

/* spec.c: run SPEC in the sandbox, collect its layout { } calls, apply the
 * overrides and defaults, validate. On failure returns -1 with every error in
 * diag and *out untouched. The Lua part runs in a child process (fork, no
 * exec) that is killed after SYMM_SPEC_TIMEOUT seconds (read once; default
 * 10): call it where forking is safe (before starting threads). */
int sg_spec_load(const char *path, const sg_override *overrides, size_t n_overrides,
                 sg_spec *out, sg_diag *diag);
void sg_spec_free(sg_spec *spec);

/* spec.c: the checks of -D overrides that need no spec (the field exists and
 * may be set; the value's type, range or choices), each failure reported
 * once in diag, naming the -D. Returns the number of errors. */
int sg_overrides_check(const sg_override *overrides, size_t n, sg_diag *diag);

/* spec.c: s with every byte a terminal would act on (control characters,
 * bytes that are not UTF-8) written as \xNN; malloc'd, NULL when out of
 * memory. sg_is_printable: s needs no such escape. */
char *sg_printable(const char *s);
bool sg_is_printable(const char *s);

/* Names of dtypes and layouts as written in specs ("bf16", "expert"). */
const char *sg_dtype_name(symm_dtype d);
const char *sg_layout_name(symm_layout l);
const char *sg_combine_name(symm_combine_mode c);

/* layout.c: where everything of a variant lives. Regions of the symmetric
 * buffer (same offsets on every rank) and of the local scratch buffer. The
 * same numbers go into the generated kernels (as constants), into the C stub
 * (for the runtime) and into the manifest. */
/* Region ids are symm_region (symm_types.h), shared with the runtime. */

typedef struct sg_region {
    const char *name;      /* "recv_x" */
    uint64_t offset;       /* from the start of its buffer */
    uint64_t bytes;        /* 0 when the variant does not use it */
    bool symmetric;        /* in the symmetric buffer (else local scratch) */
} sg_region;

typedef struct sg_layout {
    sg_region regions[SYMM_REGION_COUNT];
    uint64_t symmetric_bytes;  /* per rank, before rounding to the VMM granularity */
    uint64_t scratch_bytes;    /* per rank, local device memory */
    int64_t worst_capacity;    /* rows that can never overflow */
} sg_layout;

void sg_layout_compute(const sg_variant *v, sg_layout *out);
int64_t sg_worst_capacity(const sg_variant *v);

/* Template variables (vars.c): the holes of the templates. */
typedef struct sg_var {
    const char *name;      /* HIDDEN */
    char *value;           /* "7168" */
} sg_var;

typedef struct sg_vars {
    sg_var *items;
    size_t count;
} sg_vars;

/* All variables of one variant (constants, names, the layout block). */
int sg_vars_for_variant(const sg_variant *v, const char *spec_path, sg_vars *out);
void sg_vars_set(sg_vars *vars, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *sg_vars_get(const sg_vars *vars, const char *name);
void sg_vars_free(sg_vars *vars);

/* ---- Output (emit.c, output.c, manifest.c, compile.c, main.c) ------------ */

/* symmgen's exit statuses. The output functions below return one of them
 * (SG_EXIT_OK = 0), so that main can pass a failure's kind straight on. */
enum {
    SG_EXIT_OK = 0,
    SG_EXIT_ERROR = 1,     /* a spec error, or the output could not be written */
    SG_EXIT_USAGE = 2,     /* bad command line */
    SG_EXIT_COMPILE = 3,   /* NVRTC rejected a generated variant */
    SG_EXIT_INTERNAL = 70, /* a bug in symmgen (EX_SOFTWARE), e.g. a hole without a value */
};

#define SG_DEFAULT_ARCH "sm_90a"
/* The oldest target --compile accepts: sm_90 (Hopper); the runtime refuses
 * older GPUs at create in the same words. */
#define SG_MIN_ARCH 90

/* A template: its path in the source tree ("templates/variant.cu.in") and
 * text. The build embeds templates/ as sg_embedded_templates (scripts/embed.c
 * writes the same tagged struct), terminated by an entry with name NULL. */
typedef struct sg_template {
    const char *name;
    const char *text;
    size_t len;
} sg_template;

extern const struct sg_template sg_embedded_templates[];

/* The entry called name in a NULL-terminated table, or NULL. */
const sg_template *sg_template_find(const sg_template *table, const char *name);

/* A growing byte buffer, always NUL-terminated once anything was appended.
 * Allocation failure is fatal in the generator (message, exit 70). */
typedef struct sg_buf {
    char *data;
    size_t len, cap;
} sg_buf;

void sg_buf_append(sg_buf *b, const void *data, size_t n);
void sg_buf_puts(sg_buf *b, const char *s);
void sg_buf_printf(sg_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sg_buf_free(sg_buf *b);

/* emit.c: expand template t, replacing every {{NAME}} (NAME: [A-Z][A-Z0-9_]*)
 * by its value in vars; any other text, "{{" included, is copied as is. With
 * line_directives, each template line that held a value spanning several
 * lines is followed by `#line N "<t->name>"`, N the template line that
 * follows, so compiler messages point into the template. A hole without a
 * value returns SG_EXIT_INTERNAL with "internal error: TEMPLATE:LINE: ..."
 * in diag. */
int sg_expand(const sg_template *t, const sg_vars *vars, bool line_directives,
              sg_buf *out, sg_diag *diag);

/* emit.c: the HEADER comment of every generated file (no final newline). */
void sg_header(const sg_variant *v, const char *spec_path, sg_buf *out);

/* emit.c: `static const char SYMBOL[] = ...;` holding data[0..len) as C
 * string literals, one per source line (no final newline): the CUDA_SOURCE
 * hole of the stub template, a whole definition. sizeof SYMBOL == len + 1.
 * Wrapped in a GCC diagnostic push/pop that allows the long concatenation
 * under -pedantic (-Woverlength-strings); gcc and clang accept any length. */
void sg_c_source_array(const char *symbol, const char *data, size_t len, sg_buf *out);

/* The files of one generated variant, in memory. */
typedef struct sg_generated {
    const sg_variant *variant;
    sg_buf cu, h, c;
    char source_sha256[65];  /* of cu */
    char content_sha256[65]; /* of cu, h and c, in that order */
} sg_generated;

/* emit.c: expand templates/variant.{cu,h,c}.in of table (normally
 * sg_embedded_templates) for v. Returns SG_EXIT_OK or SG_EXIT_INTERNAL. */
int sg_generate_variant(const sg_template *table, const sg_variant *v, const char *spec_path,
                        sg_generated *out, sg_diag *diag);
void sg_generated_free(sg_generated *g);

/* compile.c: --compile. verbosity 0: silent; 1: one line per variant on
 * stderr; 2: the same plus a progress line (stderr is a terminal). */
typedef struct sg_compile_opts {
    const char *arch; /* "sm_90a" */
    int verbosity;
    int threads;      /* 0: one per core, at most 8 */
} sg_compile_opts;

/* "sm_" digits, optionally followed by 'a' or 'f'. */
bool sg_arch_valid(const char *arch);

/* The programs the runtime cuts a variant's source in (-DSYMM_PART=1..4):
 * dispatch, combine, the NCCL and hybrid backends' kernels and, with
 * combine = "auto" only, the pulling combine (part 2 then being the pushing
 * one). Part 0 is the whole (with "auto": its pushing combine). */
#define SG_PARTS 4
const char *sg_part_name(int part);
/* Whether variant v has part (1..SG_PARTS): all but 4, and 4 with "auto". */
bool sg_part_applies(const sg_variant *v, int part);

/* NVRTC-compile one source (source[len] == '\0'; a NUL inside is refused)
 * with --gpu-architecture=arch, SG_NVRTC_OPTIONS and, for part 1..SG_PARTS,
 * -DSYMM_PART=part: the runtime JIT's options but its -split-compile=0
 * (compile.c says why). Returns 0 with *log NULL or NVRTC's warnings, or -1
 * with *log the reason (NVRTC's log, naming the template lines thanks to
 * #line); *log is malloc'd. *ms: wall time. */
int sg_nvrtc_compile(const char *program_name, const char *source, size_t len, const char *arch, int part,
                     double *ms, char **log);

/* Compile the .cu of every variant, each part on its own as the runtime
 * does (in parallel threads). Returns SG_EXIT_OK,
 * SG_EXIT_USAGE for an arch older than sm_90 (before compiling anything), or
 * SG_EXIT_COMPILE with each failing variant's log in diag. */
int sg_compile_all(const sg_generated *const *gens, size_t n, const sg_compile_opts *o, sg_diag *diag);

/* The "format" of manifest.json (manifest.c); output.c recognises a
 * directory it may replace by it. */
#define SG_MANIFEST_FORMAT 2

/* manifest.c: JSON of one variant as in manifest.json, indented by indent
 * spaces (its first line unindented); g NULL leaves out files and hashes. */
void sg_manifest_variant(const sg_variant *v, const sg_generated *g, int indent, sg_buf *out);
/* manifest.c: the whole manifest.json of one output directory. */
void sg_manifest(const char *spec_path, const sg_generated *gens, size_t n, sg_buf *out);
/* manifest.c: the --list table of a spec's variants (aligned columns). */
void sg_list_text(const sg_spec *spec, sg_buf *out);
/* manifest.c: s as a JSON string literal, quotes included. */
void sg_json_string(const char *s, sg_buf *out);

/* output.c: one output directory: a spec's generated variants. */
typedef struct sg_output {
    const char *dir;           /* target, e.g. out/default */
    const char *spec_path;     /* as given, for the manifest */
    const sg_generated *variants;
    size_t count;
} sg_output;

/* output.c: with compile set, NVRTC-compile every variant first; then write
 * each output into a fresh directory beside its target and swap them all
 * into place. All or nothing: on any failure every target is left exactly as
 * it was (refusing to replace one that is not a symmgen output directory,
 * as sg_output_check_target says, checked again on the old tree once it is
 * swapped out), and the status says why (SG_EXIT_ERROR, SG_EXIT_COMPILE).
 * Two runs writing one new target at once end like two later runs (the last
 * one's output in place). Staging directories that a writer which died left
 * beside a target are removed. An old tree that cannot be deleted after a
 * successful swap is a "warning: ..." in diag with SG_EXIT_OK. Files 0644,
 * directories 0755; missing parents are created. */
int sg_output_write(const sg_output *outs, size_t n, const sg_compile_opts *compile, sg_diag *diag);

/* output.c: SG_EXIT_OK when dir does not exist or may be replaced by
 * sg_output_write: an empty directory, or one whose manifest.json is a JSON
 * object with "format": SG_MANIFEST_FORMAT and a "symmgen" string and which
 * holds only regular files that manifest lists as a variant's "cu", "h" or
 * "c" (plain names) and that still match the hashes it records (the .cu its
 * source_sha256; the .h and .c, with their .cu, its content_sha256): symmgen
 * deletes nothing else. Else SG_EXIT_ERROR with the reason in diag. */
int sg_output_check_target(const char *dir, sg_diag *diag);

#endif
