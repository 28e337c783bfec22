/* ref_config.c: the CPU reference's configuration (limits, capacity) and
 * its receive buffers (symm_ref.h). The limits are the generator's, so that
 * every variant symmgen accepts can be checked against the reference. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "symm_ref.h"

/* The generator's bounds (generator/spec.c). */
#define REF_MAX_HIDDEN 1048576
#define REF_MAX_EXPERTS 8192
#define REF_MAX_TOKENS 1048576
#define REF_MAX_BUFFER_BYTES ((int64_t)1 << 40)

static const char *dtype_name(symm_dtype d)
{
    switch (d) {
    case SYMM_DTYPE_BF16: return "bf16";
    case SYMM_DTYPE_FP16: return "fp16";
    case SYMM_DTYPE_FP32: return "fp32";
    case SYMM_DTYPE_FP8_E4M3: return "fp8_e4m3";
    }
    return "unknown";
}

/* ---- config ------------------------------------------------------------ */

int64_t symm_ref_worst_capacity(const symm_ref_config *cfg)
{
    if (!cfg || cfg->world < 1 || cfg->max_tokens < 1 || cfg->topk < 1 ||
        cfg->topk > SYMM_REF_MAX_TOPK || cfg->experts < cfg->world || cfg->experts % cfg->world)
        return -1;
    int64_t rows = (int64_t)cfg->world * cfg->max_tokens;
    if (cfg->layout == SYMM_LAYOUT_RANK)
        return rows;
    if (cfg->layout != SYMM_LAYOUT_EXPERT || cfg->align < 1 || cfg->align > SYMM_REF_MAX_ALIGN)
        return -1;
    int64_t local = cfg->experts / cfg->world;
    int64_t per_token = cfg->topk < local ? cfg->topk : local;
    return rows * per_token + local * (cfg->align - 1);
}

int64_t symm_ref_capacity(const symm_ref_config *cfg)
{
    if (cfg && cfg->capacity > 0)
        return cfg->capacity;
    return symm_ref_worst_capacity(cfg);
}

#define CONFIG_FAIL(fmt, ...) \
    symm_fail(SYMM_ERR_INVALID_ARG, "symm_ref_check_config: " fmt, __VA_ARGS__)

static symm_status check_dtypes(const symm_ref_config *c)
{
    int size = symm_dtype_size(c->dtype);
    if (size == 0)
        return CONFIG_FAIL("dtype %d: expected bf16, fp16, fp32 or fp8_e4m3", (int)c->dtype);
    if (c->combine_dtype != SYMM_DTYPE_BF16 && c->combine_dtype != SYMM_DTYPE_FP16 &&
        c->combine_dtype != SYMM_DTYPE_FP32)
        return CONFIG_FAIL("combine_dtype %s (%d): expected bf16, fp16 or fp32",
                           dtype_name(c->combine_dtype), (int)c->combine_dtype);
    if (c->hidden <= 0 || c->hidden > REF_MAX_HIDDEN)
        return CONFIG_FAIL("hidden %d: expected 1..%d", c->hidden, REF_MAX_HIDDEN);
    if ((int64_t)c->hidden * size % 16)
        return CONFIG_FAIL("hidden %d: hidden * %d bytes (dtype %s) must be a multiple of 16",
                           c->hidden, size, dtype_name(c->dtype));
    int csize = symm_dtype_size(c->combine_dtype);
    if ((int64_t)c->hidden * csize % 16)
        return CONFIG_FAIL("hidden %d: hidden * %d bytes (combine_dtype %s) must be a multiple of 16",
                           c->hidden, csize, dtype_name(c->combine_dtype));
    if (c->dtype == SYMM_DTYPE_FP8_E4M3 && c->hidden % SYMM_FP8_BLOCK)
        return CONFIG_FAIL("hidden %d: expected a multiple of %d for dtype fp8_e4m3 (one scale per %d)",
                           c->hidden, SYMM_FP8_BLOCK, SYMM_FP8_BLOCK);
    return SYMM_OK;
}

