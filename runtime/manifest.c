/* manifest.c: symm_manifest_* and symm_variant_open (symm_manifest.h). Reads
 * the manifest.json that symmgen writes (generator/manifest.c), checks every
 * variant with the generator's basic rules so that a hand-edited or damaged
 * manifest fails here with its field named rather than in a kernel, and turns
 * a variant into a symm_variant_desc whose CUDA source is checked against the
 * manifest's hash. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "json.h"
#include "sha256.h"
#include "symm_manifest.h"
#include "variant_internal.h"

/* Far above what a spec of the generator's most variants (16384) writes. */
#define MANIFEST_MAX_BYTES ((size_t)256 << 20)
#define SOURCE_MAX_BYTES ((size_t)256 << 20)
/* Variant names are C identifiers of at most this many characters (SG_NAME_MAX - 1). */
#define NAME_MAX_CHARS 63
/* An unknown name is answered with at most this many of the known ones. */
#define NAMES_LISTED 20

static const char *const nvrtc_options[] = {SYMM_NVRTC_DEFAULT_OPTIONS};

/* Region names as generator/layout.c writes them in the manifest, as
 * generator/vars.c names their constants in the CUDA source, and which buffer
 * each is in. */
static const struct {
    const char *name, *constant;
    int symmetric;
} region_info[SYMM_REGION_COUNT] = {
    [SYMM_REGION_SIGNALS] = {"signals", "SIGNALS", 1},
    [SYMM_REGION_COUNTS] = {"counts", "COUNTS", 1},
    [SYMM_REGION_RECV_X] = {"recv_x", "RECV_X", 1},
    [SYMM_REGION_RECV_SCALES] = {"recv_scales", "RECV_SCALES", 1},
    [SYMM_REGION_RECV_SRC] = {"recv_src", "RECV_SRC", 1},
    [SYMM_REGION_RECV_TOPK] = {"recv_topk_idx", "RECV_TOPK", 1},
    [SYMM_REGION_RECV_WEIGHTS] = {"recv_weights", "RECV_WEIGHTS", 1},
    [SYMM_REGION_COMBINE_IN] = {"combine_in", "COMBINE_IN", 1},
    [SYMM_REGION_STATE] = {"state", "STATE", 0},
    [SYMM_REGION_EXPERT_COUNT] = {"expert_count", "EXPERT_COUNT", 0},
    [SYMM_REGION_EXPERT_OFFSET] = {"expert_offset", "EXPERT_OFFSET", 0},
    [SYMM_REGION_TOKEN_ROUTE] = {"token_route", "TOKEN_ROUTE", 0},
    [SYMM_REGION_TOKEN_WEIGHTS] = {"token_weights", "TOKEN_WEIGHTS", 0},
    [SYMM_REGION_LAYOUT_WORK] = {"layout_work", "LAYOUT_WORK", 0},
    [SYMM_REGION_COMBINE_FLAGS] = {"combine_flags", "COMBINE_FLAGS", 1},
    [SYMM_REGION_RECV_CHAIN] = {"recv_chain", "RECV_CHAIN", 1},
    [SYMM_REGION_Y] = {"y", "Y", 1},
    [SYMM_REGION_CHAIN_READY] = {"chain_ready", "CHAIN_READY", 1},
};
#define REGION_NAMES "signals, counts, recv_x, recv_scales, recv_src, recv_topk_idx, recv_weights, " \
                     "combine_in, state, expert_count, expert_offset, token_route, token_weights, layout_work, combine_flags, " \
                     "recv_chain, y, chain_ready"

/* Indexed by symm_dtype, symm_layout and symm_combine_mode. */
static const char *const dtype_names[] = {"bf16", "fp16", "fp32", "fp8_e4m3"};
static const char *const layout_names[] = {"rank", "expert"};
static const char *const combine_names[] = {"push", "pull", "auto"};
/* Indexed by symm_combine_order. */
static const char *const combine_order_names[] = {"rank", "k"};

typedef struct entry {
    symm_variant_desc desc;
    char *name;
    char *cu_file;          /* relative to the manifest's directory */
    char source_sha256[SYMM_SHA256_HEX_SIZE];
    char *source;           /* read on the first symm_manifest_variant */
    /* Across hosts: a companion's parent ("companion_of"), or a variant's
     * companions ("companions": their entries, and the descriptors that
     * desc.companions points to once their sources are read). */
    char *companion_of;
    int n_companions;
    size_t *companion_entry;
    symm_variant_desc *companions;
} entry;

struct symm_manifest {
    char *path;
    char *dir;              /* the manifest's directory */
    char *symmgen_version;
    char *spec_file;
    entry *entries;
    size_t count;
};

/* Where a message comes from: the manifest's path, "variant NAME: " and,
 * inside a nested object, the start of the field's name ("regions[2]."). */
typedef struct reader {
    const char *path;
    char prefix[128];
    char field_prefix[48];
} reader;

/* --- reading fields --------------------------------------------------- */

/* A value as a message quotes it: numbers as written, strings quoted and
 * escaped (as generator/spec.c shows spec values), both cut at 40 bytes. */
static void show(const symm_json *v, char *buf, size_t n)
{
    const size_t cut = 40;
    size_t used = 0;
    switch (v->type) {
    case SYMM_JSON_NUMBER:
        snprintf(buf, n, "%.*s%s", (int)(v->len < cut ? v->len : cut), v->str, v->len > cut ? "..." : "");
        return;
    case SYMM_JSON_BOOL: snprintf(buf, n, "%s", v->boolean ? "true" : "false"); return;
    case SYMM_JSON_NULL: snprintf(buf, n, "null"); return;
    case SYMM_JSON_STRING: break;
    default: snprintf(buf, n, "%s", symm_json_type_name(v->type)); return;
    }
    used += (size_t)snprintf(buf, n, "\"");
    for (size_t i = 0; i < v->len && i < cut && used + 8 < n; i++) {
        unsigned char c = (unsigned char)v->str[i];
        if (c == '"' || c == '\\')
            used += (size_t)snprintf(buf + used, n - used, "\\%c", c);
        else if (c < 0x20 || c >= 0x7f)
            used += (size_t)snprintf(buf + used, n - used, "\\x%02x", c);
        else
            used += (size_t)snprintf(buf + used, n - used, "%c", c);
    }
    if (v->len > cut)
        snprintf(buf + used, n - used, "\"... (%zu bytes)", v->len);
    else
        snprintf(buf + used, n - used, "\"");
}

