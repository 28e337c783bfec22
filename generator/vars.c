/* vars.c: the values of the templates' holes for one variant. Every number a
 * template needs is computed here or in layout.c, once. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sg.h"

static char *vformat(const char *fmt, va_list ap)
{
    va_list copy;
    va_copy(copy, ap);
    int n = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    char *s = malloc((size_t)n + 1);
    if (!s)
        abort(); /* the generator's allocation failures are fatal by design */
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

void sg_vars_set(sg_vars *vars, const char *name, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *value = vformat(fmt, ap);
    va_end(ap);
    for (size_t i = 0; i < vars->count; i++) {
        if (strcmp(vars->items[i].name, name) == 0) {
            free(vars->items[i].value);
            vars->items[i].value = value;
            return;
        }
    }
    sg_var *items = realloc(vars->items, (vars->count + 1) * sizeof *items);
    if (!items)
        abort();
    vars->items = items;
    vars->items[vars->count].name = name;
    vars->items[vars->count].value = value;
    vars->count++;
}

const char *sg_vars_get(const sg_vars *vars, const char *name)
{
    for (size_t i = 0; i < vars->count; i++)
        if (strcmp(vars->items[i].name, name) == 0)
            return vars->items[i].value;
    return NULL;
}

void sg_vars_free(sg_vars *vars)
{
    for (size_t i = 0; i < vars->count; i++)
        free(vars->items[i].value);
    free(vars->items);
    vars->items = NULL;
    vars->count = 0;
}

/* Region names in generated code: SYMM_REGION_RECV_X -> RECV_X. */
static const char *const region_names[SYMM_REGION_COUNT] = {
    [SYMM_REGION_SIGNALS] = "SIGNALS",
    [SYMM_REGION_COUNTS] = "COUNTS",
    [SYMM_REGION_RECV_X] = "RECV_X",
    [SYMM_REGION_RECV_SCALES] = "RECV_SCALES",
    [SYMM_REGION_RECV_SRC] = "RECV_SRC",
    [SYMM_REGION_RECV_TOPK] = "RECV_TOPK",
    [SYMM_REGION_RECV_WEIGHTS] = "RECV_WEIGHTS",
    [SYMM_REGION_COMBINE_IN] = "COMBINE_IN",
    [SYMM_REGION_STATE] = "STATE",
    [SYMM_REGION_EXPERT_COUNT] = "EXPERT_COUNT",
    [SYMM_REGION_EXPERT_OFFSET] = "EXPERT_OFFSET",
    [SYMM_REGION_TOKEN_ROUTE] = "TOKEN_ROUTE",
    [SYMM_REGION_TOKEN_WEIGHTS] = "TOKEN_WEIGHTS",
    [SYMM_REGION_LAYOUT_WORK] = "LAYOUT_WORK",
    [SYMM_REGION_COMBINE_FLAGS] = "COMBINE_FLAGS",
    [SYMM_REGION_RECV_CHAIN] = "RECV_CHAIN",
    [SYMM_REGION_Y] = "Y",
    [SYMM_REGION_CHAIN_READY] = "CHAIN_READY",
};

