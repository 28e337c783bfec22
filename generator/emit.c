/* emit.c: the one place where templates become generated files. Expands
 * {{HOLES}} with the values of vars.c plus the ones only known here (the
 * header comment, the expanded CUDA source as a C array and its hash), keeps
 * compiler messages pointing into the template with #line, and holds the
 * generator's growing buffer (sg_buf). Writing the files out is output.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sg.h"
#include "../runtime/sha256.h" /* the runtime's SHA-256, compiled into symmgen too */

#define TEMPLATE_CU "templates/variant.cu.in"
/* The CUDA source is TEMPLATE_CU and then these parts, in this order, each
 * after a #line that names it (templates/variant.cu.in says what each holds). */
static const char *const CU_PARTS[] = {
    "templates/cu/primitives.cu.in",    "templates/cu/routing.cu.in",      "templates/cu/dispatch.cu.in",
    "templates/cu/combine.cu.in",       "templates/cu/combine_parts.cu.in", "templates/cu/combine_sums.cu.in",
    "templates/cu/nccl.cu.in",          "templates/cu/hybrid.cu.in",
};
#define TEMPLATE_H "templates/variant.h.in"
#define TEMPLATE_C "templates/variant.c.in"

/* Longest run of source bytes in one string literal of the stub: well under
 * the 4095 characters C11 compilers must accept in one literal. */
#define LITERAL_CHUNK 4000

static void out_of_memory(void)
{
    fputs("symmgen: internal error: out of memory\n", stderr);
    exit(SG_EXIT_INTERNAL);
}

static void reserve(sg_buf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *data = realloc(b->data, cap);
    if (!data)
        out_of_memory();
    b->data = data;
    b->cap = cap;
}

void sg_buf_append(sg_buf *b, const void *data, size_t n)
{
    reserve(b, n);
    memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void sg_buf_puts(sg_buf *b, const char *s) { sg_buf_append(b, s, strlen(s)); }

void sg_buf_printf(sg_buf *b, const char *fmt, ...)
{
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        out_of_memory();
    reserve(b, (size_t)n);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, again);
    va_end(again);
    b->len += (size_t)n;
}