static symm_status field_error(const reader *r, const char *field, const symm_json *v, const char *fmt, ...)
    SYMM_PRINTF(4, 5);
static symm_status field_error(const reader *r, const char *field, const symm_json *v, const char *fmt, ...)
{
    char expected[512], got[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(expected, sizeof expected, fmt, ap);
    va_end(ap);
    if (!v)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %sfield %s%s: missing, expected %s", r->path, r->prefix,
                         r->field_prefix, field, expected);
    show(v, got, sizeof got);
    return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %sfield %s%s: got %s, expected %s", r->path, r->prefix,
                     r->field_prefix, field, got, expected);
}

/* obj's member called field (NULL when absent); a key given twice is an error. */
static symm_status find(const reader *r, const symm_json *obj, const char *field, const symm_json **out)
{
    int n;
    *out = symm_json_member(obj, field, &n);
    if (n > 1)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %sfield %s%s: given %d times, expected once", r->path,
                         r->prefix, r->field_prefix, field, n);
    return SYMM_OK;
}

static symm_status get_int(const reader *r, const symm_json *obj, const char *field, int64_t min, int64_t max,
                           int64_t *out)
{
    const symm_json *v;
    SYMM_TRY(find(r, obj, field, &v));
    if (v && v->type == SYMM_JSON_NUMBER && v->is_int && v->integer >= min && v->integer <= max) {
        *out = v->integer;
        return SYMM_OK;
    }
    if (max == INT64_MAX)
        return field_error(r, field, v, "an integer >= %lld", (long long)min);
    return field_error(r, field, v, "an integer %lld..%lld", (long long)min, (long long)max);
}

/* A string member (without NUL bytes, which C strings cannot carry). */
static symm_status get_string(const reader *r, const symm_json *obj, const char *field, const char *what,
                              const symm_json **out)
{
    SYMM_TRY(find(r, obj, field, out));
    if (!*out || (*out)->type != SYMM_JSON_STRING || strlen((*out)->str) != (*out)->len)
        return field_error(r, field, *out, "%s", what);
    return SYMM_OK;
}

static symm_status get_bool(const reader *r, const symm_json *obj, const char *field, int *out)
{
    const symm_json *v;
    SYMM_TRY(find(r, obj, field, &v));
    if (!v || v->type != SYMM_JSON_BOOL)
        return field_error(r, field, v, "true or false");
    *out = v->boolean;
    return SYMM_OK;
}

/* One of names[0..n) (its index in *out); why is appended to the list. */
static symm_status get_choice(const reader *r, const symm_json *obj, const char *field, const char *const *names,
                              int n, const char *why, int *out)
{
    const symm_json *v;
    SYMM_TRY(find(r, obj, field, &v));
    for (int i = 0; v && v->type == SYMM_JSON_STRING && i < n; i++) {
        if (strlen(names[i]) == v->len && strcmp(v->str, names[i]) == 0) {
            *out = i;
            return SYMM_OK;
        }
    }
    char list[256] = "";
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? (i == n - 1 ? " or " : ", ") : "",
                 names[i]);
    return field_error(r, field, v, "%s%s", list, why);
}

