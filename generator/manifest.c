/* manifest.c: what symmgen tells build systems and test matrices about the
 * variants: manifest.json in every output directory, `--list --json` (the
 * same variant objects) and the `--list` table. Deterministic: keys in a fixed
 * order, no timestamps, 2-space indentation, one trailing newline. */
#include <stdio.h>
#include <string.h>

#include "sg.h"

void sg_json_string(const char *s, sg_buf *out)
{
    sg_buf_puts(out, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            sg_buf_printf(out, "\\%c", *p);
        else if (*p == '\n')
            sg_buf_puts(out, "\\n");
        else if (*p < 0x20 || *p == 0x7f)
            sg_buf_printf(out, "\\u%04x", *p);
        else
            sg_buf_append(out, p, 1);
    }
    sg_buf_puts(out, "\"");
}

/* A small writer for objects and arrays: every member on its own line,
 * except inside a one-line object ({"name": ..., "bytes": ...}). */
typedef struct json {
    sg_buf *out;
    int depth;
    int base;            /* indentation of depth 0 */
    bool first[16];      /* nothing written yet at this depth */
    bool one_line[16];
} json;

static void next_member(json *j)
{
    int d = j->depth;
    if (d > 0 && j->one_line[d]) {
        sg_buf_puts(j->out, j->first[d] ? "" : ", ");
    } else if (d > 0) {
        sg_buf_printf(j->out, "%s\n%*s", j->first[d] ? "" : ",", j->base + 2 * d, "");
    }
    j->first[d] = false;
}

static void key(json *j, const char *k)
{
    next_member(j);
    if (k) {
        sg_json_string(k, j->out);
        sg_buf_puts(j->out, ": ");
    }
}

static void open_(json *j, const char *k, char bracket, bool one_line)
{
    key(j, k);
    sg_buf_append(j->out, &bracket, 1);
    j->depth++;
    j->first[j->depth] = true;
    j->one_line[j->depth] = one_line || j->one_line[j->depth - 1];
}

static void close_(json *j, char bracket)
{
    bool empty = j->first[j->depth], inline_ = j->one_line[j->depth];
    j->depth--;
    if (!empty && !inline_)
        sg_buf_printf(j->out, "\n%*s", j->base + 2 * j->depth, "");
    sg_buf_append(j->out, &bracket, 1);
}

static void str(json *j, const char *k, const char *v)
{
    key(j, k);
    sg_json_string(v, j->out);
}

static void num(json *j, const char *k, long long v)
{
    key(j, k);
    sg_buf_printf(j->out, "%lld", v);
}

static void boolean(json *j, const char *k, bool v)
{
    key(j, k);
    sg_buf_puts(j->out, v ? "true" : "false");
}

/* One argument or result: where it must live, its shape and element type.
 * T is the call's token count; every other extent is the variant's. */
static void argument(json *j, const char *name, bool symmetric, const char *shape, const char *dtype,
                     const char *note)
{
    open_(j, NULL, '{', true);
    str(j, "name", name);
    boolean(j, "symmetric", symmetric);
    str(j, "shape", shape);
    str(j, "dtype", dtype);
    if (note)
        str(j, "note", note);
    close_(j, '}');
}