/* A formatted string, malloc'd. */
static char *vformat_n(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *vformat_n(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = vformat(fmt, ap);
    va_end(ap);
    return s;
}

/* Append to a growing string. */
typedef struct strbuf {
    char *s;
    size_t len;
} strbuf;

static void sb_add(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(strbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *piece = vformat(fmt, ap);
    va_end(ap);
    size_t n = strlen(piece);
    char *s = realloc(b->s, b->len + n + 1);
    if (!s)
        abort();
    memcpy(s + b->len, piece, n + 1);
    b->s = s;
    b->len += n;
    free(piece);
}

/* A block of lines as the value of hole `name`, without its last newline
 * (the template line supplies it); frees the block. */
static void sb_set_block(sg_vars *vars, const char *name, strbuf *b)
{
    b->s[--b->len] = '\0';
    sg_vars_set(vars, name, "%s", b->s);
    free(b->s);
    b->s = NULL;
    b->len = 0;
}

static void set_region_vars(sg_vars *vars, const sg_layout *l)
{
    strbuf cuda = {0}, table = {0};
    for (int i = 0; i < SYMM_REGION_COUNT; i++) {
        const sg_region *r = &l->regions[i];
        sb_add(&cuda, "constexpr u64 %s_OFF = %llu; // %s\n", region_names[i],
               (unsigned long long)r->offset, r->symmetric ? "symmetric" : "local scratch");
        sb_add(&cuda, "constexpr u64 %s_BYTES = %llu;\n", region_names[i], (unsigned long long)r->bytes);
        sb_add(&table, "        [SYMM_REGION_%s] = {%lluu, %lluu, %d},\n", region_names[i],
               (unsigned long long)r->offset, (unsigned long long)r->bytes, r->symmetric ? 1 : 0);
    }
    sb_set_block(vars, "REGION_CONSTANTS", &cuda);
    sb_set_block(vars, "REGION_TABLE", &table);
}

/* C type of one element as the C API sees it (bf16 and fp16 as raw bits). */
static const char *c_element_type(symm_dtype d)
{
    switch (d) {
    case SYMM_DTYPE_FP32: return "float";
    case SYMM_DTYPE_FP8_E4M3: return "uint8_t";
    default: return "uint16_t";
    }
}

static const char *dtype_enum(symm_dtype d)
{
    switch (d) {
    case SYMM_DTYPE_BF16: return "SYMM_DTYPE_BF16";
    case SYMM_DTYPE_FP16: return "SYMM_DTYPE_FP16";
    case SYMM_DTYPE_FP32: return "SYMM_DTYPE_FP32";
    case SYMM_DTYPE_FP8_E4M3: return "SYMM_DTYPE_FP8_E4M3";
    }
    return "?";
}

/* A string as the inside of a C string literal. */
static void set_c_string(sg_vars *vars, const char *name, const char *text)
{
    strbuf b = {0};
    sb_add(&b, "%s", "");
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        /* "??" would start a trigraph under -std=c11. */
        if (*p == '?' && p > (const unsigned char *)text && p[-1] == '?')
            sb_add(&b, "\\?");
        else if (*p == '\\' || *p == '"')
            sb_add(&b, "\\%c", *p);
        else if (isprint(*p))
            sb_add(&b, "%c", *p);
        else
            sb_add(&b, "\\%03o", *p);
    }
    sg_vars_set(vars, name, "%s", b.s);
    free(b.s);
}

/* One field of the stub's typed receive struct (NAME_recv_t): its
 * declaration and comment, and how NAME_recv fills it from the
 * symm_recv_buffers member of the same name. */
typedef struct recv_field {
    const char *type;    /* "NAME_x_t *", with NAME filled in */
    const char *member;  /* its name, as in symm_recv_buffers */
    char *comment;
} recv_field;

/* The typed receive struct and its copy from symm_recv_buffers, with only
 * the members this variant has: RECV_FIELDS for the header, RECV_COPY for
 * NAME_recv. */
static void set_recv_vars(sg_vars *vars, const sg_variant *v)
{
    const bool rank = v->layout == SYMM_LAYOUT_RANK, fp8 = v->dtype == SYMM_DTYPE_FP8_E4M3;
    const int local = v->experts / v->world;
    char x_type[SG_NAME_MAX + 16], y_type[SG_NAME_MAX + 16];
    snprintf(x_type, sizeof x_type, "%s_x_t *", v->name);
    snprintf(y_type, sizeof y_type, "%s_y_t *", v->name);
    recv_field f[9];
    int n = 0;
    f[n++] = (recv_field){x_type, "x", vformat_n("[%lld, %d] %s: the received rows", (long long)v->capacity,
                                                v->hidden, sg_dtype_name(v->dtype))};
    if (fp8)
        f[n++] = (recv_field){"const float *", "scales",
                              vformat_n("[%lld, %d]: one scale per 128 elements", (long long)v->capacity,
                                        v->hidden / SYMM_FP8_BLOCK)};
    f[n++] = (recv_field){"const int32_t *", "src",
                          vformat_n("[%lld][4]: {source rank, source token, %s, 0}", (long long)v->capacity,
                                    rank ? "-1" : "k")};
    if (rank)
        f[n++] = (recv_field){"const int32_t *", "topk_idx",
                              vformat_n("[%lld, %d]: local expert ids 0..%d, -1 on other ranks",
                                        (long long)v->capacity, v->topk, local - 1)};
    if (v->weights)
        f[n++] = (recv_field){"const float *", "weights",
                              rank ? vformat_n("[%lld, %d]: top-k weights, which combine does not apply",
                                               (long long)v->capacity, v->topk)
                                   : vformat_n("[%lld]: the weight of each row, which combine applies",
                                               (long long)v->capacity)};
    f[n++] = (recv_field){"const int32_t *", "expert_count",
                          vformat_n("[%d]: rows per local expert", local)};
    if (!rank)
        f[n++] = (recv_field){"const int32_t *", "expert_offset",
                              vformat_n("[%d]: first row of each local expert's segment", local)};
    f[n++] = (recv_field){"const int32_t *", "rows", vformat_n("one int32: the rows received")};
    if (v->combine != SYMM_COMBINE_PUSH)
        f[n++] = (recv_field){y_type, "y",
                              vformat_n("[%lld, %d] %s: a place for combine's y",
                                        (long long)v->capacity, v->hidden, sg_dtype_name(v->combine_dtype))};
    strbuf fields = {0}, copy = {0};
    for (int i = 0; i < n; i++) {
        sb_add(&fields, "    %s%s; /* %s */\n", f[i].type, f[i].member, f[i].comment);
        sb_add(&copy, "    out->%s = (%s)(uintptr_t)rb.%s;\n", f[i].member, f[i].type, f[i].member);
        free(f[i].comment);
    }
    sb_set_block(vars, "RECV_FIELDS", &fields);
    sb_set_block(vars, "RECV_COPY", &copy);
}

/* The dispatch arguments this variant takes: x_scales only with fp8
 * dispatch, topk_weights only with weights. */
static void set_dispatch_vars(sg_vars *vars, const sg_variant *v)
{
    const bool fp8 = v->dtype == SYMM_DTYPE_FP8_E4M3;
    sg_vars_set(vars, "X_SCALES_PARAM", "%s", fp8 ? " const float *x_scales," : "");
    sg_vars_set(vars, "X_SCALES_ARG", "%s", fp8 ? "x_scales" : "NULL");
    sg_vars_set(vars, "TOPK_WEIGHTS_PARAM", "%s", v->weights ? " const float *topk_weights," : "");
    sg_vars_set(vars, "TOPK_WEIGHTS_ARG", "%s", v->weights ? "topk_weights" : "NULL");
    strbuf doc = {0};
    sb_add(&doc, " *   x             [tokens, %d] %s, 16-byte aligned\n", v->hidden, sg_dtype_name(v->dtype));
    if (fp8)
        sb_add(&doc, " *   x_scales      [tokens, %d] float, one scale per 128 elements\n",
               v->hidden / SYMM_FP8_BLOCK);
    sb_add(&doc, " *   topk_idx      [tokens, %d] int32: expert ids 0..%d, or -1 for none\n", v->topk,
           v->experts - 1);
    if (v->weights)
        sb_add(&doc, " *   topk_weights  [tokens, %d] float\n", v->topk);
    doc.s[--doc.len] = '\0';
    sg_vars_set(vars, "DISPATCH_DOC", "%s", doc.s);
    free(doc.s);
}

int sg_vars_for_variant(const sg_variant *v, const char *spec_path, sg_vars *out)
{
    sg_layout l;
    sg_layout_compute(v, &l);
    memset(out, 0, sizeof *out);

    char upper[SG_NAME_MAX];
    size_t i = 0;
    for (; v->name[i] && i + 1 < sizeof upper; i++)
        upper[i] = (char)toupper((unsigned char)v->name[i]);
    upper[i] = '\0';

    sg_vars_set(out, "NAME", "%s", v->name);
    sg_vars_set(out, "NAME_UPPER", "%s", upper);
    set_c_string(out, "SPEC_FILE", spec_path);
    sg_vars_set(out, "SYMMGEN_VERSION", "%s", SYMM_VERSION);
    sg_vars_set(out, "HIDDEN", "%d", v->hidden);
    sg_vars_set(out, "TOPK", "%d", v->topk);
    sg_vars_set(out, "EXPERTS", "%d", v->experts);
    sg_vars_set(out, "WORLD", "%d", v->world);
    sg_vars_set(out, "LOCAL_EXPERTS", "%d", v->experts / v->world);
    sg_vars_set(out, "MAX_TOKENS", "%d", v->max_tokens);
    sg_vars_set(out, "CAPACITY", "%lld", (long long)v->capacity);
    sg_vars_set(out, "WORST_CAPACITY", "%lld", (long long)l.worst_capacity);
    sg_vars_set(out, "ALIGN", "%d", v->align);
    sg_vars_set(out, "SMS", "%d", v->sms);
    sg_vars_set(out, "DTYPE", "%s", sg_dtype_name(v->dtype));
    sg_vars_set(out, "COMBINE_DTYPE", "%s", sg_dtype_name(v->combine_dtype));
    sg_vars_set(out, "DTYPE_ID", "%d", (int)v->dtype);
    sg_vars_set(out, "COMBINE_DTYPE_ID", "%d", (int)v->combine_dtype);
    sg_vars_set(out, "DTYPE_ENUM", "%s", dtype_enum(v->dtype));
    sg_vars_set(out, "COMBINE_DTYPE_ENUM", "%s", dtype_enum(v->combine_dtype));
    sg_vars_set(out, "X_TYPE", "%s", c_element_type(v->dtype));
    sg_vars_set(out, "Y_TYPE", "%s", c_element_type(v->combine_dtype));
    sg_vars_set(out, "LAYOUT", "%s", sg_layout_name(v->layout));
    sg_vars_set(out, "LAYOUT_ENUM", "%s",
                v->layout == SYMM_LAYOUT_RANK ? "SYMM_LAYOUT_RANK" : "SYMM_LAYOUT_EXPERT");
    sg_vars_set(out, "LAYOUT_EXPERT", "%s", v->layout == SYMM_LAYOUT_EXPERT ? "true" : "false");
    sg_vars_set(out, "WEIGHTS", "%s", v->weights ? "true" : "false");
    sg_vars_set(out, "WEIGHTS_INT", "%d", v->weights ? 1 : 0);
    /* combine = "auto": each program is one form, part 4 the pulling one. */
    const bool automatic = v->combine == SYMM_COMBINE_AUTO;
    sg_vars_set(out, "COMBINE_AUTO", "%s", automatic ? "true" : "false");
    sg_vars_set(out, "COMBINE_PULL", "%s", automatic ? "SYMM_PART == 4" : v->combine == SYMM_COMBINE_PULL ? "true" : "false");
    sg_vars_set(out, "COMBINE_ENUM", "%s",
                automatic ? "SYMM_COMBINE_AUTO" : v->combine == SYMM_COMBINE_PULL ? "SYMM_COMBINE_PULL" : "SYMM_COMBINE_PUSH");
    sg_vars_set(out, "COMBINE", "%s", sg_combine_name(v->combine));
    sg_vars_set(out, "COMBINE_ORDER_K", "%s", v->combine_order == SYMM_COMBINE_ORDER_K ? "true" : "false");
    sg_vars_set(out, "COMBINE_ORDER_ENUM", "%s",
                v->combine_order == SYMM_COMBINE_ORDER_K ? "SYMM_COMBINE_ORDER_K" : "SYMM_COMBINE_ORDER_RANK");
    sg_vars_set(out, "Y_WHERE", "%s",
                v->combine == SYMM_COMBINE_PULL
                    ? "inside this variant's symmetric buffer\n"
                      " * (combine = \"pull\": the peers read it there): the y of _recv, or its x\n"
                      " * itself when the dtypes agree"
                : automatic
                    ? "any device memory (combine = \"auto\": inside this variant's\n"
                      " * symmetric buffer, the y of _recv or its x itself when the dtypes agree,\n"
                      " * the peers read it there and combine pulls; anywhere else it pushes; every\n"
                      " * rank must place y alike in a call, else _stats reports SYMM_ERR_MISMATCH)"
                    : "any device memory (the x of _recv itself when the dtypes agree)");
    set_recv_vars(out, v);
    set_dispatch_vars(out, v);
    sg_vars_set(out, "SYMMETRIC_BYTES", "%llu", (unsigned long long)l.symmetric_bytes);
    sg_vars_set(out, "SCRATCH_BYTES", "%llu", (unsigned long long)l.scratch_bytes);
    set_region_vars(out, &l);

    static const char *const options[] = {SG_NVRTC_OPTIONS};
    strbuf opts = {0};
    sb_add(&opts, "%s", "");
    for (size_t k = 0; k < sizeof options / sizeof options[0]; k++)
        sb_add(&opts, "%s\"%s\"", k ? ", " : "", options[k]);
    sg_vars_set(out, "NVRTC_OPTIONS", "%s", opts.s);
    sg_vars_set(out, "N_NVRTC_OPTIONS", "%zu", sizeof options / sizeof options[0]);
    free(opts.s);
    return 0;
}