static bool is_hex64(const symm_json *v)
{
    if (v->len != 2 * SYMM_SHA256_SIZE)
        return false;
    for (size_t i = 0; i < v->len; i++) {
        char c = v->str[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
    }
    return true;
}

static bool is_identifier(const char *s)
{
    if (!*s || (*s >= '0' && *s <= '9'))
        return false;
    for (; *s; s++) {
        char c = *s;
        if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
            return false;
    }
    return true;
}

/* --- one variant ------------------------------------------------------ */

typedef struct params {
    int64_t hidden, topk, experts, world, max_tokens, capacity, worst_capacity, align, sms;
    int64_t symmetric_bytes, scratch_bytes;
    int dtype, combine_dtype, layout, weights, combine, combine_order;
} params;

static symm_status read_params(const reader *r, const symm_json *obj, params *p)
{
    SYMM_TRY(get_int(r, obj, "hidden", 1, 1048576, &p->hidden));
    SYMM_TRY(get_int(r, obj, "topk", 1, 65536, &p->topk));
    SYMM_TRY(get_int(r, obj, "experts", 1, 65536, &p->experts));
    /* World 1: a companion of one rank a host (checked in read_variant). */
    SYMM_TRY(get_int(r, obj, "world", 1, 65536, &p->world));
    SYMM_TRY(get_int(r, obj, "max_tokens", 1, 1048576, &p->max_tokens));
    SYMM_TRY(get_choice(r, obj, "dtype", dtype_names, 4, "", &p->dtype));
    SYMM_TRY(get_choice(r, obj, "combine_dtype", dtype_names, 3, " (fp8_e4m3 is a dispatch dtype only)",
                        &p->combine_dtype));
    SYMM_TRY(get_choice(r, obj, "layout", layout_names, 2, "", &p->layout));
    SYMM_TRY(get_bool(r, obj, "weights", &p->weights));
    /* "combine" came with combine = "pull"; a manifest without it pushes. */
    p->combine = SYMM_COMBINE_PUSH;
    if (symm_json_member(obj, "combine", NULL))
        SYMM_TRY(get_choice(r, obj, "combine", combine_names, 3, "", &p->combine));
    /* "combine_order" is "rank" unless given; the source's constant is
     * checked against it at open, so a manifest of an older order is refused. */
    p->combine_order = SYMM_COMBINE_ORDER_RANK;
    if (symm_json_member(obj, "combine_order", NULL))
        SYMM_TRY(get_choice(r, obj, "combine_order", combine_order_names, 2, "", &p->combine_order));
    SYMM_TRY(get_int(r, obj, "capacity", 1, INT32_MAX, &p->capacity));
    SYMM_TRY(get_int(r, obj, "worst_capacity", 1, INT32_MAX, &p->worst_capacity));
    SYMM_TRY(get_int(r, obj, "align", 1, 4096, &p->align));
    SYMM_TRY(get_int(r, obj, "sms", 1, 1024, &p->sms));
    SYMM_TRY(get_int(r, obj, "symmetric_bytes", 1, INT64_MAX, &p->symmetric_bytes));
    SYMM_TRY(get_int(r, obj, "scratch_bytes", 1, INT64_MAX, &p->scratch_bytes));
    return SYMM_OK;
}

/* The generator's rules between fields (generator/spec.c, layout.c). */
static symm_status check_combinations(const reader *r, const symm_json *obj, const params *p)
{
    const symm_json *v;
    if (p->topk > p->experts)
        return field_error(r, "topk", symm_json_member(obj, "topk", NULL), "1..%lld (at most experts)",
                           (long long)p->experts);
    if (p->experts % p->world != 0)
        return field_error(r, "experts", symm_json_member(obj, "experts", NULL), "a multiple of world (%lld)",
                           (long long)p->world);
    int64_t local = p->experts / p->world;
    SYMM_TRY(find(r, obj, "local_experts", &v));
    if (v && !(v->type == SYMM_JSON_NUMBER && v->is_int && v->integer == local))
        return field_error(r, "local_experts", v, "%lld (experts / world)", (long long)local);
    int need = 16 / symm_dtype_size((symm_dtype)p->dtype), cneed = 16 / symm_dtype_size((symm_dtype)p->combine_dtype);
    if (p->dtype == SYMM_DTYPE_FP8_E4M3)
        need = SYMM_FP8_BLOCK;
    if (p->hidden % need != 0 || p->hidden % cneed != 0)
        return field_error(r, "hidden", symm_json_member(obj, "hidden", NULL),
                           "a multiple of %d for dtype %s and combine_dtype %s", need > cneed ? need : cneed,
                           dtype_names[p->dtype], dtype_names[p->combine_dtype]);
    if (p->layout == SYMM_LAYOUT_RANK && p->align != 1)
        return field_error(r, "align", symm_json_member(obj, "align", NULL),
                           "1 (align applies only to layout \"expert\")");
    if (p->layout == SYMM_LAYOUT_EXPERT && p->combine == SYMM_COMBINE_AUTO)
        return field_error(r, "combine", symm_json_member(obj, "combine", NULL),
                           "push or pull with layout expert (auto is for layout rank only)");
    /* Bounded by the ranges above: at most 2^52 rows, no overflow. */
    int64_t worst = p->world * p->max_tokens;
    if (p->layout == SYMM_LAYOUT_EXPERT)
        worst = worst * (p->topk < local ? p->topk : local) + local * (p->align - 1);
    if (p->worst_capacity != worst)
        return field_error(r, "worst_capacity", symm_json_member(obj, "worst_capacity", NULL), "%lld (%s)",
                           (long long)worst,
                           p->layout == SYMM_LAYOUT_RANK
                               ? "world * max_tokens"
                               : "world * max_tokens * min(topk, experts/world) + (experts/world) * (align - 1)");
    if (p->capacity > p->worst_capacity)
        return field_error(r, "capacity", symm_json_member(obj, "capacity", NULL), "1..%lld (at most worst_capacity)",
                           (long long)p->worst_capacity);
    return SYMM_OK;
}

static int region_id(const symm_json *name)
{
    for (int i = 0; i < SYMM_REGION_COUNT; i++)
        if (strlen(region_info[i].name) == name->len && strcmp(region_info[i].name, name->str) == 0)
            return i;
    return -1;
}

/* regions[i]: a known, not yet listed region, in its own buffer's bounds. */
static symm_status read_region(const reader *r, const symm_json *obj, size_t i, symm_variant_desc *d, bool *listed)
{
    reader sub = *r;
    snprintf(sub.field_prefix, sizeof sub.field_prefix, "regions[%zu]", i);
    if (obj->type != SYMM_JSON_OBJECT)
        return field_error(&sub, "", obj, "an object {\"name\", \"offset\", \"bytes\", \"symmetric\"}");
    snprintf(sub.field_prefix, sizeof sub.field_prefix, "regions[%zu].", i);
    const symm_json *name;
    SYMM_TRY(get_string(&sub, obj, "name", "one of " REGION_NAMES, &name));
    int id = region_id(name);
    if (id < 0)
        return field_error(&sub, "name", name, "one of " REGION_NAMES);
    if (listed[id])
        return field_error(&sub, "name", name, "a region not listed before");
    listed[id] = true;
    int64_t offset, bytes;
    int symmetric;
    SYMM_TRY(get_int(&sub, obj, "offset", 0, INT64_MAX, &offset));
    SYMM_TRY(get_int(&sub, obj, "bytes", 0, INT64_MAX, &bytes));
    SYMM_TRY(get_bool(&sub, obj, "symmetric", &symmetric));
    const char *where = region_info[id].symmetric ? "symmetric buffer" : "local scratch";
    if (symmetric != region_info[id].symmetric)
        return field_error(&sub, "symmetric", symm_json_member(obj, "symmetric", NULL), "%s (%s lives in the %s)",
                           region_info[id].symmetric ? "true" : "false", region_info[id].name, where);
    uint64_t limit = symmetric ? d->symmetric_bytes : d->scratch_bytes;
    if ((uint64_t)offset > limit || (uint64_t)bytes > limit - (uint64_t)offset)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "%s: %sfield regions[%zu]: got %s at offset %lld with %lld bytes, expected it to end "
                         "within the %s (%s %llu)", r->path, r->prefix, i, region_info[id].name,
                         (long long)offset, (long long)bytes, where,
                         symmetric ? "symmetric_bytes" : "scratch_bytes", (unsigned long long)limit);
    d->regions[id].offset = (uint64_t)offset;
    d->regions[id].bytes = (uint64_t)bytes;
    return SYMM_OK;
}