static symm_status check_shape(const symm_ref_config *c)
{
    if (c->layout != SYMM_LAYOUT_RANK && c->layout != SYMM_LAYOUT_EXPERT)
        return CONFIG_FAIL("layout %d: expected rank (%d) or expert (%d)", (int)c->layout,
                           SYMM_LAYOUT_RANK, SYMM_LAYOUT_EXPERT);
    if (c->world < 1 || c->world > SYMM_REF_MAX_WORLD)
        return CONFIG_FAIL("world %d: expected 1..%d", c->world, SYMM_REF_MAX_WORLD);
    if (c->experts <= 0 || c->experts > REF_MAX_EXPERTS || c->experts % c->world)
        return CONFIG_FAIL("experts %d: expected a multiple of world %d in 1..%d", c->experts,
                           c->world, REF_MAX_EXPERTS);
    int max_topk = c->experts < SYMM_REF_MAX_TOPK ? c->experts : SYMM_REF_MAX_TOPK;
    if (c->topk < 1 || c->topk > max_topk)
        return CONFIG_FAIL("topk %d: expected 1..%d (at most 16 and at most experts %d)", c->topk,
                           max_topk, c->experts);
    if (c->max_tokens <= 0 || c->max_tokens > REF_MAX_TOKENS)
        return CONFIG_FAIL("max_tokens %d: expected 1..%d", c->max_tokens, REF_MAX_TOKENS);
    if (c->weights != 0 && c->weights != 1)
        return CONFIG_FAIL("weights %d: expected 0 or 1", c->weights);
    if (c->layout == SYMM_LAYOUT_RANK && c->align != 1)
        return CONFIG_FAIL("align %d: expected 1 for layout rank", c->align);
    if (c->align < 1 || c->align > SYMM_REF_MAX_ALIGN)
        return CONFIG_FAIL("align %d: expected 1..%d", c->align, SYMM_REF_MAX_ALIGN);
    if (c->combine_order != SYMM_COMBINE_ORDER_RANK && c->combine_order != SYMM_COMBINE_ORDER_K)
        return CONFIG_FAIL("combine_order %d: expected rank (%d) or k (%d)", (int)c->combine_order,
                           SYMM_COMBINE_ORDER_RANK, SYMM_COMBINE_ORDER_K);
    if (c->layout == SYMM_LAYOUT_RANK && c->combine_order != SYMM_COMBINE_ORDER_RANK)
        return CONFIG_FAIL("combine_order k: expected rank (%d) for layout rank", SYMM_COMBINE_ORDER_RANK);
    if (c->hosts < 0 || c->hosts > c->world || (c->hosts >= 2 && c->world % c->hosts != 0))
        return CONFIG_FAIL("hosts %d: expected 0 or 1 (one host), or a host count 2..%d that divides world %d",
                           c->hosts, c->world, c->world);
    if (c->hosts >= 2 && c->combine_order != SYMM_COMBINE_ORDER_RANK)
        return CONFIG_FAIL("combine_order k with hosts %d: expected rank (%d): across hosts combine sums per "
                           "host (use the nccl backend's one-host order for k)", c->hosts, SYMM_COMBINE_ORDER_RANK);
    return SYMM_OK;
}

/* As the generator: the worst case must fit int32 rows (counts and offsets
 * are int32 on the GPU) and 1 TiB of buffer, whatever the capacity. */
static symm_status check_sizes(const symm_ref_config *c)
{
    int64_t worst = symm_ref_worst_capacity(c);
    int size = symm_dtype_size(c->dtype), csize = symm_dtype_size(c->combine_dtype);
    int64_t row = (int64_t)c->hidden * (size > csize ? size : csize);
    if (worst > INT32_MAX)
        return CONFIG_FAIL("max_tokens %d: the worst-case capacity, %lld rows, must fit in int32",
                           c->max_tokens, (long long)worst);
    if (worst * row > REF_MAX_BUFFER_BYTES)
        return CONFIG_FAIL("max_tokens %d: the worst-case buffers, %lld rows of %lld bytes, must "
                           "fit in 1 TiB", c->max_tokens, (long long)worst, (long long)row);
    return SYMM_OK;
}

symm_status symm_ref_check_config(const symm_ref_config *cfg)
{
    if (!cfg)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_ref_check_config: cfg is NULL");
    SYMM_TRY(check_dtypes(cfg));
    SYMM_TRY(check_shape(cfg));
    SYMM_TRY(check_sizes(cfg));
    int64_t worst = symm_ref_worst_capacity(cfg);
    if (cfg->capacity < 0 || cfg->capacity > worst)
        return CONFIG_FAIL("capacity %lld: expected 0 (worst case) or 1..%lld",
                           (long long)cfg->capacity, (long long)worst);
    return SYMM_OK;
}

/* ---- receive buffers --------------------------------------------------- */

/* a * b * c bytes, or 0 when it does not fit a size_t (never 0 otherwise:
 * every factor is positive). */
static size_t bytes3(int64_t a, int64_t b, int64_t c)
{
    if (a <= 0 || b <= 0 || c <= 0)
        return 0;
    if ((uint64_t)a > SIZE_MAX / (uint64_t)b || (uint64_t)(a * b) > SIZE_MAX / (uint64_t)c)
        return 0;
    return (size_t)a * (size_t)b * (size_t)c;
}

/* The arrays of a receive buffer for c: where each one's pointer lives and
 * its shape, rows x cols of elem bytes (rows = capacity, or the local
 * experts for per_expert ones). Arrays the config does not use are left out.
 * Returns how many. */
typedef struct recv_array {
    const char *name;
    void **ptr;
    int64_t rows, cols, elem;
    bool per_expert;
} recv_array;