void sg_buf_free(sg_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

const sg_template *sg_template_find(const sg_template *table, const char *name)
{
    for (; table && table->name; table++)
        if (strcmp(table->name, name) == 0)
            return table;
    return NULL;
}

/* Length of the hole at p ("{{NAME}}"), 0 if p does not start one. */
static size_t hole_length(const char *p, const char *end, size_t *name_len)
{
    if (end - p < 5 || p[0] != '{' || p[1] != '{' || !(p[2] >= 'A' && p[2] <= 'Z'))
        return 0;
    const char *q = p + 3;
    while (q < end && ((*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') || *q == '_'))
        q++;
    if (end - q < 2 || q[0] != '}' || q[1] != '}')
        return 0;
    *name_len = (size_t)(q - (p + 2));
    return (size_t)(q + 2 - p);
}

int sg_expand(const sg_template *t, const sg_vars *vars, bool line_directives,
              sg_buf *out, sg_diag *diag)
{
    const char *p = t->text, *end = t->text + t->len;
    int line = 1, status = SG_EXIT_OK;
    /* multi: this template line held a multi-line value; pending: a #line is
     * owed at the next line start that is not inside a continued line. */
    bool multi = false, pending = false, continued = false;

    reserve(out, t->len);
    while (p < end) {
        if (pending && !continued && (out->len == 0 || out->data[out->len - 1] == '\n')) {
            sg_buf_printf(out, "#line %d \"%s\"\n", line, t->name);
            pending = false;
        }
        size_t name_len = 0, n = hole_length(p, end, &name_len);
        if (n) {
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)name_len, p + 2);
            const char *value = sg_vars_get(vars, name);
            if (!value) {
                sg_diag_add(diag, "internal error: %s:%d: hole {{%s}} has no value "
                            "(the template and generator/vars.c disagree)", t->name, line, name);
                status = SG_EXIT_INTERNAL;
            } else {
                sg_buf_puts(out, value);
                multi |= strchr(value, '\n') != NULL;
            }
            p += n;
            continue;
        }
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *next_hole = memchr(p + 1, '{', (size_t)(end - p - 1));
        /* Copy plain text up to the next possible hole or the end of the line. */
        const char *stop = nl ? nl + 1 : end;
        if (next_hole && next_hole < stop)
            stop = next_hole;
        sg_buf_append(out, p, (size_t)(stop - p));
        if (stop[-1] == '\n') {
            continued = stop - p >= 2 && stop[-2] == '\\';
            line++;
            pending |= multi && line_directives;
            multi = false;
        }
        p = stop;
    }
    return status;
}

/* Text safe inside a C comment on one line: no control bytes, no comment
 * delimiters. */
static void comment_safe(const char *s, sg_buf *out)
{
    char prev = 0;
    for (; *s; prev = *s++) {
        unsigned char c = (unsigned char)*s;
        if ((c == '*' && prev == '/') || (c == '/' && prev == '*'))
            sg_buf_puts(out, "\\");
        if (c < 0x20 || c == 0x7f)
            sg_buf_puts(out, "?");
        else
            sg_buf_append(out, s, 1);
    }
}

void sg_header(const sg_variant *v, const char *spec_path, sg_buf *out)
{
    sg_layout l;
    sg_layout_compute(v, &l);
    sg_buf_puts(out, "/* Generated by symmgen " SYMM_VERSION " from ");
    comment_safe(spec_path, out);
    sg_buf_printf(out, ", variant %s. Do not edit.\n", v->name);
    sg_buf_printf(out, " *   hidden         %d\n", v->hidden);
    sg_buf_printf(out, " *   topk           %d\n", v->topk);
    sg_buf_printf(out, " *   experts        %d\n", v->experts);
    sg_buf_printf(out, " *   world          %d\n", v->world);
    sg_buf_printf(out, " *   max_tokens     %d\n", v->max_tokens);
    sg_buf_printf(out, " *   dtype          %s\n", sg_dtype_name(v->dtype));
    sg_buf_printf(out, " *   combine_dtype  %s\n", sg_dtype_name(v->combine_dtype));
    sg_buf_printf(out, " *   layout         %s\n", sg_layout_name(v->layout));
    sg_buf_printf(out, " *   weights        %s\n", v->weights ? "true" : "false");
    sg_buf_printf(out, " *   combine        %s\n", sg_combine_name(v->combine));
    sg_buf_printf(out, " *   capacity       %lld%s\n", (long long)v->capacity,
                  v->capacity == l.worst_capacity ? " (worst case)" : "");
    sg_buf_printf(out, " *   align          %d\n", v->align);
    sg_buf_printf(out, " *   sms            %d\n", v->sms);
    sg_buf_printf(out, " *   symmetric bytes per rank  %llu (%.1f MiB)\n",
                  (unsigned long long)l.symmetric_bytes, (double)l.symmetric_bytes / (1 << 20));
    sg_buf_puts(out, " */");
}

/* Appends the bytes of one string literal's contents. A '?' after a '?' is
 * escaped so that no trigraph forms (gcc -std=c11 replaces them). */
static void literal_bytes(const unsigned char *p, size_t n, sg_buf *out)
{
    static const char digits[] = "01234567";
    reserve(out, 4 * n);
    char *o = out->data + out->len;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (c == '\\' || c == '"' || (c == '?' && i > 0 && p[i - 1] == '?')) {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c == '\n') {
            *o++ = '\\';
            *o++ = 'n';
        } else if (c == '\t') {
            *o++ = '\\';
            *o++ = 't';
        } else if (c >= 0x20 && c < 0x7f) {
            *o++ = (char)c;
        } else {
            /* Always three octal digits, so a following digit cannot join. */
            *o++ = '\\';
            *o++ = digits[c >> 6];
            *o++ = digits[(c >> 3) & 7];
            *o++ = digits[c & 7];
        }
    }
    out->len = (size_t)(o - out->data);
    out->data[out->len] = '\0';
}

/* The source is one concatenation of literals, one per source line, so the
 * stub reads like the .cu it carries. Only -pedantic would object to the
 * total length (-Woverlength-strings; gcc and clang accept any length), so
 * that warning is switched off around the array and nowhere else. */
void sg_c_source_array(const char *symbol, const char *data, size_t len, sg_buf *out)
{
    sg_buf_puts(out, "#if defined(__GNUC__)\n"
                     "#pragma GCC diagnostic push\n"
                     "#pragma GCC diagnostic ignored \"-Woverlength-strings\"\n"
                     "#endif\n");
    sg_buf_printf(out, "static const char %s[] =", symbol);
    if (len == 0)
        sg_buf_puts(out, " \"\"");
    const unsigned char *p = (const unsigned char *)data, *end = p + len;
    while (p < end) {
        const unsigned char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl + 1 - p) : (size_t)(end - p);
        if (n > LITERAL_CHUNK)
            n = LITERAL_CHUNK;
        sg_buf_puts(out, "\n    \"");
        literal_bytes(p, n, out);
        sg_buf_puts(out, "\"");
        p += n;
    }
    sg_buf_puts(out, ";\n"
                     "#if defined(__GNUC__)\n"
                     "#pragma GCC diagnostic pop\n"
                     "#endif");
}