static symm_status check_overlaps(const reader *r, const symm_variant_desc *d)
{
    for (int a = 0; a < SYMM_REGION_COUNT; a++) {
        for (int b = a + 1; b < SYMM_REGION_COUNT; b++) {
            const symm_region_desc *x = &d->regions[a], *y = &d->regions[b];
            if (!x->bytes || !y->bytes || x->symmetric != y->symmetric)
                continue;
            if (x->offset < y->offset + y->bytes && y->offset < x->offset + x->bytes)
                return symm_fail(SYMM_ERR_INVALID_ARG,
                                 "%s: %sfield regions: %s [%llu, %llu) overlaps %s [%llu, %llu) in the %s",
                                 r->path, r->prefix, region_info[a].name, (unsigned long long)x->offset,
                                 (unsigned long long)(x->offset + x->bytes), region_info[b].name,
                                 (unsigned long long)y->offset, (unsigned long long)(y->offset + y->bytes),
                                 x->symmetric ? "symmetric buffer" : "local scratch");
        }
    }
    return SYMM_OK;
}

static symm_status read_regions(const reader *r, const symm_json *obj, symm_variant_desc *d)
{
    const symm_json *list;
    SYMM_TRY(find(r, obj, "regions", &list));
    if (!list || list->type != SYMM_JSON_ARRAY)
        return field_error(r, "regions", list, "an array of {\"name\", \"offset\", \"bytes\", \"symmetric\"}");
    bool listed[SYMM_REGION_COUNT] = {false};
    for (int id = 0; id < SYMM_REGION_COUNT; id++)
        d->regions[id] = (symm_region_desc){.offset = 0, .bytes = 0, .symmetric = region_info[id].symmetric};
    size_t i = 0;
    for (const symm_json *el = list->first; el; el = el->next, i++)
        SYMM_TRY(read_region(r, el, i, d, listed));
    return check_overlaps(r, d);
}

static char *copy_string(const char *s)
{
    size_t n = strlen(s) + 1;
    char *c = malloc(n);
    return c ? memcpy(c, s, n) : NULL;
}

/* A path that cannot leave the manifest's directory: relative, no ".."
 * component, no NUL (which would cut it). */
static bool path_stays_inside(const symm_json *v)
{
    if (v->len == 0 || strlen(v->str) != v->len || v->str[0] == '/')
        return false;
    for (const char *p = v->str; *p;) {
        size_t n = strcspn(p, "/");
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return false;
        p += n;
        p += *p == '/';
    }
    return true;
}

static symm_status read_files(const reader *r, const symm_json *obj, entry *e)
{
    const symm_json *files, *cu, *sha, *content;
    SYMM_TRY(find(r, obj, "files", &files));
    if (!files || files->type != SYMM_JSON_OBJECT)
        return field_error(r, "files", files, "an object {\"cu\": \"NAME.cu\", ...}");
    reader sub = *r;
    snprintf(sub.field_prefix, sizeof sub.field_prefix, "files.");
    SYMM_TRY(get_string(&sub, files, "cu", "the name of the variant's .cu file", &cu));
    if (!path_stays_inside(cu))
        return field_error(&sub, "cu", cu, "a path inside the manifest's directory (relative, without \"..\")");
    SYMM_TRY(get_string(r, obj, "source_sha256", "64 lowercase hex digits", &sha));
    if (!is_hex64(sha))
        return field_error(r, "source_sha256", sha, "64 lowercase hex digits");
    SYMM_TRY(find(r, obj, "content_sha256", &content));
    if (content && (content->type != SYMM_JSON_STRING || !is_hex64(content)))
        return field_error(r, "content_sha256", content, "64 lowercase hex digits");
    memcpy(e->source_sha256, sha->str, SYMM_SHA256_HEX_SIZE);
    e->cu_file = copy_string(cu->str);
    return e->cu_file ? SYMM_OK : symm_fail(SYMM_ERR_NOMEM, "symm_manifest_open: out of host memory");
}

/* "companion_of" and "hosts" of a companion; "companions" of a variant
 * with hosts (checked against the companions' entries in link_companions). */