static void arguments(json *j, const sg_variant *v)
{
    const bool fp8 = v->dtype == SYMM_DTYPE_FP8_E4M3, rank = v->layout == SYMM_LAYOUT_RANK;
    const char *dt = sg_dtype_name(v->dtype), *cdt = sg_dtype_name(v->combine_dtype);
    const long long C = (long long)v->capacity;
    char th[64], tk[64], ts[64], ch[64], cs[64], ck[64], c1[64], l1[64];
    snprintf(th, sizeof th, "[T, %d]", v->hidden);
    snprintf(tk, sizeof tk, "[T, %d]", v->topk);
    snprintf(ts, sizeof ts, "[T, %d]", v->hidden / SYMM_FP8_BLOCK);
    snprintf(ch, sizeof ch, "[%lld, %d]", C, v->hidden);
    snprintf(cs, sizeof cs, "[%lld, %d]", C, v->hidden / SYMM_FP8_BLOCK);
    snprintf(ck, sizeof ck, "[%lld, %d]", C, v->topk);
    snprintf(c1, sizeof c1, "[%lld]", C);
    snprintf(l1, sizeof l1, "[%d]", v->experts / v->world);

    open_(j, "arguments", '{', false);
    open_(j, "dispatch", '[', false);
    argument(j, "x", false, th, dt, NULL);
    if (fp8)
        argument(j, "x_scales", false, ts, "fp32", NULL);
    argument(j, "topk_idx", false, tk, "int32", NULL);
    if (v->weights)
        argument(j, "topk_weights", false, tk, "fp32", NULL);
    close_(j, ']');
    open_(j, "results", '[', false);
    argument(j, "recv_x", true, ch, dt, NULL);
    if (fp8)
        argument(j, "recv_scales", true, cs, "fp32", NULL);
    char src[64];
    snprintf(src, sizeof src, "[%lld, 4]", C);
    argument(j, "recv_src", true, src, "int32", "per row {source rank, source token, k or -1, 0}");
    if (rank)
        argument(j, "recv_topk_idx", true, ck, "int32", "local expert ids, -1 where not on this rank");
    if (v->weights)
        argument(j, "recv_weights", true, rank ? ck : c1, "fp32", NULL);
    argument(j, "expert_count", false, l1, "int32", NULL);
    if (!rank)
        argument(j, "expert_offset", false, l1, "int32", NULL);
    argument(j, "recv_rows", false, "[1]", "int32", NULL);
    close_(j, ']');
    open_(j, "combine", '[', false);
    if (v->combine == SYMM_COMBINE_PULL)
        argument(j, "y", true, ch, cdt, "combine = pull: inside the variant's symmetric buffer (region y, or "
                 "recv_x when dtype == combine_dtype)");
    else if (v->combine == SYMM_COMBINE_AUTO)
        argument(j, "y", false, ch, cdt, "combine = auto: inside the variant's symmetric buffer (region y, or "
                 "recv_x when dtype == combine_dtype) combine pulls, elsewhere it pushes; every rank alike in a "
                 "call");
    else
        argument(j, "y", false, ch, cdt, "may be recv_x when dtype == combine_dtype");
    argument(j, "out", false, th, cdt, NULL);
    close_(j, ']');
    close_(j, '}');
}

static void variant_members(json *j, const sg_variant *v, const sg_generated *g)
{
    sg_layout l;
    sg_layout_compute(v, &l);
    str(j, "name", v->name);
    if (v->file)
        str(j, "file", v->file);
    num(j, "line", v->line);
    num(j, "hidden", v->hidden);
    num(j, "topk", v->topk);
    num(j, "experts", v->experts);
    num(j, "world", v->world);
    num(j, "local_experts", v->experts / v->world);
    num(j, "max_tokens", v->max_tokens);
    str(j, "dtype", sg_dtype_name(v->dtype));
    str(j, "combine_dtype", sg_dtype_name(v->combine_dtype));
    str(j, "layout", sg_layout_name(v->layout));
    boolean(j, "weights", v->weights);
    str(j, "combine", sg_combine_name(v->combine));
    str(j, "combine_order", v->combine_order == SYMM_COMBINE_ORDER_K ? "k" : "rank");
    num(j, "capacity", (long long)v->capacity);
    num(j, "worst_capacity", (long long)l.worst_capacity);
    num(j, "align", v->align);
    num(j, "sms", v->sms);
    /* Across hosts: a variant's companions, or a companion's parent. */
    if (v->n_companions > 0) {
        open_(j, "companions", '[', false);
        for (int i = 0; i < v->n_companions; i++) {
            open_(j, NULL, '{', true);
            num(j, "hosts", v->companions[i].companion_hosts);
            str(j, "name", v->companions[i].name);
            close_(j, '}');
        }
        close_(j, ']');
    }
    if (v->companion_hosts > 0) {
        str(j, "companion_of", v->companion_of);
        num(j, "hosts", v->companion_hosts);
    }
    num(j, "symmetric_bytes", (long long)l.symmetric_bytes);
    num(j, "scratch_bytes", (long long)l.scratch_bytes);
    open_(j, "regions", '[', false);
    for (int i = 0; i < SYMM_REGION_COUNT; i++) {
        const sg_region *r = &l.regions[i];
        if (!r->bytes)
            continue;
        open_(j, NULL, '{', true);
        str(j, "name", r->name);
        num(j, "offset", (long long)r->offset);
        num(j, "bytes", (long long)r->bytes);
        boolean(j, "symmetric", r->symmetric);
        close_(j, '}');
    }
    close_(j, ']');
    if (g) {
        char name[SG_NAME_MAX + 8];
        open_(j, "files", '{', true);
        snprintf(name, sizeof name, "%s.cu", v->name);
        str(j, "cu", name);
        snprintf(name, sizeof name, "%s.h", v->name);
        str(j, "h", name);
        snprintf(name, sizeof name, "%s.c", v->name);
        str(j, "c", name);
        close_(j, '}');
        str(j, "source_sha256", g->source_sha256);
        str(j, "content_sha256", g->content_sha256);
    }
    arguments(j, v);
}