static int expand_named(const sg_template *table, const char *name, const sg_vars *vars,
                        bool line_directives, sg_buf *out, sg_diag *diag)
{
    const sg_template *t = sg_template_find(table, name);
    if (!t) {
        sg_diag_add(diag, "internal error: template %s is not built into symmgen", name);
        return SG_EXIT_INTERNAL;
    }
    return sg_expand(t, vars, line_directives, out, diag);
}

#define TEMPLATE_DESC "templates/desc.c.in"

/* v's CUDA source (TEMPLATE_CU and its parts) into cu, its SHA-256, and the
 * stub's holes that carry it (CUDA_SOURCE, CUDA_SOURCE_LEN, SOURCE_SHA256)
 * into vars, which hold v's values and HEADER. */
static int generate_cu(const sg_template *table, const sg_variant *v, sg_vars *vars, sg_buf *cu, char *sha256,
                       sg_diag *diag)
{
    int st = expand_named(table, TEMPLATE_CU, vars, true, cu, diag);
    for (size_t i = 0; st == SG_EXIT_OK && i < sizeof CU_PARTS / sizeof CU_PARTS[0]; i++) {
        if (cu->len && cu->data[cu->len - 1] != '\n')
            sg_buf_puts(cu, "\n");
        sg_buf_printf(cu, "#line 1 \"%s\"\n", CU_PARTS[i]);
        st = expand_named(table, CU_PARTS[i], vars, true, cu, diag);
    }
    if (st != SG_EXIT_OK)
        return st;
    symm_sha256_hex_of(cu->data, cu->len, sha256);
    char symbol[SG_NAME_MAX + 16];
    snprintf(symbol, sizeof symbol, "%s_source", v->name);
    sg_buf text = {0};
    sg_c_source_array(symbol, cu->data, cu->len, &text);
    sg_vars_set(vars, "SOURCE_SHA256", "%s", sha256);
    sg_vars_set(vars, "CUDA_SOURCE", "%s", text.data);
    sg_vars_set(vars, "CUDA_SOURCE_LEN", "%zu", cu->len);
    sg_buf_free(&text);
    return SG_EXIT_OK;
}

/* The values of v's own template holes, HEADER included, and the stub's
 * description fields of a variant without companions. */
static int variant_vars(const sg_variant *v, const char *spec_path, sg_vars *vars, sg_diag *diag)
{
    if (sg_vars_for_variant(v, spec_path, vars) != 0) {
        sg_diag_add(diag, "internal error: variant %s: no template values", v->name);
        return SG_EXIT_INTERNAL;
    }
    sg_buf text = {0};
    sg_header(v, spec_path, &text);
    sg_vars_set(vars, "HEADER", "%s", text.data);
    sg_buf_free(&text);
    sg_vars_set(vars, "COMPANION_HOSTS", "%d", v->companion_hosts);
    sg_vars_set(vars, "COMPANIONS_PTR", "NULL");
    sg_vars_set(vars, "N_COMPANIONS", "0");
    sg_vars_set(vars, "COMPANIONS", "%s", "");
    return SG_EXIT_OK;
}