static symm_status read_hosts(const reader *r, const symm_json *obj, entry *e)
{
    const symm_json *of, *list;
    SYMM_TRY(find(r, obj, "companion_of", &of));
    if (of) {
        SYMM_TRY(get_string(r, obj, "companion_of", "the name of the variant this one is a companion of", &of));
        int64_t hosts;
        SYMM_TRY(get_int(r, obj, "hosts", 2, 128, &hosts));
        e->desc.hosts = (int)hosts;
        e->companion_of = copy_string(of->str);
        if (!e->companion_of)
            return symm_fail(SYMM_ERR_NOMEM, "symm_manifest_open: out of host memory");
    } else if (symm_json_member(obj, "hosts", NULL)) {
        return field_error(r, "hosts", symm_json_member(obj, "hosts", NULL),
                           "no \"hosts\" outside a companion (one with \"companion_of\")");
    }
    SYMM_TRY(find(r, obj, "companions", &list));
    if (!list)
        return SYMM_OK;
    if (list->type != SYMM_JSON_ARRAY || list->count == 0 || list->count > 16 || of)
        return field_error(r, "companions", list, "%s", of ? "none in a companion"
                                                           : "an array of 1..16 {\"hosts\", \"name\"} objects");
    e->companion_entry = calloc(list->count, sizeof *e->companion_entry);
    if (!e->companion_entry)
        return symm_fail(SYMM_ERR_NOMEM, "symm_manifest_open: out of host memory");
    /* The names are resolved once every entry is read: stash each one's
     * position in the array as its index for now. */
    for (const symm_json *c = list->first; c; c = c->next) {
        int64_t hosts;
        const symm_json *name;
        reader sub = *r;
        snprintf(sub.field_prefix, sizeof sub.field_prefix, "companions[%d].", e->n_companions);
        if (c->type != SYMM_JSON_OBJECT)
            return field_error(r, "companions", c, "objects {\"hosts\": H, \"name\": NAME}");
        SYMM_TRY(get_int(&sub, c, "hosts", 2, 128, &hosts));
        SYMM_TRY(get_string(&sub, c, "name", "the companion's variant name", &name));
        (void)hosts;
        e->companion_entry[e->n_companions++] = (size_t)-1;
    }
    return SYMM_OK;
}

static symm_status read_variant(reader *r, const symm_json *obj, size_t index, entry *e)
{
    snprintf(r->prefix, sizeof r->prefix, "variants[%zu]: ", index);
    if (obj->type != SYMM_JSON_OBJECT) {
        r->prefix[0] = '\0';
        char field[48];
        snprintf(field, sizeof field, "variants[%zu]", index);
        return field_error(r, field, obj, "an object (one variant)");
    }
    const symm_json *name;
    SYMM_TRY(get_string(r, obj, "name", "a C identifier", &name));
    if (!is_identifier(name->str) || name->len > NAME_MAX_CHARS)
        return field_error(r, "name", name, "a C identifier of at most %d characters", NAME_MAX_CHARS);
    snprintf(r->prefix, sizeof r->prefix, "variant %s: ", name->str);
    e->name = copy_string(name->str);
    if (!e->name)
        return symm_fail(SYMM_ERR_NOMEM, "symm_manifest_open: out of host memory");

    params p;
    SYMM_TRY(read_params(r, obj, &p));
    SYMM_TRY(check_combinations(r, obj, &p));
    symm_variant_desc *d = &e->desc;
    *d = (symm_variant_desc){
        .abi = SYMM_DESC_ABI,
        .name = e->name,
        .hidden = (int)p.hidden,
        .topk = (int)p.topk,
        .experts = (int)p.experts,
        .world = (int)p.world,
        .max_tokens = (int)p.max_tokens,
        .dtype = (symm_dtype)p.dtype,
        .combine_dtype = (symm_dtype)p.combine_dtype,
        .layout = (symm_layout)p.layout,
        .weights = p.weights,
        .combine = (symm_combine_mode)p.combine,
        .combine_order = (symm_combine_order)p.combine_order,
        .align = (int)p.align,
        .sms = (int)p.sms,
        .capacity = p.capacity,
        .worst_capacity = p.worst_capacity,
        .symmetric_bytes = (uint64_t)p.symmetric_bytes,
        .scratch_bytes = (uint64_t)p.scratch_bytes,
        .source_sha256 = e->source_sha256,
        .nvrtc_options = nvrtc_options,
        .n_nvrtc_options = (int)SYMM_ARRAY_LEN(nvrtc_options),
    };
    SYMM_TRY(read_regions(r, obj, d));
    SYMM_TRY(read_hosts(r, obj, e));
    if (d->world == 1 && !e->companion_of)
        return field_error(r, "world", symm_json_member(obj, "world", NULL),
                           "an integer 2..65536 (world 1 only in a companion, with \"companion_of\")");
    return read_files(r, obj, e);
}

/* --- the manifest ----------------------------------------------------- */

/* The whole of a regular file, NUL-terminated. what starts the messages. */
static symm_status read_file(const char *path, size_t max, const char *what, char **out, size_t *out_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return symm_fail(SYMM_ERR_SYSTEM, "%s: cannot open %s: %s", what, path, strerror(errno));
    struct stat sb;
    symm_status st = SYMM_OK;
    if (fstat(fd, &sb) != 0)
        st = symm_fail(SYMM_ERR_SYSTEM, "%s: cannot stat %s: %s", what, path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = symm_fail(SYMM_ERR_SYSTEM, "%s: %s is not a regular file", what, path);
    else if ((uint64_t)sb.st_size > max)
        st = symm_fail(SYMM_ERR_SYSTEM, "%s: %s has %lld bytes, expected at most %zu", what, path,
                       (long long)sb.st_size, max);
    size_t cap = st == SYMM_OK ? (size_t)sb.st_size + 1 : 0, len = 0;
    char *buf = cap ? malloc(cap) : NULL;
    if (st == SYMM_OK && !buf)
        st = symm_fail(SYMM_ERR_NOMEM, "%s: out of host memory for %s", what, path);
    while (st == SYMM_OK && len < cap - 1) {
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n == 0)
            break;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            st = symm_fail(SYMM_ERR_SYSTEM, "%s: cannot read %s: %s", what, path, strerror(errno));
        else
            len += (size_t)n;
    }
    close(fd);
    if (st != SYMM_OK) {
        free(buf);
        return st;
    }
    buf[len] = '\0';
    *out = buf;
    *out_len = len;
    return SYMM_OK;
}

typedef struct named {
    const char *name;
    size_t index;
} named;