static int recv_arrays(const symm_ref_config *c, symm_ref_recv *r, recv_array out[7])
{
    const int64_t cap = r->capacity, local = c->experts / c->world;
    const bool rank = c->layout == SYMM_LAYOUT_RANK;
    int n = 0;
    out[n++] = (recv_array){"x", &r->x, cap, c->hidden, symm_dtype_size(c->dtype), false};
    if (c->dtype == SYMM_DTYPE_FP8_E4M3)
        out[n++] = (recv_array){"scales", (void **)&r->scales, cap, c->hidden / SYMM_FP8_BLOCK, sizeof(float), false};
    out[n++] = (recv_array){"src", (void **)&r->src, cap, 4, sizeof(int32_t), false};
    if (rank)
        out[n++] = (recv_array){"topk_idx", (void **)&r->topk_idx, cap, c->topk, sizeof(int32_t), false};
    if (c->weights)
        out[n++] = (recv_array){"weights", (void **)&r->weights, cap, rank ? c->topk : 1, sizeof(float), false};
    out[n++] = (recv_array){"expert_count", (void **)&r->expert_count, local, 1, sizeof(int32_t), true};
    out[n++] = (recv_array){"expert_offset", (void **)&r->expert_offset, local, 1, sizeof(int32_t), true};
    return n;
}

/* poison: every byte SYMM_REF_POISON (written now); else zeroed by calloc,
 * whose large blocks are fresh pages the system zeroes as they are first
 * touched, so that a worst-case capacity costs only the rows written. */
static symm_status recv_alloc_arrays(const symm_ref_config *c, symm_ref_recv *r, bool poison, const char *fn)
{
    recv_array a[7];
    const int n = recv_arrays(c, r, a);
    for (int i = 0; i < n; i++) {
        const size_t bytes = bytes3(a[i].rows, a[i].cols, a[i].elem);
        *a[i].ptr = !bytes ? NULL : poison ? malloc(bytes) : calloc(1, bytes);
        if (!*a[i].ptr)
            return symm_fail(SYMM_ERR_NOMEM, "%s: %s: cannot allocate %lld x %lld x %lld bytes", fn, a[i].name,
                             (long long)a[i].rows, (long long)a[i].cols, (long long)a[i].elem);
        if (poison)
            memset(*a[i].ptr, SYMM_REF_POISON, bytes);
    }
    return SYMM_OK;
}

static symm_status recv_alloc(const symm_ref_config *cfg, symm_ref_recv *r, bool poison, const char *fn)
{
    if (!r)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: r is NULL", fn);
    memset(r, 0, sizeof *r);
    symm_status st = symm_ref_check_config(cfg);
    if (st != SYMM_OK)
        return symm_fail_context(st, "%s: ", fn);
    r->capacity = symm_ref_capacity(cfg);
    st = recv_alloc_arrays(cfg, r, poison, fn);
    if (st != SYMM_OK)
        symm_ref_recv_free(r);
    return st;
}

symm_status symm_ref_recv_alloc(const symm_ref_config *cfg, symm_ref_recv *r)
{
    return recv_alloc(cfg, r, true, "symm_ref_recv_alloc");
}

symm_status symm_ref_recv_alloc_lazy(const symm_ref_config *cfg, symm_ref_recv *r)
{
    return recv_alloc(cfg, r, false, "symm_ref_recv_alloc_lazy");
}

symm_status symm_ref_recv_repoison(const symm_ref_config *cfg, symm_ref_recv *r)
{
    if (!r)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_ref_recv_repoison: r is NULL");
    symm_status st = symm_ref_check_config(cfg);
    if (st != SYMM_OK)
        return symm_fail_context(st, "symm_ref_recv_repoison: ");
    if (r->capacity != symm_ref_capacity(cfg) || r->rows < 0 || r->rows > r->capacity)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_ref_recv_repoison: capacity %lld, rows %lld: expected capacity %lld and rows "
                         "0..capacity", (long long)r->capacity, (long long)r->rows,
                         (long long)symm_ref_capacity(cfg));
    recv_array a[7];
    const int n = recv_arrays(cfg, r, a);
    for (int i = 0; i < n; i++)
        if (!*a[i].ptr)
            return symm_fail(SYMM_ERR_INVALID_ARG, "symm_ref_recv_repoison: %s is NULL", a[i].name);
    for (int i = 0; i < n; i++)
        memset(*a[i].ptr, SYMM_REF_POISON, bytes3(a[i].per_expert ? a[i].rows : r->rows, a[i].cols, a[i].elem));
    r->rows = 0;
    r->dropped = 0;
    return SYMM_OK;
}

symm_status symm_ref_recv_free(symm_ref_recv *r)
{
    if (!r)
        return SYMM_OK;
    free(r->x);
    free(r->scales);
    free(r->src);
    free(r->topk_idx);
    free(r->weights);
    free(r->expert_count);
    free(r->expert_offset);
    memset(r, 0, sizeof *r);
    return SYMM_OK;
}