/* The stub's COMPANIONS hole of v (each companion's CUDA source, options
 * and description, in an array NAME_companions) and the description fields
 * that point to it. */
static int companion_block(const sg_template *table, const sg_variant *v, const char *spec_path, sg_vars *vars,
                           sg_diag *diag)
{
    if (v->n_companions == 0)
        return SG_EXIT_OK;
    sg_buf sources = {0}, descs = {0};
    int st = SG_EXIT_OK;
    sg_buf_printf(&descs, "static const symm_variant_desc %s_companions[%d] = {\n", v->name, v->n_companions);
    for (int i = 0; i < v->n_companions && st == SG_EXIT_OK; i++) {
        const sg_variant *c = &v->companions[i];
        sg_vars cv = {0};
        sg_buf cu = {0};
        char sha[65];
        st = variant_vars(c, spec_path, &cv, diag);
        if (st == SG_EXIT_OK)
            st = generate_cu(table, c, &cv, &cu, sha, diag);
        if (st == SG_EXIT_OK) {
            sg_buf_printf(&sources, "\n/* Companion %s: the native part on %d hosts (docs/protocol.md, "
                          "\"Across hosts\"). */\n%s\n\nstatic const char *const %s_nvrtc_options[] = { %s };\n",
                          c->name, c->companion_hosts, sg_vars_get(&cv, "CUDA_SOURCE"), c->name,
                          sg_vars_get(&cv, "NVRTC_OPTIONS"));
            sg_buf_puts(&descs, "{\n");
            st = expand_named(table, TEMPLATE_DESC, &cv, false, &descs, diag);
            sg_buf_puts(&descs, "},\n");
        }
        sg_buf_free(&cu);
        sg_vars_free(&cv);
    }
    sg_buf_puts(&descs, "};\n");
    if (st == SG_EXIT_OK) {
        sg_buf_puts(&sources, "\n");
        sg_buf_puts(&sources, descs.data);
        sg_vars_set(vars, "COMPANIONS", "%s", sources.data);
        sg_vars_set(vars, "COMPANIONS_PTR", "%s_companions", v->name);
        sg_vars_set(vars, "N_COMPANIONS", "%d", v->n_companions);
    }
    sg_buf_free(&sources);
    sg_buf_free(&descs);
    return st;
}

int sg_generate_variant(const sg_template *table, const sg_variant *v, const char *spec_path,
                        sg_generated *out, sg_diag *diag)
{
    sg_vars vars = {0};
    memset(out, 0, sizeof *out);
    out->variant = v;
    int st = variant_vars(v, spec_path, &vars, diag);
    if (st == SG_EXIT_OK)
        st = generate_cu(table, v, &vars, &out->cu, out->source_sha256, diag);
    if (st == SG_EXIT_OK)
        st = companion_block(table, v, spec_path, &vars, diag);
    if (st == SG_EXIT_OK) {
        sg_buf fields = {0};
        st = expand_named(table, TEMPLATE_DESC, &vars, false, &fields, diag);
        if (st == SG_EXIT_OK)
            sg_vars_set(&vars, "DESC_FIELDS", "%s", fields.data);
        sg_buf_free(&fields);
    }
    if (st == SG_EXIT_OK)
        st = expand_named(table, TEMPLATE_H, &vars, false, &out->h, diag);
    if (st == SG_EXIT_OK)
        st = expand_named(table, TEMPLATE_C, &vars, false, &out->c, diag);
    if (st == SG_EXIT_OK) {
        symm_sha256_ctx h;
        uint8_t digest[SYMM_SHA256_SIZE];
        symm_sha256_init(&h);
        symm_sha256_update(&h, out->cu.data, out->cu.len);
        symm_sha256_update(&h, out->h.data, out->h.len);
        symm_sha256_update(&h, out->c.data, out->c.len);
        symm_sha256_final(&h, digest);
        symm_sha256_hex(digest, out->content_sha256);
    }
    sg_vars_free(&vars);
    if (st != SG_EXIT_OK)
        sg_generated_free(out);
    return st;
}

void sg_generated_free(sg_generated *g)
{
    sg_buf_free(&g->cu);
    sg_buf_free(&g->h);
    sg_buf_free(&g->c);
}