static int by_name(const void *a, const void *b)
{
    const named *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

static symm_status check_unique_names(const symm_manifest *m)
{
    if (m->count < 2)
        return SYMM_OK;
    named *sorted = malloc(m->count * sizeof *sorted);
    if (!sorted)
        return symm_fail(SYMM_ERR_NOMEM, "symm_manifest_open: out of host memory");
    for (size_t i = 0; i < m->count; i++)
        sorted[i] = (named){m->entries[i].name, i};
    qsort(sorted, m->count, sizeof *sorted, by_name);
    symm_status st = SYMM_OK;
    for (size_t i = 1; i < m->count && st == SYMM_OK; i++)
        if (strcmp(sorted[i].name, sorted[i - 1].name) == 0)
            st = symm_fail(SYMM_ERR_INVALID_ARG,
                           "%s: variants[%zu]: field name: got \"%s\", expected a name not used before "
                           "(variants[%zu] has it)", m->path, sorted[i].index, sorted[i].name, sorted[i - 1].index);
    free(sorted);
    return st;
}

/* e's "companions" (list) to their entries: each names a companion of e
 * ("companion_of" e, the same "hosts") whose parameters are e's on one host
 * (world / H, experts / H, H * max_tokens, the rest equal). */
static symm_status link_companions(symm_manifest *m, entry *e, const symm_json *list)
{
    if (!list)
        return SYMM_OK;
    int i = 0;
    for (const symm_json *c = list->first; c; c = c->next, i++) {
        const symm_json *name = symm_json_member(c, "name", NULL), *hosts = symm_json_member(c, "hosts", NULL);
        const int H = (int)hosts->integer;
        size_t k = 0;
        while (k < m->count && strcmp(m->entries[k].name, name->str) != 0)
            k++;
        const char *why = NULL;
        const symm_variant_desc *p = &e->desc, *d = k < m->count ? &m->entries[k].desc : NULL;
        if (!d)
            why = "no variant of that name in the manifest";
        else if (!m->entries[k].companion_of || strcmp(m->entries[k].companion_of, e->name) != 0)
            why = "that variant is not a companion of this one (its \"companion_of\" differs)";
        else if (d->hosts != H)
            why = "that companion's \"hosts\" differs";
        else if (d->world * H != p->world || d->experts * H != p->experts ||
                 d->max_tokens != (int64_t)H * p->max_tokens || d->hidden != p->hidden || d->topk != p->topk ||
                 d->dtype != p->dtype || d->combine_dtype != p->combine_dtype || d->layout != p->layout ||
                 d->weights != p->weights || d->align != p->align || d->combine != p->combine ||
                 d->combine_order != p->combine_order || d->capacity != p->capacity)
            why = "its parameters are not this variant's on one host (world / hosts, experts / hosts, "
                  "hosts * max_tokens, the rest equal)";
        for (int j = 0; !why && j < i; j++)
            if (m->entries[e->companion_entry[j]].desc.hosts == H)
                why = "a second companion of the same host count";
        if (why)
            return symm_fail(SYMM_ERR_INVALID_ARG, "%s: variant %s: field companions[%d]: {\"hosts\": %d, "
                             "\"name\": \"%s\"}: %s", m->path, e->name, i, H, name->str, why);
        e->companion_entry[i] = k;
    }
    return SYMM_OK;
}

static symm_status read_format(const reader *r, const symm_json *root)
{
    const symm_json *v;
    SYMM_TRY(find(r, root, "format", &v));
    if (!v || v->type != SYMM_JSON_NUMBER || !v->is_int)
        return field_error(r, "format", v, "an integer (the manifest format version; this libsymm reads %d)",
                           SYMM_MANIFEST_FORMAT);
    if (v->integer != SYMM_MANIFEST_FORMAT)
        return symm_fail(SYMM_ERR_UNSUPPORTED,
                         "%s: manifest format %lld: this libsymm (%s) reads format %d; use a symmgen and a "
                         "libsymm of matching versions", r->path, (long long)v->integer, SYMM_VERSION,
                         SYMM_MANIFEST_FORMAT);
    return SYMM_OK;
}

static symm_status build(symm_manifest *m, const symm_json *root)
{
    reader r = {.path = m->path};
    if (root->type != SYMM_JSON_OBJECT)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: got %s at the top, expected an object (a symmgen manifest)",
                         m->path, symm_json_type_name(root->type));
    SYMM_TRY(read_format(&r, root));
    const symm_json *version, *spec, *variants;
    SYMM_TRY(get_string(&r, root, "symmgen", "the version of symmgen that wrote the manifest", &version));
    SYMM_TRY(get_string(&r, root, "spec", "the path of the spec", &spec));
    SYMM_TRY(find(&r, root, "variants", &variants));
    if (!variants || variants->type != SYMM_JSON_ARRAY)
        return field_error(&r, "variants", variants, "an array of variants");
    m->symmgen_version = copy_string(version->str);
    m->spec_file = copy_string(spec->str);
    m->entries = variants->count ? calloc(variants->count, sizeof *m->entries) : NULL;
    if (!m->symmgen_version || !m->spec_file || (variants->count && !m->entries))
        return symm_fail(SYMM_ERR_NOMEM, "symm_manifest_open: out of host memory");
    size_t i = 0;
    for (const symm_json *v = variants->first; v; v = v->next, i++) {
        m->count = i + 1;
        SYMM_TRY(read_variant(&r, v, i, &m->entries[i]));
        m->entries[i].desc.spec_file = m->spec_file;
        m->entries[i].desc.symmgen_version = m->symmgen_version;
    }
    SYMM_TRY(check_unique_names(m));
    i = 0;
    for (const symm_json *v = variants->first; v; v = v->next, i++)
        SYMM_TRY(link_companions(m, &m->entries[i], symm_json_member(v, "companions", NULL)));
    return SYMM_OK;
}