void sg_manifest_variant(const sg_variant *v, const sg_generated *g, int indent, sg_buf *out)
{
    json j = {.out = out, .base = indent};
    sg_buf_puts(out, "{");
    j.first[0] = false;
    j.depth = 1;
    j.first[1] = true;
    variant_members(&j, v, g);
    close_(&j, '}');
}

void sg_manifest(const char *spec_path, const sg_generated *gens, size_t n, sg_buf *out)
{
    json j = {.out = out};
    sg_buf_puts(out, "{");
    j.depth = 1;
    j.first[1] = true;
    num(&j, "format", SG_MANIFEST_FORMAT);
    str(&j, "symmgen", SYMM_VERSION);
    str(&j, "spec", spec_path);
    open_(&j, "variants", '[', false);
    for (size_t i = 0; i < n; i++) {
        next_member(&j);
        sg_manifest_variant(gens[i].variant, &gens[i], 2 * j.depth, out);
    }
    close_(&j, ']');
    close_(&j, '}');
    sg_buf_puts(out, "\n");
}

/* --list: one row per variant, columns padded to the widest cell. */
#define LIST_COLUMNS 10

void sg_list_text(const sg_spec *spec, sg_buf *out)
{
    int width[LIST_COLUMNS] = {0};
    char cell[LIST_COLUMNS][96];
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < spec->count; i++) {
            const sg_variant *v = &spec->variants[i];
            sg_layout l;
            sg_layout_compute(v, &l);
            snprintf(cell[0], sizeof cell[0], "%s", v->name);
            snprintf(cell[1], sizeof cell[1], "%s", sg_layout_name(v->layout));
            snprintf(cell[2], sizeof cell[2], "%s->%s", sg_dtype_name(v->dtype),
                     sg_dtype_name(v->combine_dtype));
            snprintf(cell[3], sizeof cell[3], "hidden=%d", v->hidden);
            snprintf(cell[4], sizeof cell[4], "topk=%d", v->topk);
            snprintf(cell[5], sizeof cell[5], "experts=%d", v->experts);
            snprintf(cell[6], sizeof cell[6], "world=%d", v->world);
            snprintf(cell[7], sizeof cell[7], "max_tokens=%d", v->max_tokens);
            snprintf(cell[8], sizeof cell[8], "capacity=%lld", (long long)v->capacity);
            snprintf(cell[9], sizeof cell[9], "%.1f", (double)l.symmetric_bytes / (1 << 20));
            for (int c = 0; c < LIST_COLUMNS; c++) {
                int w = (int)strlen(cell[c]);
                if (pass == 0) {
                    width[c] = w > width[c] ? w : width[c];
                    continue;
                }
                /* Two spaces between groups, one inside the key=value group;
                 * the MiB figure is right-aligned. */
                const char *gap = c == 0 ? "" : (c <= 3 || c == 9) ? "  " : " ";
                if (c == 9)
                    sg_buf_printf(out, "%ssym=%*s MiB\n", gap, width[c], cell[c]);
                else
                    sg_buf_printf(out, "%s%-*s", gap, width[c], cell[c]);
            }
        }
    }
}