static char *directory_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return copy_string(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *dir = malloc(n + 1);
    if (dir) {
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    return dir;
}

symm_status symm_manifest_open(const char *path, symm_manifest **out)
{
    if (!out)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_manifest_open: out is NULL");
    *out = NULL;
    if (!path)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_manifest_open: path is NULL");
    char *text;
    size_t len;
    SYMM_TRY(read_file(path, MANIFEST_MAX_BYTES, "symm_manifest_open", &text, &len));
    symm_json_doc *doc;
    int line, col;
    char why[256];
    int rc = symm_json_parse(text, len, &doc, &line, &col, why, sizeof why);
    free(text);
    if (rc == SYMM_JSON_NOMEM)
        return symm_fail(SYMM_ERR_NOMEM, "symm_manifest_open: %s: out of host memory", path);
    if (rc == SYMM_JSON_TOO_LARGE)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s:%d:%d: %s", path, line, col, why);
    if (rc != SYMM_JSON_OK)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s:%d:%d: JSON syntax error: %s", path, line, col, why);
    symm_manifest *m = calloc(1, sizeof *m);
    symm_status st = SYMM_OK;
    if (m)
        m->path = copy_string(path);
    if (m && m->path)
        m->dir = directory_of(path);
    if (!m || !m->path || !m->dir)
        st = symm_fail(SYMM_ERR_NOMEM, "symm_manifest_open: out of host memory");
    if (st == SYMM_OK)
        st = build(m, symm_json_root(doc));
    symm_json_free(doc);
    if (st != SYMM_OK) {
        symm_manifest_close(m);
        return st;
    }
    *out = m;
    return SYMM_OK;
}

symm_status symm_manifest_close(symm_manifest *m)
{
    if (!m)
        return SYMM_OK;
    for (size_t i = 0; i < m->count; i++) {
        free(m->entries[i].name);
        free(m->entries[i].cu_file);
        free(m->entries[i].source);
        free(m->entries[i].companion_of);
        free(m->entries[i].companion_entry);
        free(m->entries[i].companions);
    }
    free(m->entries);
    free(m->symmgen_version);
    free(m->spec_file);
    free(m->dir);
    free(m->path);
    free(m);
    return SYMM_OK;
}

size_t symm_manifest_count(const symm_manifest *m) { return m ? m->count : 0; }

const char *symm_manifest_name(const symm_manifest *m, size_t i)
{
    return m && i < m->count ? m->entries[i].name : NULL;
}

/* --- one variant's descriptor ----------------------------------------- */

static symm_status unknown_name(const symm_manifest *m, const char *name)
{
    char list[2048] = "";
    size_t used = 0;
    for (size_t i = 0; i < m->count && i < NAMES_LISTED; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", m->entries[i].name);
    if (m->count > NAMES_LISTED)
        snprintf(list + used, sizeof list - used, ", ... (%zu in all)", m->count);
    if (!m->count)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: no variant \"%.80s\": the manifest has no variants", m->path,
                         name);
    return symm_fail(SYMM_ERR_INVALID_ARG, "%s: no variant \"%.80s\": expected one of %s", m->path, name, list);
}

/* One constant of the generated source: the line "<decl><value><suffix>"
 * must be there. */
static symm_status check_constant(const symm_variant_desc *d, const char *decl, const char *field,
                                  const char *value, const char *suffix)
{
    char line[96], want[96];
    snprintf(line, sizeof line, "\n%s", decl);
    snprintf(want, sizeof want, "%s%s", value, suffix);
    const char *at = strstr(d->source, line);
    if (!at)
        return symm_fail(SYMM_ERR_MISMATCH,
                         "symm_variant_create: variant %s: its CUDA source declares no \"%s\" (descriptor "
                         "field %s: %s): regenerate the manifest and sources together with symmgen",
                         d->name, decl, field, value);
    const char *got = at + strlen(line);
    size_t n = strcspn(got, "\n");
    if (n != strlen(want) || memcmp(got, want, n) != 0)
        return symm_fail(SYMM_ERR_MISMATCH,
                         "symm_variant_create: variant %s: descriptor field %s is %s, its CUDA source was "
                         "generated with \"%s%.*s\": regenerate the manifest and sources together with symmgen",
                         d->name, field, value, decl, (int)(n > 64 ? 64 : n), got);
    return SYMM_OK;
}

const char *symm_region_name(int id)
{
    return id >= 0 && id < SYMM_REGION_COUNT ? region_info[id].name : "?";
}

symm_status symm_desc_check_source(const symm_variant_desc *d)
{
    char value[64];
    const struct {
        const char *decl, *field;
        long long value;
    } ints[] = {
        {"constexpr int HIDDEN = ", "hidden", d->hidden},
        {"constexpr int TOPK = ", "topk", d->topk},
        {"constexpr int EXPERTS = ", "experts", d->experts},
        {"constexpr int WORLD = ", "world", d->world},
        {"constexpr int MAX_TOKENS = ", "max_tokens", d->max_tokens},
        {"constexpr i64 CAPACITY = ", "capacity", (long long)d->capacity},
        {"constexpr int ALIGN = ", "align", d->align},
        {"constexpr int SMS = ", "sms", d->sms},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        snprintf(value, sizeof value, "%lld", ints[i].value);
        SYMM_TRY(check_constant(d, ints[i].decl, ints[i].field, value, ";"));
    }
    SYMM_TRY(check_constant(d, "constexpr bool LAYOUT_EXPERT = ", "layout",
                            d->layout == SYMM_LAYOUT_EXPERT ? "true" : "false", ";"));
    SYMM_TRY(check_constant(d, "constexpr bool WEIGHTS = ", "weights", d->weights ? "true" : "false", ";"));
    /* combine = "auto": the source's form is the program's (part 4 pulls). */
    SYMM_TRY(check_constant(d, "constexpr bool COMBINE_AUTO = ", "combine",
                            d->combine == SYMM_COMBINE_AUTO ? "true" : "false", ";"));
    SYMM_TRY(check_constant(d, "constexpr bool COMBINE_PULL = ", "combine",
                            d->combine == SYMM_COMBINE_AUTO   ? "SYMM_PART == 4"
                            : d->combine == SYMM_COMBINE_PULL ? "true"
                                                              : "false",
                            ";"));
    SYMM_TRY(check_constant(d, "constexpr bool COMBINE_ORDER_K = ", "combine_order",
                            d->combine_order == SYMM_COMBINE_ORDER_K ? "true" : "false", ";"));
    snprintf(value, sizeof value, "Dtype(%d)", (int)d->dtype);
    SYMM_TRY(check_constant(d, "constexpr Dtype DTYPE = ", "dtype", value, ";"));
    snprintf(value, sizeof value, "Dtype(%d)", (int)d->combine_dtype);
    SYMM_TRY(check_constant(d, "constexpr Dtype COMBINE_DTYPE = ", "combine_dtype", value, ";"));
    /* The kernels place the profile's spans (PROFILE=2) after the scratch. */
    snprintf(value, sizeof value, "%llu", (unsigned long long)d->scratch_bytes);
    SYMM_TRY(check_constant(d, "constexpr u64 SCRATCH_BYTES = ", "scratch_bytes", value, ";"));
    for (int i = 0; i < SYMM_REGION_COUNT; i++) {
        const symm_region_desc *r = &d->regions[i];
        char decl[64], field[64];
        snprintf(decl, sizeof decl, "constexpr u64 %s_OFF = ", region_info[i].constant);
        snprintf(field, sizeof field, "regions.%s.offset", region_info[i].name);
        snprintf(value, sizeof value, "%llu", (unsigned long long)r->offset);
        SYMM_TRY(check_constant(d, decl, field, value, r->symmetric ? "; // symmetric" : "; // local scratch"));
        snprintf(decl, sizeof decl, "constexpr u64 %s_BYTES = ", region_info[i].constant);
        snprintf(field, sizeof field, "regions.%s.bytes", region_info[i].name);
        snprintf(value, sizeof value, "%llu", (unsigned long long)r->bytes);
        SYMM_TRY(check_constant(d, decl, field, value, ";"));
    }
    return SYMM_OK;
}

/* Read the variant's .cu and check it is the source the manifest describes. */
static symm_status load_source(const symm_manifest *m, entry *e)
{
    size_t n = strlen(m->dir) + strlen(e->cu_file) + 2;
    char *file = malloc(n), what[512];
    if (!file)
        return symm_fail(SYMM_ERR_NOMEM, "symm_manifest_variant: out of host memory");
    snprintf(file, n, "%s/%s", m->dir, e->cu_file);
    snprintf(what, sizeof what, "%s: variant %s", m->path, e->name);
    char *source;
    size_t len;
    symm_status st = read_file(file, SOURCE_MAX_BYTES, what, &source, &len);
    free(file);
    SYMM_TRY(st);
    char hex[SYMM_SHA256_HEX_SIZE];
    symm_sha256_hex_of(source, len, hex);
    if (strcmp(hex, e->source_sha256) != 0)
        st = symm_fail(SYMM_ERR_MISMATCH,
                       "%s: %s does not match the manifest (sha256 %.12s... expected %.12s...): regenerate "
                       "the variant with symmgen", what, e->cu_file, hex, e->source_sha256);
    else if (memchr(source, '\0', len))
        st = symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s holds a NUL byte, expected CUDA source text", what,
                       e->cu_file);
    if (st != SYMM_OK) {
        free(source);
        return st;
    }
    e->source = source;
    e->desc.source = source;
    e->desc.source_len = len;
    return SYMM_OK;
}

symm_status symm_manifest_variant(symm_manifest *m, const char *name, const symm_variant_desc **out)
{
    if (!out)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_manifest_variant: out is NULL");
    *out = NULL;
    if (!m || !name)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_manifest_variant: %s is NULL", m ? "name" : "manifest");
    entry *e = NULL;
    for (size_t i = 0; i < m->count && !e; i++)
        if (strcmp(m->entries[i].name, name) == 0)
            e = &m->entries[i];
    if (!e)
        return unknown_name(m, name);
    if (!e->source)
        SYMM_TRY(load_source(m, e));
    if (e->n_companions > 0 && e->n_companions <= 16 && !e->companions) {
        /* The companions' sources too; their descriptors copied into one
         * array, as a stub holds them. */
        for (int i = 0; i < e->n_companions; i++)
            if (!m->entries[e->companion_entry[i]].source)
                SYMM_TRY(load_source(m, &m->entries[e->companion_entry[i]]));
        e->companions = calloc((size_t)e->n_companions, sizeof *e->companions);
        if (!e->companions)
            return symm_fail(SYMM_ERR_NOMEM, "symm_manifest_variant: out of host memory");
        for (int i = 0; i < e->n_companions; i++)
            e->companions[i] = m->entries[e->companion_entry[i]].desc;
        e->desc.companions = e->companions;
        e->desc.n_companions = e->n_companions;
    }
    *out = &e->desc;
    return SYMM_OK;
}

static void close_manifest(void *m) { (void)symm_manifest_close(m); }

symm_status symm_variant_open(symm_world *world, const char *manifest_path, const char *name,
                              const symm_variant_options *opts, symm_variant **out)
{
    if (!out)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_variant_open: out is NULL");
    *out = NULL;
    if (!world || !manifest_path || !name)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_variant_open: %s is NULL",
                         !world ? "world" : !manifest_path ? "manifest_path" : "name");
    symm_manifest *m;
    SYMM_TRY(symm_manifest_open(manifest_path, &m));
    const symm_variant_desc *desc;
    symm_status st = symm_manifest_variant(m, name, &desc);
    if (st == SYMM_OK)
        st = symm_variant_create(world, desc, opts, out);
    if (st != SYMM_OK) {
        symm_manifest_close(m);
        return st;
    }
    /* The descriptor lives in m: the variant closes it when it is destroyed. */
    (*out)->on_destroy = close_manifest;
    (*out)->on_destroy_arg = m;
    return SYMM_OK;
}
